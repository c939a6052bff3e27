"""Rollout throughput of an environment run: 64 rollouts at once (16 groups of 4) against the simulated
endpoint in its own process at 0.5 s per call, each rollout a tool call, a final answer, its verifier in
its sandbox and its tokenization. Prints the fraction of the endpoint bound with its target.

    .venv/bin/python bench/rollouts.py [--groups 256] [--latency 0.5]

The endpoint bound is the wall time if only the endpoint's latency counted: rollouts × calls per
rollout × latency ÷ rollouts at once.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import Endpoint, run_measured  # noqa: E402

TARGET = 0.85
GROUP_SIZE, CONCURRENT_GROUPS, CALLS_PER_ROLLOUT = 4, 16, 2
CHILD = """
import sys, time
from pathlib import Path
from hermes_core.config import Endpoint
from hermes_core.environments.env_run import EnvRun, run_tasks
run = EnvRun(env_name="bench", tasks_file=sys.argv[1], model="hermes-sim", group_size={size},
             concurrency={groups}, max_turns=4)
started = time.monotonic()
counts = run_tasks(run, Path(sys.argv[2]), run.tasks().tasks, Endpoint(sys.argv[3], "none", "hermes-sim"))
print(counts, round(time.monotonic() - started, 3))
""".format(size=GROUP_SIZE, groups=CONCURRENT_GROUPS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=256, help="groups in all (each of 4 rollouts)")
    parser.add_argument("--latency", type=float, default=0.5, help="seconds per model call")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-rollouts-") as tmp:
        work = Path(tmp)
        tasks = work / "tasks.jsonl"
        tasks.write_text("".join(json.dumps({
            "id": f"t{i}", "prompt": f"Task {i}: run it [sim:command=echo {i} > answer.txt]",
            "verifier": {"type": "file_equals", "path": "answer.txt", "content": f"{i}", "strip": True}}) + "\n"
            for i in range(args.groups)))
        endpoint = Endpoint(args.latency, work)
        try:
            measured = run_measured([sys.executable, "-c", CHILD, str(tasks), str(work / "data"), endpoint.base_url],
                                    env={"PYTHONPATH": str(Path(__file__).resolve().parents[1]),
                                         "HERMES_CACHE_DIR": str(Path.home() / ".cache" / "hermes-foundry"),
                                         "PATH": "/usr/bin:/bin"})
            endpoint_cpu = endpoint.cpu_seconds()
        finally:
            endpoint.close()
    counts, engine_wall = measured.output.strip().splitlines()[-1].rsplit(" ", 1)
    rollouts = args.groups * GROUP_SIZE
    bound = rollouts * CALLS_PER_ROLLOUT * args.latency / (GROUP_SIZE * CONCURRENT_GROUPS)
    efficiency = bound / float(engine_wall)
    print(f"{rollouts} rollouts, {GROUP_SIZE * CONCURRENT_GROUPS} at once, {args.latency} s per call: {counts}")
    print(f"  wall {float(engine_wall):.1f} s (command {measured.wall:.1f} s incl. start-up and the tokenizer load), "
          f"endpoint bound {bound:.1f} s")
    print(f"  efficiency (bound ÷ wall): {efficiency:.2f}  target ≥ {TARGET}  {'ok' if efficiency >= TARGET else 'MISSED'}")
    print(f"  CPU per rollout, whole tree: {measured.cpu / rollouts * 1000:.1f} ms (endpoint "
          f"{endpoint_cpu / rollouts * 1000:.1f} ms); peak RSS {measured.max_rss_mb:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
