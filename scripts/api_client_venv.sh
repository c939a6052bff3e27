#!/usr/bin/env bash
# The judge of our API server's surface (issue 19): `hermes-agent-api-client`, a typed client
# written by others for the real Hermes Agent's API server, in its own venv (it needs Python >= 3.13,
# the project runs on 3.11; scripts/side_venv.sh). tests/api_server/test_api_client.py drives
# `hermes-foundry serve` with it.
#
# Usage: scripts/api_client_venv.sh        prints the venv's python on stdout
# Env:   HERMES_API_CLIENT_PYTHON  the Python to build the venv with (default: python3.13 on PATH, then pyenv's)
#        HERMES_API_CLIENT_VENV    where the venv goes (default: .api-client-venv; log and lock beside it)
# Exit:  0 with the venv ready; 1 with one `api_client_venv: ...` line on stderr saying why not.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
exec "$root/scripts/side_venv.sh" api_client_venv "hermes-agent-api-client==0.3.3" \
  "${HERMES_API_CLIENT_VENV:-$root/.api-client-venv}" 13 14 HERMES_API_CLIENT_PYTHON
