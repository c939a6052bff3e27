"""Floors: what the parts that every batch command must have cost on this machine, before any work of
this project, beside the throughput targets they bound (docs/explanation/performance.md, "Where the
remaining time goes"). A target below its floor cannot be met here by changing this project's code.

    .venv/bin/python bench/floors.py [--repeat 3]

- **Start-up** (target: first model request ≤ 1.5 s after the command starts): a bare Python process
  imports Dagster, loads an instance from this project's `dagster.yaml` and materializes one trivial
  asset in process; the floor is when that asset's body runs. A batch command's samples run inside a
  Dagster run (the model pool's limit, blocking checks, lineage), so its first request comes after at
  least this (the run plans first, then samples).
- **CPU per sample at 64 × 2,000** (target ≤ 0.008 CPU-s, the command's whole tree): per sample, the
  simulated model's command (`echo … && ls -la` by bash) as the first process of a new mount and pid
  namespace (what isolating a sample costs at the least), at a run's pace: 16 spawners at once, each
  one command per second, as a session's samples come. On some virtual machines, this one among them,
  memory freed a while ago is dear to touch again, so back-to-back commands (printed beside) cost
  less than a run's. Then two chat completions of an agent's size over aiohttp alone (no agent, no
  records); plus the fixed part over 2,000 samples: the bare Dagster process making two runs (the
  planning with the samples, then the outputs) and HF `datasets` loading 2,000 of this project's
  records (the blocking `loads_with_hf_datasets` check). Left out, so the floor is lower than the
  truth: the sandbox, the ledger's fsyncs, the agent loop.
- **Efficiency at 64 × 2,000, 0.5 s per call** (target ≥ 0.90): the ideal 32 s over the least wall any
  command could take: the start-up floor, 32 rounds of two calls, then one more Dagster run and the
  HF load (`datasets` imported ahead, as the run's loader process does).

Each figure is the median of `--repeat` runs; the simulated endpoint runs in its own process
(127.0.0.1), as in bench/throughput.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).parent))
from harness import Endpoint, batch_env, require_bwrap, write_prompts  # noqa: E402
from throughput import Report, batch_argv  # noqa: E402

from hermes_core.agent.loop import AIAgent  # noqa: E402

PROJECT_YAML = Path(__file__).resolve().parent.parent / "hermes_assets" / "default_dagster.yaml"
SESSIONS, SAMPLES, LATENCY = 64, 2000, 0.5
ROUNDS = -(-SAMPLES // SESSIONS)  # 32: the ideal wall is ROUNDS × 2 calls × LATENCY
PACED = 16  # interpreters spawning commands at once, each at a session's pace: one per sample (2 × LATENCY)
COMMAND = "echo 'hello from hermes-sim' && ls -la"  # what the simulated model asks for in bench/throughput.py
# A bare Dagster process: t0 (epoch seconds, just before it was started) in argv[1], runs in argv[2].
BARE_DAGSTER = """
import json, sys, time
t0, runs = float(sys.argv[1]), int(sys.argv[2])
import dagster as dg
imported = time.time()
instance = dg.DagsterInstance.get()
loaded = time.time()
bodies = []

@dg.asset
def trivial() -> None:
    bodies.append(time.time())

walls = []
for _ in range(runs):
    began = time.time()
    dg.materialize([trivial], instance=instance)
    walls.append(time.time() - began)
print(json.dumps({"import": imported - t0, "instance": loaded - imported, "first_body": bodies[0] - t0,
                  "run_walls": walls}))
"""
# Commands spawned by a bare interpreter: argv t0, count, mode, command, empty folder, pause. Mode "spawn":
# posix_spawn from here; "fork": from a forked child; "isolated": from a forked child that first
# unshares a mount and a pid namespace (the command is their pid 1; needs root). Isolating costs
# "isolated" minus "fork": the fork itself is the interpreter's, which a sandbox's small pid 1 is not.
# `pause` seconds pass before each command.
COMMANDS = """
import ctypes, json, os, resource, sys, time
count, mode, command, folder = int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
pause = float(sys.argv[6])
libc = ctypes.CDLL(None, use_errno=True)
actions = [(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0), (os.POSIX_SPAWN_DUP2, 1, 2)]
os.chdir(folder)

def run():
    spawned = os.posix_spawn("/bin/bash", ["bash", "-c", command], os.environ, file_actions=actions)
    return os.waitstatus_to_exitcode(os.waitpid(spawned, 0)[1])

for _ in range(count):
    time.sleep(pause)
    if mode == "spawn":
        status = run()
    else:
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                if mode == "fork" or libc.unshare(0x00020000 | 0x20000000) == 0:  # CLONE_NEWNS | CLONE_NEWPID
                    status = run()
            finally:
                os._exit(status)
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if status:
        sys.exit(f"{command!r} failed ({mode}; new namespaces need root)")
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"cpu": usage.ru_utime + usage.ru_stime}))
"""
HF_LOAD = """
import gc, json, sys, time
gc.disable()  # as the product's loader process does
t0 = float(sys.argv[1])
import datasets  # in the product, imported ahead by the loader process the run starts with
from hermes_core.formats.hf_loading import load_in_process
began = time.time()
rows, _ = load_in_process(sys.argv[2])
print(json.dumps({"rows": rows, "wall": time.time() - t0, "load": time.time() - began}))
"""


def bound(report: Report, name: str, value: float, fmt: str, target: float, ceiling: bool, note: str) -> None:
    """A floor (or, with `ceiling`, a ceiling) beside the target it bounds, and whether the target is
    within reach of this project's code on this machine."""
    reachable = value >= target if ceiling else value <= target
    report.say(f"{name:<46} {value:{fmt}}   target {'≥' if ceiling else '≤'} {target:{fmt}}   "
               f"{'within reach' if reachable else 'TARGET ABOVE IT' if ceiling else 'TARGET BELOW IT'}   {note}")


def child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def python_children(script: str, *args: str, env: dict[str, str] | None = None,
                    count: int = 1) -> tuple[list[dict], float]:
    """Run `script` in `count` fresh interpreters of this venv at once; their JSON answers and their
    CPU seconds together."""
    before = child_cpu()
    argv = [sys.executable, "-c", script, str(time.time()), *args]
    children = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(count)]
    done = [(*child.communicate(), child.returncode) for child in children]
    if failed := [err for _, err, code in done if code]:
        raise RuntimeError(f"a floor's process failed:\n{failed[0][-2000:]}")
    return [json.loads(out.splitlines()[-1]) for out, _, _ in done], child_cpu() - before


def python_child(script: str, *args: str, env: dict[str, str] | None = None) -> tuple[dict, float]:
    """Run `script` in a fresh interpreter of this venv; its JSON answer and its CPU seconds."""
    answers, cpu = python_children(script, *args, env=env)
    return answers[0], cpu


def dagster_floor(workdir: Path, runs: int, repeat: int) -> tuple[dict, float]:
    """The bare Dagster process (`runs` runs), on a home of this project's dagster.yaml used once before."""
    home = workdir / "bare_home"
    home.mkdir(exist_ok=True)
    shutil.copyfile(PROJECT_YAML, home / "dagster.yaml")
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    python_child(BARE_DAGSTER, "1", env=env)  # creates the home's storage, as a user's first command does
    results = [python_child(BARE_DAGSTER, str(runs), env=env) for _ in range(repeat)]
    return _median(results, "first_body")


def _median(results: list[tuple[dict, float]], key: str) -> tuple[dict, float]:
    ordered = sorted(results, key=lambda r: r[0][key])
    return ordered[len(ordered) // 2]


def command_cpu(count: int, mode: str, pause: float = 0.0, parallel: int = 1) -> float:
    """CPU seconds per `COMMAND` run by bash in an empty folder, output discarded (`COMMANDS`, `mode`):
    `count` by each of `parallel` interpreters at once, `pause` seconds apart."""
    with tempfile.TemporaryDirectory(prefix="hermes-floor-") as empty:
        answers, _ = python_children(COMMANDS, str(count), mode, COMMAND, empty, str(pause), count=parallel)
    return sum(answer["cpu"] for answer in answers) / (count * parallel)


def http_cpu(endpoint: Endpoint, sessions: int, samples: int) -> float:
    """This process's CPU seconds per sample for two agent-sized chat completions (the tool call, then the
    answer) over one aiohttp session, `sessions` at once: the HTTP client's own cost, nothing else."""
    agent = AIAgent(model="hermes-sim", base_url=endpoint.base_url, quiet_mode=True,
                    enabled_toolsets=["terminal", "file"])
    tools = [{"type": "function", "function": tool.definition()} for tool in agent.tools]
    url = endpoint.base_url + "/chat/completions"

    async def post(client: aiohttp.ClientSession, messages: list[dict]) -> dict:
        body = json.dumps({"model": "hermes-sim", "messages": messages, "tools": tools})
        async with client.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
            return json.loads(await response.read())["choices"][0]["message"]

    async def run() -> None:
        jobs = iter(range(samples))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=sessions)) as client:
            async def session() -> None:
                for index in jobs:
                    messages = [{"role": "user", "content": f"Task {index}: run a shell command"}]
                    reply = await post(client, messages)
                    calls = reply.get("tool_calls") or []
                    messages += [reply, *({"role": "tool", "tool_call_id": call["id"], "content": "total 0\n"}
                                          for call in calls)]
                    await post(client, messages)

            await asyncio.gather(*(session() for _ in range(sessions)))

    before = resource.getrusage(resource.RUSAGE_SELF)
    asyncio.run(run())
    after = resource.getrusage(resource.RUSAGE_SELF)
    return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / samples


def records_file(workdir: Path, endpoint: Endpoint, rows: int) -> Path:
    """`rows` records of this project: 8 made by `hermes-batch` against the simulated endpoint, repeated
    with their own prompt index and sample key (what `datasets` reads is the same shape)."""
    dataset = write_prompts(workdir / "prompts-8.jsonl", 8)
    env = batch_env(workdir)
    done = subprocess.run(batch_argv(dataset, "floor", endpoint, 4, 10), env=env, capture_output=True, text=True,
                          check=False)
    if done.returncode:
        raise RuntimeError(f"hermes-batch failed:\n{done.stderr[-2000:]}")
    made = [json.loads(line) for line in (Path(env["HERMES_DATA_DIR"]) / "floor" / "trajectories.jsonl").open()]
    path = workdir / f"records-{rows}.jsonl"
    with path.open("w") as out:
        for index in range(rows):
            record = dict(made[index % len(made)], prompt_index=index, sample_key=f"{index:064x}")
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="runs per floor; the median is kept")
    repeat = parser.parse_args().repeat
    require_bwrap("the records for the HF load are made by a real batch run")
    with tempfile.TemporaryDirectory(prefix="hermes-floors-") as tmp:
        measure(Report(), Path(tmp), repeat)


def measure(report: Report, workdir: Path, repeat: int) -> None:
    """Every floor, printed as measured."""
    report.say(f"# floors of the throughput targets on this machine, {os.cpu_count()} cores")
    endpoint = Endpoint(LATENCY, workdir)  # calls as far apart as in the run they bound
    try:
        one, _ = dagster_floor(workdir, 1, repeat)
        two, two_cpu = dagster_floor(workdir, 2, repeat)
        run_wall = statistics.median(two["run_walls"])
        report.say(f"-- bare Dagster process: import {one['import']:.2f} s, instance {one['instance']:.2f} s, "
                   f"a run of one trivial asset {run_wall:.2f} s; two runs {two_cpu:.2f} CPU-s in all")
        bound(report, "start-up floor: the asset's body runs (s)", one["first_body"], ".2f", 1.5, False,
              "one Dagster run; a batch command's samples start in one, after its planning steps")
        # Back to back, a command reuses the memory the one before has just freed. In a run each session's
        # command comes once per sample, and some virtual machines (this one: the kernel's page reporting
        # hands free memory to the host at once) make memory freed that long ago dear to touch again. The
        # floor is the cost at the run's pace.
        back_to_back = statistics.median(command_cpu(300, "isolated") for _ in range(repeat))
        costs = {mode: statistics.median(command_cpu(8, mode, 2 * LATENCY, PACED) for _ in range(repeat))
                 for mode in ("spawn", "fork", "isolated")}
        isolating = max(0.0, costs["isolated"] - costs["fork"])
        http = statistics.median(http_cpu(endpoint, SESSIONS, 4 * SESSIONS) for _ in range(repeat))
        path = records_file(workdir, endpoint, SAMPLES)
        load, load_cpu = _median([python_child(HF_LOAD, str(path)) for _ in range(repeat)], "wall")
        report.say(f"-- per sample: the command {costs['spawn'] * 1000:.2f} ms and a new mount and pid namespace "
                   f"for it {isolating * 1000:.2f} ms at the run's pace ({PACED} spawners at once, one each per "
                   f"{2 * LATENCY:g} s; the isolated command {costs['isolated'] * 1000:.2f} ms, back to back "
                   f"{back_to_back * 1000:.2f} ms), two chat completions over aiohttp {http * 1000:.2f} ms; HF "
                   f"datasets importing and loading {load['rows']:,} records ({path.stat().st_size / 2**20:.0f} MiB) "
                   f"{load['wall']:.2f} s ({load['load']:.2f} s of it the load), {load_cpu:.2f} CPU-s")
        fixed = (two_cpu + load_cpu) / SAMPLES
        floor = costs["spawn"] + isolating + http + fixed
        bound(report, "CPU s/sample floor (64 × 2,000)", floor, ".4f", 0.008, False,
              f"fixed part {fixed * 1000:.2f} ms of it; {max(0.0, 0.008 - floor) * 1000:.2f} ms per sample left "
              "for sandbox, agent loop, records and hand-offs")
        ideal = ROUNDS * 2 * LATENCY
        wall = one["first_body"] + ideal + run_wall + load["load"]
        bound(report, "efficiency ceiling (64 × 2,000 at 0.5 s)", ideal / wall, ".3f", 0.90, True,
              f"least wall {wall:.1f} s against the ideal {ideal:.0f} s")
    finally:
        endpoint.close()


if __name__ == "__main__":
    main()
