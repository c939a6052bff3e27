#!/usr/bin/env bash
# The conformance oracle (issue 19): the real Hermes Agent, installed from PyPI into its own virtual
# environment (its pins clash with ours, and the product never imports it), asked for its tool
# definitions, toolsets, distributions and ShareGPT conversion of our fixture message lists.
#
# The venv is built once by scripts/side_venv.sh and reused while the pinned requirement is unchanged
# (a half-built venv is rebuilt). The dumper runs without network
# (`unshare -n`, `unshare -rn` when not root) and with HERMES_HOME in a temporary folder, because
# the original reads and writes its home and may try to reach the internet.
#
# Usage: scripts/hermes_oracle.sh [OUTPUT_JSON]   (default: .oracle-venv/oracle.json)
# Env:   HERMES_ORACLE_PYTHON  the Python to build the venv with (default: the first 3.11-3.13 found)
#        HERMES_ORACLE_VENV    where the venv goes (default: .oracle-venv; its log and lock sit beside it)
# Exit:  0 with the JSON written; 1 with one `hermes_oracle: ...` line on stderr saying why not.
set -euo pipefail

REQUIREMENT="hermes-agent==0.19.0"
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${HERMES_ORACLE_VENV:-$root/.oracle-venv}
out=${1:-$venv/oracle.json}
case "$out" in /*) ;; *) out=$PWD/$out ;; esac
fixtures=$root/tests/conformance/fixtures/messages.json

die() { echo "hermes_oracle: $*" >&2; exit 1; }

# Without network. Root can unshare the network namespace directly; others need a user namespace.
offline() {
  if [ "$(id -u)" = 0 ]; then unshare -n "$@"; else unshare -rn "$@"; fi
}

command -v unshare >/dev/null || die "cannot run the oracle offline: unshare (util-linux) is needed"
offline true 2>/dev/null || die "cannot run the oracle offline: 'unshare -n' (or 'unshare -rn') is not permitted here"
# hermes-agent 0.19.0 declares Requires-Python >=3.11,<3.14.
"$root/scripts/side_venv.sh" hermes_oracle "$REQUIREMENT" "$venv" 11 13 HERMES_ORACLE_PYTHON >/dev/null || exit 1

home=$(mktemp -d "${TMPDIR:-/tmp}/hermes-oracle-home.XXXXXX")
trap 'rm -rf "$home"' EXIT
mkdir -p "$(dirname "$out")"
# A clean environment: keys, HERMES_* or KANBAN settings of the caller would change what it offers.
if ! offline env -i PATH="$PATH" LANG=C.UTF-8 HOME="$home" HERMES_HOME="$home" TMPDIR="$home" \
    PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" "$root/scripts/hermes_oracle_dump.py" "$out" "$fixtures" \
    2>"$venv/dump.log"; then
  die "the oracle dumper failed: $(tail -n1 "$venv/dump.log") (see $venv/dump.log)"
fi
echo "hermes_oracle: wrote $out" >&2
