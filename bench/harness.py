"""What the benchmarks share: the simulated endpoint in its own process, datasets, and running a
command the way a user does while measuring its wall time, CPU (whole process tree) and peak RSS."""

from __future__ import annotations

import json
import os
import shutil
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


def require_bwrap(why: str) -> None:
    """Exit with one line when bubblewrap is missing; `why` says what needs it."""
    if not shutil.which("bwrap"):
        sys.exit(f"bubblewrap (bwrap) is needed: {why}")


def write_prompts(path: Path, count: int, text: str = "Task {i}: run a shell command") -> Path:
    path.write_text("".join(json.dumps({"prompt": text.format(i=i)}) + "\n" for i in range(count)))
    return path


@dataclass
class Measured:
    started: float  # epoch seconds, just before the command started
    wall: float
    cpu: float  # user + system seconds of the command and every process it started (CpuMeter)
    max_rss_mb: float
    output: str
    pss: TreePss | None = None  # the tree's PSS samples, when asked for
    returncode: int = 0
    rusage_cpu: float = 0.0  # what getrusage says of the tree: without most sandboxed commands (CpuMeter)


class CpuMeter:
    """CPU of a process tree from the kernel's cgroup accounting: the tree runs in a cgroup of its own,
    and what its sandboxes use after moving to their slots' cgroups is counted through their common
    parent (`hermes-foundry`). `getrusage` alone misses most of a sandboxed command: a session's pid 1
    lets the kernel reap its command supervisors, and the CPU of a process reaped that way reaches no
    parent's count (a 64 × 2,000 run: 15.9 CPU-s by rusage, 22.2 by cgroup). `folder` is None where no
    cgroup can be made (not root): the figures are rusage's then."""

    def __init__(self) -> None:
        self.folder: Path | None = None
        self.root: Path | None = None
        for line in Path("/proc/self/mounts").read_text().splitlines():
            _, point, kind, options = line.split()[:4]
            if (kind == "cgroup" and "cpuacct" in options.split(",")) or kind == "cgroup2":
                folder = Path(point) / f"hermes-bench-{os.getpid()}-{time.monotonic_ns()}"
                try:
                    folder.mkdir()
                except OSError:
                    continue
                self.folder, self.root = folder, Path(point)
                break
        self._joined = False
        self._parent_before = _usage_ns(self._parent_usage())

    def _parent_usage(self) -> Path | None:
        return self.root / "hermes-foundry" / _usage_file(self.folder) if self.folder and self.root else None

    def join(self) -> None:
        """Move this process into the meter's cgroup (a benchmark whose sandboxes are its own children)."""
        assert self.folder is not None
        (self.folder / "cgroup.procs").write_text(str(os.getpid()))
        self._joined = True

    def seconds(self) -> float:
        """CPU seconds of the tree since the meter was made."""
        assert self.folder is not None
        own = _usage_ns(self.folder / _usage_file(self.folder))
        return (own + _usage_ns(self._parent_usage()) - self._parent_before) / 1e9

    def close(self) -> None:
        """Remove the cgroup (this process moved back out first, if it joined)."""
        if self.folder is None or self.root is None:
            return
        if self._joined:
            (self.root / "cgroup.procs").write_text(str(os.getpid()))
        try:
            self.folder.rmdir()
        except OSError:
            pass  # a process of the tree outlives it: the next meter's folder is another


def _usage_file(folder: Path) -> str:
    return "cpuacct.usage" if (folder / "cpuacct.usage").exists() else "cpu.stat"


def _usage_ns(path: Path | None) -> int:
    """Nanoseconds of CPU in a cgroup's cpuacct.usage or cpu.stat (0 if it does not exist)."""
    try:
        text = path.read_text() if path else ""
    except OSError:
        return 0
    if path.name == "cpu.stat":
        return next((int(line.split()[1]) * 1000 for line in text.splitlines() if line.startswith("usage_usec")), 0)
    return int(text or 0)


# The wrapper is a child subreaper: a process that leaves the command's tree (a sandbox's daemonized
# helper) is reparented to it, so it is still sampled, and reaped here as it exits (no zombies pile
# up), its CPU counted with the command's.
_MEASURE = """
import ctypes, os, resource, subprocess, sys, tempfile
if os.environ.get("HERMES_BENCH_CGROUP"):  # the cgroup whose accounting measures the tree (CpuMeter)
    with open(os.environ.pop("HERMES_BENCH_CGROUP") + "/cgroup.procs", "w") as procs:
        procs.write(str(os.getpid()))
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
    meter = CpuMeter()
    if meter.folder is not None:
        env = {**env, "HERMES_BENCH_CGROUP": str(meter.folder)}
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
    tree_cpu = meter.seconds() if meter.folder else float(cpu)
    meter.close()
    return Measured(started, wall, tree_cpu, int(rss_kb) / 1024, stdout, sampler, proc.returncode, float(cpu))


def batch_env(workdir: Path) -> dict[str, str]:
    (workdir / "dagster_home").mkdir(exist_ok=True)
    return {**os.environ, "HERMES_DATA_DIR": str(workdir / "data"), "DAGSTER_HOME": str(workdir / "dagster_home")}
