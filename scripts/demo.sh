#!/usr/bin/env bash
# make demo: start the SIMULATED model endpoint on a free 127.0.0.1 port, run the example dataset
# through the Dagster asset graph with hermes-batch, print the summary, stop the endpoint.
set -euo pipefail
venv=${VENV:-.venv}
run_name=${RUN_NAME:-demo}
# Tools run in bubblewrap sandboxes (the default `local` backend): install it when we can.
if ! command -v bwrap >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing bubblewrap (the sandbox of the default 'local' backend)"
    apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null 2>&1 \
      || { apt-get update -qq && apt-get install -y -qq --no-install-recommends bubblewrap; }
  else
    echo "bubblewrap is missing: install it (Debian/Ubuntu: sudo apt-get install bubblewrap)" >&2
    exit 1
  fi
fi
port_file=$(mktemp)
"$venv/bin/hermes-foundry" sim-model --port 0 --latency "${SIM_LATENCY:-0.05}" --port-file "$port_file" &
sim_pid=$!
trap 'kill "$sim_pid" 2>/dev/null || true; rm -f "$port_file"' EXIT
for _ in $(seq 100); do [ -s "$port_file" ] && break; sleep 0.1; done
[ -s "$port_file" ] || { echo "the simulated model endpoint did not start" >&2; exit 1; }
port=$(cat "$port_file")
echo "simulated model endpoint (hermes-sim, NOT a real model) on http://127.0.0.1:$port/v1"
DAGSTER_HOME=${DAGSTER_HOME:-$PWD/dagster_home} "$venv/bin/hermes-batch" \
  --dataset_file=examples/prompts.jsonl --run_name="$run_name" --batch_size=5 --num_workers=4 \
  --distribution=terminal_only --base_url="http://127.0.0.1:$port/v1" --api_key=sim --model=hermes-sim "$@"
