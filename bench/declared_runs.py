"""The Dagster face with many declared runs: 50 runs in a runs file, loaded by the definitions and by a
real `dagster dev` (webserver, daemon, code server) on 127.0.0.1. Prints each figure with its target:

- the definitions' load time (a fresh process importing and building them),
- `dagster dev` from start to the code location loaded, and a reload (the UI's Reload button),
- sensors per run, for all runs, and how many run by default,
- idle CPU of the whole `dagster dev` process tree over 60 s, as a share of one core.

    .venv/bin/python bench/declared_runs.py [--runs 50] [--idle 60]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from harness import CLOCK_TICKS  # noqa: E402
from tree_memory import descendants  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DAGSTER = Path(sys.executable).parent / "dagster"
LOAD = ("import time; started = time.perf_counter(); from hermes_assets.definitions import defs; "
        "defs().get_repository_def().get_all_jobs(); print(time.perf_counter() - started)")
RELOAD = ('mutation { reloadRepositoryLocation(repositoryLocationName: "hermes_assets.definitions") '
          '{ __typename } }')
SENSORS = ("{ sensorsOrError(repositorySelector: {repositoryLocationName: \"hermes_assets.definitions\", "
           "repositoryName: \"__repository__\"}) { ... on Sensors { results { name sensorState { status } } } } }")
LOCATION = "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus } } } }"


def graphql(port: int, query: str) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": query}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.loads(reply.read())["data"]


def loaded(port: int) -> bool:
    try:
        entries = graphql(port, LOCATION)["workspaceOrError"]["locationEntries"]
    except OSError:
        return False
    return any(e["name"] == "hermes_assets.definitions" and e["loadStatus"] == "LOADED" for e in entries)


def tree_cpu_s(root: int) -> float:
    """CPU seconds used so far by `root` and every live process under it."""
    total = 0
    for pid in [root, *descendants(root)]:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / CLOCK_TICKS


def figure(name: str, value: float, fmt: str, target: float | None) -> None:
    goal = "no target" if target is None else f"target ≤ {target:{fmt}}   {'ok' if value <= target else 'MISSED'}"
    print(f"{name:<52} {value:{fmt}}   {goal}", flush=True)


def declare(home: Path, runs: int) -> dict[str, str]:
    data = home / "data"
    data.mkdir(parents=True)
    (data / "p.jsonl").write_text("".join(json.dumps({"prompt": f"Run a command that prints {i}"}) + "\n"
                                          for i in range(3)))
    (data / "runs.yaml").write_text("".join(
        f"- {{run_name: run{i:02d}, dataset_file: p.jsonl, model: hermes-sim, base_url: 'http://127.0.0.1:9/v1'}}\n"
        for i in range(runs)))
    (home / "dagster_home").mkdir()
    (home / "dagster_home" / "dagster.yaml").write_text((ROOT / "dagster_home" / "dagster.yaml").read_text())
    return {**os.environ, "DAGSTER_HOME": str(home / "dagster_home"), "HERMES_DATA_DIR": str(data),
            "HERMES_DAGSTER_URL": ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of idle CPU measured")
    args = parser.parse_args()
    print(f"# {args.runs} declared runs, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="bench-runs-") as tmp:
        env = declare(Path(tmp), args.runs)
        done = subprocess.run([sys.executable, "-c", LOAD], env=env, capture_output=True, text=True, check=True)
        figure("definitions load, fresh process (s)", float(done.stdout.strip().splitlines()[-1]), ".1f", 10.0)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        started = time.monotonic()
        dev = subprocess.Popen([str(DAGSTER), "dev", "-w", str(ROOT / "workspace.yaml"), "-h", "127.0.0.1", "-p",
                                str(port)], cwd=ROOT, env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while not loaded(port):
                if dev.poll() is not None or time.monotonic() - started > 600:
                    sys.exit("dagster dev did not load the code location")
                time.sleep(0.5)
            figure("dagster dev: start to code location loaded (s)", time.monotonic() - started, ".1f", None)
            reload_started = time.monotonic()
            graphql(port, RELOAD)
            while not loaded(port):
                time.sleep(0.2)
            figure("reload (s)", time.monotonic() - reload_started, ".1f", None)
            sensors = graphql(port, SENSORS)["sensorsOrError"]["results"]
            running = [s for s in sensors if s["sensorState"]["status"] == "RUNNING"]
            own = [s for s in sensors if s["name"].startswith("run")]  # the declared runs are run00, run01, ...
            figure("sensors per run", len(own) / args.runs, ".1f", 1.0)
            figure("sensors for all runs", len(sensors) - len(own), "d", None)
            figure("sensors running by default", len(running), "d", None)
            time.sleep(10)  # the first ticks after start-up are not idle
            cpu, wall = tree_cpu_s(dev.pid), time.monotonic()
            time.sleep(args.idle)
            share = (tree_cpu_s(dev.pid) - cpu) / (time.monotonic() - wall)
            figure(f"idle CPU of dagster dev over {args.idle:g} s (share of one core)", share, ".3f", 0.05)
        finally:
            os.killpg(dev.pid, signal.SIGTERM)
            dev.wait(timeout=60)


if __name__ == "__main__":
    main()
