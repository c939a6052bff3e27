"""What the benchmarks share: the simulated endpoint in its own process, datasets, and running a
command the way a user does while measuring its wall time, CPU (whole process tree) and peak RSS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class Endpoint:
    """`hermes-foundry sim-model` as a separate process (its CPU is not the orchestrator's)."""

    def __init__(self, latency: float, workdir: Path) -> None:
        port_file = workdir / "endpoint.port"
        self.proc = subprocess.Popen(
            [str(BIN / "hermes-foundry"), "sim-model", "--port", "0", "--latency", str(latency),
             "--port-file", str(port_file)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the simulated endpoint did not start")
            time.sleep(0.05)
        self.base_url = f"http://127.0.0.1:{port_file.read_text().strip()}/v1"

    def log(self, since: float = 0.0) -> dict:
        """requests so far, and when the first one at or after `since` (epoch seconds) arrived."""
        url = self.base_url.removesuffix("/v1") + f"/sim/requests?since={since}"
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response)

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def write_prompts(path: Path, count: int, text: str = "Task {i}: run a shell command") -> Path:
    path.write_text("".join(json.dumps({"prompt": text.format(i=i)}) + "\n" for i in range(count)))
    return path


@dataclass
class Measured:
    started: float  # epoch seconds, just before the command started
    wall: float
    cpu: float  # user + system seconds of the command and every process it started
    max_rss_mb: float
    output: str


_MEASURE = """
import resource, subprocess, sys, time
done = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
sys.stdout.write(done.stdout)
sys.stderr.write(f"{usage.ru_utime + usage.ru_stime} {usage.ru_maxrss}")
sys.exit(done.returncode)
"""


def run_measured(argv: list[str], env: dict[str, str]) -> Measured:
    """Run `argv` under a small parent whose children are only that command, so its CPU and peak
    RSS are the command's whole process tree (sandboxes included)."""
    started, clock = time.time(), time.monotonic()
    done = subprocess.run([sys.executable, "-c", _MEASURE, *argv], env=env, capture_output=True, text=True)
    wall = time.monotonic() - clock
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:2])} failed ({done.returncode}):\n{done.stdout[-3000:]}")
    cpu, rss_kb = done.stderr.split()[-2:]
    return Measured(started, wall, float(cpu), int(rss_kb) / 1024, done.stdout)


def batch_env(workdir: Path) -> dict[str, str]:
    (workdir / "dagster_home").mkdir(exist_ok=True)
    return {**os.environ, "HERMES_DATA_DIR": str(workdir / "data"), "DAGSTER_HOME": str(workdir / "dagster_home")}
