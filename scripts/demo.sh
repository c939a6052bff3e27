#!/usr/bin/env bash
# make demo: start the SIMULATED model endpoint on a free 127.0.0.1 port, run the example dataset
# through the Dagster asset graph with hermes-batch, print the summary, stop the endpoint.
set -euo pipefail
venv=${VENV:-.venv}
run_name=${RUN_NAME:-demo}
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
