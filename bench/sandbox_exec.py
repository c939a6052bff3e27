"""Per-command cost of the `local` (bubblewrap) sandbox: latency and CPU of `exec("true")`, alone and
with 4 and 64 commands at once (each thread its own sandbox, as sessions have), plus opening and
closing a sandbox with one command in it. Prints each figure with its target.

    .venv/bin/python bench/sandbox_exec.py [--commands 400] [--backend local] [--per_command]

--per_command runs the local backend as before its exec server: one bubblewrap per command.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import CpuMeter  # noqa: E402
from hermes_core.sandbox import SandboxSettings, get_backend  # noqa: E402

TARGETS = {1: 5.0, 4: 10.0, 64: None}  # ms per command (latency) alone and at 4 at once


METER = CpuMeter()  # this process and its sandboxes, commands included (see CpuMeter)


def _cpu() -> float:
    if METER.folder is not None:
        return METER.seconds()
    times = os.times()  # without a cgroup: what the kernel counted for this process and its reaped children
    return times.user + times.system + times.children_user + times.children_system


def run_level(backend, threads: int, commands: int) -> tuple[float, float, float, float]:
    """(median latency ms, p90 ms, commands per second, CPU ms per command) at `threads` at once."""
    boxes = [backend.open(f"bench-{threads}-{i}") for i in range(threads)]
    for box in boxes:
        box.exec("true")  # the sandbox is up: what is measured is each further command
    per_thread = max(1, commands // threads)
    latencies: list[float] = []
    lock = threading.Lock()

    def work(box) -> None:
        mine = []
        for _ in range(per_thread):
            started = time.perf_counter()
            result = box.exec("true")
            mine.append(time.perf_counter() - started)
            assert result.exit_code == 0, result
        with lock:
            latencies.extend(mine)

    workers = [threading.Thread(target=work, args=(box,)) for box in boxes]
    cpu, wall = _cpu(), time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    wall, cpu = time.perf_counter() - wall, _cpu() - cpu
    for box in boxes:
        box.close()
    latencies.sort()
    done = len(latencies)
    return (statistics.median(latencies) * 1000, latencies[int(done * 0.9)] * 1000, done / wall, cpu / done * 1000)


def open_close(name: str, settings: SandboxSettings, count: int) -> tuple[float, float]:
    """(wall ms, CPU ms) to open a sandbox, run one command and close it, one after another in one slot.
    A fresh backend, closed inside the measure: a slot's zygote is a child whose CPU counts once reaped."""
    cpu, wall = _cpu(), time.perf_counter()
    backend = get_backend(name, settings)
    try:
        for i in range(count):
            with backend.open(f"oc-{i}") as box:
                box.exec("true")
    finally:
        backend.close()
    return (time.perf_counter() - wall) / count * 1000, (_cpu() - cpu) / count * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=400)
    parser.add_argument("--backend", default="local")
    parser.add_argument("--per_command", action="store_true", help="one bubblewrap per command (no exec server)")
    args = parser.parse_args()
    if METER.folder is not None:
        METER.join()
    try:
        measure(args)
    finally:
        METER.close()


def measure(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as root:
        settings = SandboxSettings(state_root=Path(root), exec_server=not args.per_command)
        backend = get_backend(args.backend, settings)
        try:
            run_level(backend, 1, 20)  # warm-up: the /etc copy, slots
            for threads in (1, 4, 64):
                median, p90, rate, cpu = run_level(backend, threads, args.commands if threads > 1 else args.commands // 2)
                target = TARGETS[threads]
                goal = f"target ≤ {target:.0f} ms" if target else "no target (kernel- and CPU-bound)"
                print(f"{threads:>2} at once: median {median:6.2f} ms, p90 {p90:6.2f} ms, {rate:6.0f} commands/s, "
                      f"CPU {cpu:5.2f} ms per command ({goal})")
        finally:
            backend.close()
        wall, cpu = open_close(args.backend, settings, 200)
        print(f"open + 1 command + close: {wall:.2f} ms wall, {cpu:.2f} ms CPU")


if __name__ == "__main__":
    main()
