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

from tree_memory import TreePss

BIN = Path(sys.executable).parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class Endpoint:
    """The simulated endpoint (`hermes-foundry sim-model`, run as `python -m
    hermes_core.endpoints.simulated`: the same server without the CLI's imports) as a separate
    process (its CPU is not the orchestrator's)."""

    def __init__(self, latency: float, workdir: Path) -> None:
        port_file, errors = workdir / "endpoint.port", workdir / "endpoint.err"
        with errors.open("w") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hermes_core.endpoints.simulated", "--port", "0", "--latency", str(latency),
                 "--port-file", str(port_file)], stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"the simulated endpoint did not start:\n{errors.read_text()[-2000:]}")
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
    pss: TreePss | None = None  # the tree's PSS samples, when asked for
    returncode: int = 0


# The wrapper is a child subreaper: a process that leaves the command's tree (a sandbox's daemonized
# helper) is reparented to it, so it is still sampled, and reaped here as it exits (no zombies pile
# up), its CPU counted with the command's.
_MEASURE = """
import ctypes, os, resource, subprocess, sys, tempfile
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
output = tempfile.TemporaryFile()
command = subprocess.Popen(sys.argv[1:], stdout=output, stderr=subprocess.STDOUT)
while True:
    pid, status = os.wait()
    if pid == command.pid:
        break
try:
    while os.waitpid(-1, os.WNOHANG)[0]:
        pass  # orphans that exited meanwhile
except ChildProcessError:
    pass
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
output.seek(0)
sys.stdout.write(output.read().decode(errors="replace"))
sys.stderr.write(f"{usage.ru_utime + usage.ru_stime} {usage.ru_maxrss}")
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_measured(argv: list[str], env: dict[str, str], pss_interval: float = 0.0, check: bool = True) -> Measured:
    """Run `argv` under a small parent whose children are only that command, so its CPU and peak
    RSS are the command's whole process tree (sandboxes included). With `pss_interval`, the tree's
    summed PSS is also sampled that often (bench/tree_memory.py). `check=False` keeps the figures of a
    command that exits non-zero (a long run with a few failed samples)."""
    started, clock = time.time(), time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", _MEASURE, *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    sampler = TreePss(proc.pid, pss_interval) if pss_interval else None
    if sampler:
        sampler.start()
    try:
        stdout, stderr = proc.communicate()
    finally:
        if sampler:
            sampler.stop()
    wall = time.monotonic() - clock
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:2])} failed ({proc.returncode}):\n{stdout[-3000:]}")
    cpu, rss_kb = stderr.split()[-2:]
    return Measured(started, wall, float(cpu), int(rss_kb) / 1024, stdout, sampler, proc.returncode)


def batch_env(workdir: Path) -> dict[str, str]:
    (workdir / "dagster_home").mkdir(exist_ok=True)
    return {**os.environ, "HERMES_DATA_DIR": str(workdir / "data"), "DAGSTER_HOME": str(workdir / "dagster_home")}
