#!/usr/bin/env bash
# A side virtual environment for a program whose pins clash with ours (the Hermes Agent oracle, the
# API client judge, Open WebUI): never the product's venv. Built once and reused while the pinned
# requirement is unchanged; the requirement is written into it last, so a half-built venv is rebuilt.
# One build at a time (make test and a test fixture may both ask for it).
#
# Usage: scripts/side_venv.sh NAME REQUIREMENT VENV MIN MAX PYTHON_VAR
#          NAME        prefixes the messages (e.g. hermes_oracle)
#          MIN MAX     the Python versions the requirement accepts: 3.MIN to 3.MAX
#          PYTHON_VAR  the environment variable that may name the Python to build with (default:
#                      python3.MIN..3.MAX on PATH, then pyenv's, then python3)
# Prints:  the venv's python on stdout.
# Exit:    0 with the venv ready; 1 with one `NAME: ...` line on stderr saying why not.
set -euo pipefail
name=$1 requirement=$2 venv=$3 min=$4 max=$5 python_var=$6
wanted=${!python_var:-}

die() { echo "$name: $*" >&2; exit 1; }

python_ok() { "$1" -c "import sys, venv; sys.exit(not (3, $min) <= sys.version_info[:2] <= (3, $max))" 2>/dev/null; }

find_python() {
  local minor candidate
  if [ -n "$wanted" ]; then
    python_ok "$wanted" && echo "$wanted"
    return
  fi
  for minor in $(seq "$min" "$max"); do
    for candidate in "python3.$minor" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3."$minor".*/bin/python; do
      candidate=$(command -v "$candidate" 2>/dev/null) || continue
      if python_ok "$candidate"; then echo "$candidate"; return 0; fi
    done
  done
  candidate=$(command -v python3 2>/dev/null) && python_ok "$candidate" && echo "$candidate"
}

venv_current() { [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.requirement" 2>/dev/null)" = "$requirement" ]; }

build_venv() {
  local python log=$venv.log
  python=$(find_python) || die "no Python 3.$min-3.$max with the venv module${wanted:+ at $python_var=$wanted} ($requirement needs one; install one or set $python_var)"
  echo "$name: building $venv with $requirement ($python; log: $log)" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv" >"$log" 2>&1 || die "'$python -m venv' failed (see $log)"
  if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$requirement" >>"$log" 2>&1; then
    die "pip install $requirement failed, is PyPI reachable? ($(grep -m1 -E 'ERROR|error:' "$log" || tail -n1 "$log"))"
  fi
  echo "$requirement" >"$venv/.requirement"  # last: marks the venv complete
}

command -v flock >/dev/null || die "flock (util-linux) is needed"
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
venv_current || build_venv
echo "$venv/bin/python"
