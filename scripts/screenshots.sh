#!/usr/bin/env bash
# The docs' screenshots (docs/screenshots/): the demo run made by hermes-batch in a throwaway Dagster
# home, `dagster dev` on a free 127.0.0.1 port, headless Chromium. Needs chromium (make test installs it).
set -euo pipefail
venv=${VENV:-.venv}
work=$(mktemp -d)
mkdir -p "$work/home" && cp dagster_home/dagster.yaml "$work/home/"
export DAGSTER_HOME=$work/home HERMES_DATA_DIR=$work/data HERMES_DAGSTER_URL=
bash scripts/demo.sh >/dev/null
port=$("$venv/bin/python" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
set -m  # the background job gets its own process group: the trap stops dagster dev and what it started
"$venv/bin/dagster" dev -w workspace.yaml -h 127.0.0.1 -p "$port" >"$work/dev.log" 2>&1 &
dev=$!
set +m
trap 'kill -- -"$dev" 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/server_info" >/dev/null && break; sleep 1; done
# The community dialog would cover the page: mark it seen, as its Skip button does.
curl -sf -H 'content-type: application/json' -d '{"query": "mutation { setNuxSeen }"}' "http://127.0.0.1:$port/graphql" >/dev/null
partition=$("$venv/bin/python" -c "import json, sys; print(json.load(open(sys.argv[1]))['batches'][0]['key'])" \
  "$work/data/demo/batches.json")
shot() {  # name, path on the webserver
  chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --user-data-dir="$work/chrome-$1" --hide-scrollbars \
    --window-size=1280,800 --virtual-time-budget=20000 --screenshot="docs/screenshots/$1.png" \
    "http://127.0.0.1:$port$2" >/dev/null 2>&1
  echo "docs/screenshots/$1.png"
}
shot asset-graph "/asset-groups/demo"
shot raw-trajectories-partitions "/assets/demo/raw_trajectories?view=partitions&partition=$partition"
shot filtered-trajectories-checks "/assets/demo/filtered_trajectories?view=checks"
