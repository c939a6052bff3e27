"""Throughput of a batch run against the simulated endpoint, measured from the command to its exit.

    .venv/bin/python bench/throughput.py [--samples 200] [--latency 0.5] [--workers 4 64]

For each worker count: a fresh run of `hermes-batch` (a separate process, as a user runs it) over
N one-tool-call prompts, with the simulated endpoint in another process. Prints, per run:
efficiency = ideal wall ÷ actual wall, where ideal = calls per sample × latency × ceil(N ÷ workers)
(the endpoint-bound lower limit), and the orchestrator's CPU seconds per sample (its whole
process tree, sandboxes included; the endpoint excluded).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

BIN = Path(sys.executable).parent
CALLS_PER_SAMPLE = 2  # one tool round, then the answer


def start_endpoint(latency: float, workdir: Path) -> tuple[subprocess.Popen, str]:
    port_file = workdir / "port"
    proc = subprocess.Popen([str(BIN / "hermes-foundry"), "sim-model", "--port", "0", "--latency", str(latency),
                             "--port-file", str(port_file)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not (port_file.exists() and port_file.read_text().strip()):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("the simulated endpoint did not start")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port_file.read_text().strip()}/v1"


def endpoint_requests(base_url: str) -> int:
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/sim/requests", timeout=10) as response:
        return json.load(response)["requests"]


def measure(samples: int, workers: int, latency: float, base_url: str, workdir: Path) -> dict[str, float]:
    dataset = workdir / f"prompts-{workers}.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"Task {i}: run a shell command"}) + "\n" for i in range(samples)))
    env = {**os.environ, "HERMES_DATA_DIR": str(workdir / "data"), "DAGSTER_HOME": str(workdir / "dagster_home")}
    (workdir / "dagster_home").mkdir(exist_ok=True)
    before_requests = endpoint_requests(base_url)
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    subprocess.run([str(BIN / "hermes-batch"), f"--dataset_file={dataset}", f"--run_name=bench_{workers}",
                    f"--base_url={base_url}", "--distribution=terminal_only", f"--num_workers={workers}",
                    f"--batch_size={max(1, samples // 20)}"], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.monotonic() - started
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    calls = endpoint_requests(base_url) - before_requests
    ideal = (calls / samples) * latency * math.ceil(samples / workers)
    return {"wall": wall, "ideal": ideal, "efficiency": ideal / wall, "cpu_per_sample": cpu / samples,
            "calls_per_sample": calls / samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--latency", type=float, default=0.5)
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 64])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hermes-bench-") as tmp:
        workdir = Path(tmp)
        endpoint, base_url = start_endpoint(args.latency, workdir)
        try:
            for workers in args.workers:
                m = measure(args.samples, workers, args.latency, base_url, workdir)
                print(f"workers={workers:<3} samples={args.samples} latency={args.latency}s "
                      f"calls/sample={m['calls_per_sample']:.2f}: efficiency (ideal {m['ideal']:.1f}s ÷ wall "
                      f"{m['wall']:.1f}s) = {m['efficiency']:.2f}; orchestrator CPU {m['cpu_per_sample']:.4f} s/sample",
                      flush=True)
        finally:
            endpoint.terminate()
            endpoint.wait(timeout=10)


if __name__ == "__main__":
    main()
