#!/usr/bin/env bash
# The chat-frontend test's venv (issue 19 item 8): Open WebUI from PyPI in its own virtual
# environment (~7 GB with its ML dependencies, a few minutes to build; never part of the product's
# venv, `make test` or CI; scripts/side_venv.sh). Prints the venv's `open-webui` executable.
#
# Usage: scripts/frontend_venv.sh
# Env:   HERMES_FRONTEND_PYTHON  the Python to build the venv with (default: the first 3.11-3.12 found;
#                                open-webui 0.12.4 declares Requires-Python >=3.11,<3.13)
#        HERMES_FRONTEND_VENV    where the venv goes (default: .frontend-venv; its log and lock sit beside it)
# Exit:  0 with the path printed; 1 with one `frontend_venv: ...` line on stderr saying why not.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=$("$root/scripts/side_venv.sh" frontend_venv "open-webui==0.12.4" \
  "${HERMES_FRONTEND_VENV:-$root/.frontend-venv}" 11 12 HERMES_FRONTEND_PYTHON)
echo "$(dirname "$python")/open-webui"
