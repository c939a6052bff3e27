#!/usr/bin/env bash
# make demo-local: serve the bundled SmolLM2-135M (a REAL, tiny model) with llama.cpp on a free
# 127.0.0.1 port, run the example dataset through it with hermes-batch, print the summary.
# The model has no tool-calling template: calls go through JSON-schema constrained replies.
set -euo pipefail
venv=${VENV:-.venv}
run_name=${RUN_NAME:-demo_local}
port_file=$(mktemp)
"$venv/bin/hermes-foundry" local-model --port 0 --port-file "$port_file" --parallel 2 &
model_pid=$!
trap 'kill "$model_pid" 2>/dev/null || true; rm -f "$port_file"' EXIT
for _ in $(seq 600); do [ -s "$port_file" ] && break; kill -0 "$model_pid" 2>/dev/null || exit 1; sleep 0.2; done
[ -s "$port_file" ] || { echo "the local model did not start" >&2; exit 1; }
port=$(cat "$port_file")
DAGSTER_HOME=${DAGSTER_HOME:-$PWD/dagster_home} "$venv/bin/hermes-batch" \
  --dataset_file=examples/prompts.jsonl --run_name="$run_name" --batch_size=5 --num_workers=2 \
  --distribution=terminal_only --base_url="http://127.0.0.1:$port/v1" --api_key=local --model=smollm2-135m \
  --tool_call_mode=constrained --reasoning_disabled --discard_incomplete --max_tokens=256 --max_turns=3 \
  --temperature=0.2 "$@"
# One trajectory as the model produced it (kept or not: the raw ledger has every sample).
"$venv/bin/python" - "${HERMES_DATA_DIR:-data}/$run_name/raw" <<'PY'
import json, sys
from pathlib import Path
record = json.loads(sorted(Path(sys.argv[1]).glob("*.jsonl"))[0].read_text().splitlines()[0])
print(f"\none sample as SmolLM2-135M produced it ({record['disposition']}):")
for message in record.get("messages") or []:
    calls = [f"{c['function']['name']}({c['function']['arguments']})" for c in message.get("tool_calls") or []]
    print(f"  {message['role']:>9}: {' '.join(calls) or (message.get('content') or '')[:160]!s}".replace("\n", " "))
PY
