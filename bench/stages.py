"""Where a batch run's CPU goes, per stage of a sample: a `hermes-batch` run (64 sessions × 2,000 samples
against the simulated endpoint at 0.5 s, the local sandbox) measured whole, then the same run under
py-spy (every process of it, GIL holders, without pausing them: what each Python process computes),
its samples sorted into stages by the code they were in. What no Python process computed (sandboxes,
the commands in them, bubblewrap) is the whole tree's CPU minus the Python stages; py-spy slows the
run it watches, so on two cores its sum can exceed the unwatched run's whole (then that line is 0).

    .venv/bin/python bench/stages.py [--sessions 64] [--samples 2000] [--latency 0.5]

Prints one line per stage: CPU-seconds and milliseconds per sample.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from harness import BIN, Endpoint, batch_env, run_measured, write_prompts  # noqa: E402
from throughput import batch_argv  # noqa: E402

RATE = 50  # py-spy samples per second: a sample is 20 ms of one process's CPU
# (stage, code it was in), first match wins: a sample is counted once, in the innermost stage listed.
STAGES = [
    ("ledger: append and note a record (parent)", ("Ledger.append",)),
    ("progress bar (parent)", ("progress.py",)),
    ("record: ShareGPT row, statistics (worker)", ("records.py", "sharegpt.py", "filters.py")),
    ("sandbox client (worker)", ("hermes_core/sandbox/",)),
    ("tool dispatch (worker)", ("hermes_core/tools/",)),
    ("model call: HTTP and JSON (worker)", ("model_client.py", "aiohttp", "orjson")),
    ("agent loop (worker)", ("hermes_core/agent/",)),
    ("worker processes: hand-offs (both sides)", ("multiprocessing/connection", "batch/workers.py")),
    ("event loop scheduling (worker)", ("asyncio",)),
    ("imports", ("importlib",)),
    ("Dagster: instance, runs, events, final files, checks", ("dagster", "hermes_assets", "hf_loading")),
]


def stacks(raw: Path) -> list[tuple[list[str], int]]:
    """py-spy's raw output as (frames, samples); a process title may span lines."""
    records, pending = [], ""
    for line in raw.read_text(errors="replace").splitlines(keepends=True):
        pending += line
        if re.search(r" \d+\n$", pending):
            stack, count = pending.rstrip("\n").rsplit(" ", 1)
            records.append((stack.split(";")[1:], int(count)))  # the first frame names the process
            pending = ""
    return records


def stage_of(frames: list[str]) -> str:
    """The stage of a sample, from the frames a process ran itself: a worker's stack begins with the
    parent's frames that forked it (py-spy shows them), which are cut off at the worker's entry."""
    names = [frame.split(" (")[0] for frame in frames]
    own = frames[names.index("_worker_main") + 1:] if "_worker_main" in names else frames
    text = ";".join(own)
    return next((name for name, marks in STAGES if any(mark in text for mark in marks)), "other Python")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=0.5, help="seconds per model call (the realistic run: 5)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hermes-stages-") as tmp:
        work = Path(tmp)
        endpoint = Endpoint(args.latency, work)
        try:
            dataset = write_prompts(work / "prompts.jsonl", args.samples)
            argv = batch_argv(dataset, "whole", endpoint, args.sessions, max(10, args.samples // 20))
            whole = run_measured(argv, batch_env(work))
            raw = work / "profile.txt"
            profiled = batch_argv(dataset, "profiled", endpoint, args.sessions, max(10, args.samples // 20))
            subprocess.run([str(BIN / "py-spy"), "record", "--subprocesses", "--gil", "--nonblocking", "-r", str(RATE), "--format", "raw",
                            "-o", str(raw), "--", *profiled], env=batch_env(work), check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            per_stage: Counter[str] = Counter()
            for frames, count in stacks(raw):
                per_stage[stage_of(frames)] += count / RATE
        finally:
            endpoint.close()
    python = sum(per_stage.values())
    per_stage["sandboxes and their commands (not Python)"] = max(0.0, whole.cpu - python)
    print(f"# {args.sessions} sessions × {args.samples:,} samples at {args.latency:g} s: whole tree {whole.cpu:.1f} CPU-s "
          f"({whole.cpu / args.samples * 1000:.1f} ms per sample), wall {whole.wall:.1f} s")
    print(f"{'stage':<58} {'CPU-s':>7} {'ms/sample':>10}")
    for name, seconds in sorted(per_stage.items(), key=lambda item: -item[1]):
        print(f"{name:<58} {seconds:7.1f} {seconds / args.samples * 1000:10.2f}")


if __name__ == "__main__":
    main()
