#!/usr/bin/env bash
# The conformance oracle (issue 19): the real Hermes Agent, installed from PyPI into its own virtual
# environment (its pins clash with ours, and the product never imports it), asked for its tool
# definitions, toolsets, distributions and ShareGPT conversion of our fixture message lists.
#
# The venv is built once and reused while the pinned requirement is unchanged (the requirement is
# written into it last, so a half-built venv is rebuilt). The dumper runs without network
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

# hermes-agent 0.19.0 declares Requires-Python >=3.11,<3.14.
python_ok() { "$1" -c 'import sys, venv; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 14))' 2>/dev/null; }

find_python() {
  local candidate
  if [ -n "${HERMES_ORACLE_PYTHON:-}" ]; then
    python_ok "$HERMES_ORACLE_PYTHON" && echo "$HERMES_ORACLE_PYTHON"
    return
  fi
  for candidate in python3.11 python3.12 python3.13 python3 \
      "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[123].*/bin/python; do
    candidate=$(command -v "$candidate" 2>/dev/null) || continue
    if python_ok "$candidate"; then echo "$candidate"; return 0; fi
  done
  return 1
}

venv_current() { [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.requirement" 2>/dev/null)" = "$REQUIREMENT" ]; }

build_venv() {
  local python log=$venv.log
  python=$(find_python) || die "cannot build the oracle venv: no Python 3.11-3.13 with the venv module${HERMES_ORACLE_PYTHON:+ at HERMES_ORACLE_PYTHON=$HERMES_ORACLE_PYTHON} (hermes-agent 0.19.0 needs one; set HERMES_ORACLE_PYTHON)"
  echo "hermes_oracle: building $venv with $REQUIREMENT ($python; log: $log)" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv" >"$log" 2>&1 || die "cannot build the oracle venv: '$python -m venv' failed (see $log)"
  if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$REQUIREMENT" >>"$log" 2>&1; then
    die "cannot build the oracle venv: pip install $REQUIREMENT failed, is PyPI reachable? ($(grep -m1 -E 'ERROR|error:' "$log" || tail -n1 "$log"))"
  fi
  echo "$REQUIREMENT" >"$venv/.requirement"  # last: marks the venv complete
}

# Without network. Root can unshare the network namespace directly; others need a user namespace.
offline() {
  if [ "$(id -u)" = 0 ]; then unshare -n "$@"; else unshare -rn "$@"; fi
}

command -v unshare >/dev/null && command -v flock >/dev/null \
  || die "cannot run the oracle offline: unshare and flock (util-linux) are needed"
offline true 2>/dev/null || die "cannot run the oracle offline: 'unshare -n' (or 'unshare -rn') is not permitted here"
# One build at a time (make test and the test fixture may both ask for it).
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
venv_current || build_venv
flock -u 9

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
