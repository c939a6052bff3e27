#!/usr/bin/env bash
# make test: everything the suite needs, then the suite. On a fresh machine (as root) this installs
# the system packages, builds the sandbox test rootfs, starts a private Docker engine with the test
# image, and runs pytest with that engine; the engine is stopped again whatever happens. Each step is
# cached, so a second run goes straight to the tests. Without root it installs nothing: it names
# the packages to install, and the tests that need them skip saying so.
#
# Usage: VENV=.venv scripts/test.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VENV:-.venv}
export DEBIAN_FRONTEND=noninteractive
# The sandbox backends' tests (bubblewrap, debootstrap, a Docker engine), the browser tools' tests
# (chromium), the PostgreSQL instance tests and the pytest verifier of RL environments (python3-pytest,
# run inside sandboxes that share the host's system folders).
PACKAGES=(bubblewrap debootstrap docker.io chromium postgresql python3-pytest)
log() { echo "make test: $*" >&2; }

missing_packages() {
  local pkg
  for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || echo "$pkg"
  done
}

install_packages() {
  command -v dpkg-query >/dev/null || { log "not a Debian system: install ${PACKAGES[*]} yourself"; return 0; }
  local missing
  missing=$(missing_packages | tr '\n' ' ')
  [ -n "${missing// /}" ] || return 0
  if [ "$(id -u)" != 0 ]; then
    log "missing system packages (the tests that need them will skip): sudo apt-get install $missing"
    return 0
  fi
  log "installing system packages: $missing"
  # Packages must not start services while installing (docker.io would start a system dockerd with
  # default networking); policy-rc.d is Debian's switch for that.
  local policy= rc=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
  fi
  # shellcheck disable=SC2086
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing >/dev/null; } || rc=$?
  [ -z "$policy" ] || rm -f "$policy"
  [ "$rc" = 0 ] || { log "apt-get failed (exit $rc)"; exit "$rc"; }
}

engine_started=
stop_engine() { [ -z "$engine_started" ] || scripts/dockerd.sh stop || true; }
trap stop_engine EXIT

install_packages
if [ "$(id -u)" = 0 ] && command -v debootstrap >/dev/null; then
  scripts/test_images.sh rootfs            # Debian bookworm rootfs with python3, cached on the machine
fi
# A private engine (no bridge, no iptables: see the script), unless the caller already set one.
if [ -z "${DOCKER_HOST:-}" ] && [ "$(id -u)" = 0 ] && command -v dockerd >/dev/null; then
  if ! scripts/dockerd.sh status >/dev/null 2>&1; then engine_started=1; fi
  docker_host=$(scripts/dockerd.sh start)
  export "${docker_host?}"                 # DOCKER_HOST=unix:///run/hermes-foundry-docker.sock
fi
if [ -n "${DOCKER_HOST:-}" ]; then
  scripts/test_images.sh docker            # hermes-test/bookworm:latest, imported from that rootfs
fi
# The conformance oracle (real hermes-agent in .oracle-venv, cached); tests/conformance skips
# saying why when it cannot be built.
scripts/hermes_oracle.sh || log "no Hermes Agent oracle (the conformance tests will skip); see the line above"
# The typed API client's Python 3.13 venv (.api-client-venv, cached) for tests/api_server/test_api_client.py.
scripts/api_client_venv.sh >/dev/null || log "no hermes-agent-api-client venv; see the line above"

# Space for pytest's temporary folders and the docker launcher test's code image, said up front.
scripts/disk_check.sh "${TMPDIR:-/tmp}" "${HERMES_DOCKERD_DATA_ROOT:-/var/lib/hermes-foundry-docker}"

# One pytest worker per core, up to 2 (PYTEST_WORKERS=N overrides; 0 runs in one process): most tests
# wait on servers and sandboxes. Tests sharing one `dagster dev` stay together (--dist loadgroup).
# The 25 slowest tests are listed at the end: the suite's time on CI is watched (docs/development.md).
workers=${PYTEST_WORKERS:-$(( $(nproc) < 2 ? $(nproc) : 2 ))}
status=0
"$venv/bin/pytest" -n "$workers" --dist loadgroup --durations=25 "$@" || status=$?
exit "$status"
