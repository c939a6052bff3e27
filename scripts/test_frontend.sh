#!/usr/bin/env bash
# make test-frontend: the opt-in chat-frontend test (issue 19 item 8; not part of make test or CI).
# Builds Open WebUI's side venv once (scripts/frontend_venv.sh, ~7 GB), installs Debian's Chromium
# and an emoji font (the tool progress line starts with one; as root only, like make test), then
# runs tests_frontend/ with the project's venv. Open WebUI runs offline on a free 127.0.0.1 port.
#
# Usage: VENV=.venv scripts/test_frontend.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VENV:-.venv}
PACKAGES=(chromium fonts-noto-color-emoji)
log() { echo "make test-frontend: $*" >&2; }

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing system packages: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null \
      || { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
  else
    log "missing system packages: sudo apt-get install ${missing[*]}"
  fi
fi
scripts/frontend_venv.sh >/dev/null  # built once, then reused; its log is .frontend-venv.log
exec "$venv/bin/pytest" tests_frontend -x -q "$@"
