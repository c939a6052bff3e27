"""Throughput of batch runs against the simulated endpoint, measured from the user's command to its exit.

    .venv/bin/python bench/throughput.py [--latency 0.5] [--quick] [--profile] [--realistic | --realistic_only]

The endpoint (`hermes-foundry sim-model`, one tool call per sample) runs in its own process; each
run is a fresh `hermes-batch` process with the local (bubblewrap) sandbox backend. Figures, each
printed with its target:
- efficiency = ideal wall ÷ actual wall, ideal = calls per sample × latency × ceil(samples ÷ sessions)
  (the endpoint bound), for 4 sessions × 200 samples and 64 × 2,000;
- orchestrator CPU seconds per sample: the command's whole process tree, sandboxes and their commands
  included, from cgroup accounting (harness.CpuMeter; getrusage misses the commands a sandbox's
  pid 1 lets the kernel reap, and is printed beside it);
- 256 × 4,000: throughput against the lower of the endpoint bound and the CPU bound
  (samples × CPU per sample ÷ cores), and which one binds;
- start-up (command → first model request) and a resume with nothing to do;
- a 100,000-row dataset validated, keyed, batched and planned (`--plan_only`): the first time, again
  unchanged, and again after one more row; wall and peak RSS;
- Dagster bookkeeping: time spent writing events ÷ wall, in the 2,000-sample run;
- `--realistic`: 1,024 sessions × 10,000 samples at 5 s per call (ideal 100 s) on an endpoint of its
  own: efficiency, CPU per sample, the peak PSS of the whole process tree (every process under the
  command, sandboxes and workers included, sampled every 2 s) and memory per live session =
  (peak − idle) ÷ sessions, idle being the same command resuming with nothing to do.
  `bench/sim_capacity.py` checks the endpoint alone serves that many concurrent calls.
`--quick` skips the two largest runs; `--repeat N` runs each configuration N times and keeps the
median wall; `--profile` also records a py-spy profile (GIL holders) of the 64-session run into
bench/results/. Results are written to bench/results/throughput.txt.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from harness import BIN, Endpoint, Measured, batch_env, require_bwrap, run_measured, write_prompts  # noqa: E402
from tree_memory import TreePss  # noqa: E402

CALLS_PER_SAMPLE = 2  # one tool round, then the answer
RESULTS = Path(__file__).parent / "results"
TIMED_BATCH = Path(__file__).with_name("timed_batch.py")
REALISTIC = {"sessions": 1024, "samples": 10_000, "latency": 5.0}  # ideal wall 2 × 5 s × 10 rounds = 100 s
PSS_INTERVAL_S = 2.0  # a sample of ~2,000 processes costs ~0.1 CPU-s, taken from the run it measures
IDLE_PSS_INTERVAL_S = 0.05
PSS_TARGET_MB = 1024  # 1 GB


class Report:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def figure(self, name: str, value: float, fmt: str, target: float, higher_is_better: bool, note: str = "") -> None:
        ok = value >= target if higher_is_better else value <= target
        line = (f"{name:<46} {value:{fmt}}   target {'≥' if higher_is_better else '≤'} {target:{fmt}}   "
                f"{'ok' if ok else 'MISSED'}{'   ' + note if note else ''}")
        self.say(line)

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.lines.append(line)


def batch_argv(dataset: Path, run: str, endpoint: Endpoint, sessions: int, batch_size: int,
               timed: bool = False) -> list[str]:
    command = [sys.executable, str(TIMED_BATCH)] if timed else [str(BIN / "hermes-batch")]
    return [*command, f"--dataset_file={dataset}", f"--run_name={run}", f"--base_url={endpoint.base_url}",
            "--distribution=terminal_only", f"--num_workers={sessions}", f"--batch_size={batch_size}"]


def endpoint_run(report: Report, workdir: Path, endpoint: Endpoint, sessions: int, samples: int,
                 latency: float, repeat: int, timed: bool = False) -> tuple[Measured, dict]:
    """`repeat` fresh runs; the one with the median wall is reported (this VM's walls vary by ±10%)."""
    runs = sorted((one_run(report, workdir, endpoint, sessions, samples, latency, attempt, timed)
                   for attempt in range(repeat)), key=lambda run: run[0].wall)
    return runs[len(runs) // 2]


def one_run(report: Report, workdir: Path, endpoint: Endpoint, sessions: int, samples: int, latency: float,
            attempt: int, timed: bool, pss_interval: float = 0.0, check: bool = True) -> tuple[Measured, dict]:
    dataset = write_prompts(workdir / f"prompts-{samples}.jsonl", samples)
    env = batch_env(workdir)
    if timed:
        env["HERMES_BENCH_EVENTS"] = str(workdir / f"events-{attempt}.json")
    before, endpoint_cpu = endpoint.log()["requests"], endpoint.cpu_seconds()
    run_name = f"s{sessions}x{samples}r{attempt}"
    measured = run_measured(batch_argv(dataset, run_name, endpoint, sessions,
                                       batch_size=max(10, samples // 20), timed=timed), env, pss_interval, check)
    log = endpoint.log(since=measured.started)
    calls = log["requests"] - before
    ideal = (calls / samples) * latency * math.ceil(samples / sessions)
    figures = {"calls_per_sample": calls / samples, "ideal": ideal, "efficiency": ideal / measured.wall,
               "cpu_per_sample": measured.cpu / samples, "startup": log["first_at"] - measured.started,
               "endpoint_cpu": endpoint.cpu_seconds() - endpoint_cpu, "dataset": dataset, "env": env,
               "run_name": run_name, "events": env.get("HERMES_BENCH_EVENTS"), "max_in_flight": log["max_in_flight"]}
    report.say(f"-- {sessions} sessions × {samples} samples: wall {measured.wall:.1f} s, ideal {ideal:.1f} s, "
               f"{calls / samples:.2f} calls/sample, orchestrator CPU {measured.cpu:.1f} s (getrusage alone: "
               f"{measured.rusage_cpu:.1f}), endpoint CPU {figures['endpoint_cpu']:.1f} s, peak RSS "
               f"{measured.max_rss_mb:.0f} MB")
    return measured, figures


def new_home(report: Report, workdir: Path, endpoint: Endpoint) -> None:
    """The first command on a brand-new Dagster home (8 samples) creates the instance's SQLite storage,
    once per home: said apart, so that the start-up figure is that of a user's usual command."""
    dataset = write_prompts(workdir / "prompts-8.jsonl", 8)
    measured = run_measured(batch_argv(dataset, "newhome", endpoint, 4, 10), batch_env(workdir))
    report.say(f"   first command on a brand-new Dagster home (creates its storage): first model request after "
               f"{endpoint.log(since=measured.started)['first_at'] - measured.started:.2f} s")


def small_run(report: Report, workdir: Path, endpoint: Endpoint, latency: float, repeat: int) -> float:
    """4 × 200, start-up and an empty resume; returns the fixed CPU of a command that runs its
    Dagster phases (the same resume with its settled.json removed)."""
    measured, f = endpoint_run(report, workdir, endpoint, 4, 200, latency, repeat)
    report.figure("efficiency, 4 sessions × 200 samples", f["efficiency"], ".2f", 0.90, True)
    report.figure("start-up: command → first model request (s)", f["startup"], ".2f", 1.5, False)
    before = endpoint.log()["requests"]
    argv = batch_argv(f["dataset"], f["run_name"], endpoint, 4, 10)
    resume = run_measured(argv, f["env"])
    sent = endpoint.log()["requests"] - before
    report.figure("resume with nothing to do (s)", resume.wall, ".2f", 2.0, False,
                  f"{sent} requests sent, {resume.cpu:.1f} CPU-s (a settled run: no Dagster run)")
    # A run's CPU is a fixed part (imports, the Dagster instance and its two runs, checks: what a
    # resume taking the full path costs) plus a part per sample; 200 samples do not amortize the
    # fixed part (the all-in target is at 2,000).
    (Path(f["env"]["HERMES_DATA_DIR"]) / f["run_name"] / "settled.json").unlink()
    full = run_measured(argv, f["env"])
    report.say(f"   resume through Dagster's two runs (settled.json removed): {full.wall:.2f} s, "
               f"{full.cpu:.1f} CPU-s: the fixed part of a command")
    report.say(f"   orchestrator CPU s/sample (4 × 200), all in: {f['cpu_per_sample']:.4f}")
    report.figure("CPU s/sample beyond the fixed part (4 × 200)", (measured.cpu - full.cpu) / 200, ".4f", 0.01,
                  False)
    return full.cpu


def medium_run(report: Report, workdir: Path, endpoint: Endpoint, latency: float, repeat: int,
               fixed_cpu: float) -> None:
    measured, f = endpoint_run(report, workdir, endpoint, 64, 2000, latency, repeat, timed=True)
    events = json.loads(Path(f["events"]).read_text())
    report.figure("efficiency, 64 sessions × 2,000 samples", f["efficiency"], ".2f", 0.90, True)
    report.figure("CPU s/sample all in (64 × 2,000)", f["cpu_per_sample"], ".4f", 0.008, False,
                  "the whole command's tree, start-up included")
    report.figure("CPU s/sample beyond the fixed part (64 × 2,000)", (measured.cpu - fixed_cpu) / 2000, ".4f",
                  0.01, False, f"fixed part {fixed_cpu:.1f} CPU-s (a resume through Dagster's runs)")
    report.figure("Dagster bookkeeping ÷ wall (64 × 2,000)", events["seconds"] / measured.wall, ".3f", 0.05, False,
                  f"{events['events']} events, {events['seconds']:.2f} s")


def large_run(report: Report, workdir: Path, endpoint: Endpoint, latency: float, repeat: int) -> None:
    measured, f = endpoint_run(report, workdir, endpoint, 256, 4000, latency, repeat)
    cores = os.cpu_count() or 1
    # Whichever bound is the longer binds: with 256 sessions at 0.5 s the endpoint could finish in
    # 16 s, but the CPU for 4,000 samples, spread over every core, may take longer. The simulated
    # endpoint runs on the same cores (a real one would not), so its CPU is in the bound too.
    own_bound = measured.cpu / cores
    cpu_bound = (measured.cpu + f["endpoint_cpu"]) / cores
    binding, why = (("CPU", "the CPU for 4,000 samples (orchestrator and simulated endpoint) over the cores "
                            "outlasts the endpoint's rounds") if cpu_bound > f["ideal"] else
                    ("endpoint", "the endpoint's rounds outlast the CPU over the cores"))
    report.figure("256 × 4,000: binding bound ÷ actual wall", max(cpu_bound, f["ideal"]) / measured.wall, ".2f", 0.85,
                  True, f"{binding} bound binds: {why} (endpoint {f['ideal']:.1f} s; CPU {cpu_bound:.1f} s on "
                        f"{cores} cores, of which the orchestrator's alone {own_bound:.1f} s)")


def realistic_run(report: Report, workdir: Path, sessions: int, samples: int, latency: float) -> None:
    """The realistic run: many sessions at a hosted endpoint's latency, on its own endpoint (so its
    request log is this run's alone), with the whole tree's PSS sampled every PSS_INTERVAL_S.
    $HERMES_TERMINAL_BACKEND=plain runs it without sandboxes (what they cost)."""
    workdir = workdir / "realistic"  # its own endpoint port file, dataset and data folder
    workdir.mkdir()
    endpoint = Endpoint(latency, workdir)
    try:
        report.say(f"# realistic: {sessions} sessions × {samples:,} samples at {latency:g} s per call, sandbox "
                   f"backend {os.environ.get('HERMES_TERMINAL_BACKEND') or 'local (default)'}")
        # A few failed samples out of 10,000 (exit status 1) do not void the figures: said below.
        measured, f = one_run(report, workdir, endpoint, sessions, samples, latency, 0, False, PSS_INTERVAL_S,
                              check=False)
        # Idle: the same command resuming that run with nothing to do (imports, Dagster, the ledger
        # read back; no session), so peak − idle is what the live sessions cost.
        # It takes a second or two and has few processes: sampled finely. (A failed sample, if any, runs again in it.)
        idle = run_measured(batch_argv(f["dataset"], f["run_name"], endpoint, sessions, samples // 20), f["env"],
                            IDLE_PSS_INTERVAL_S, check=False)
    finally:
        endpoint.close()
    peak, idle_mb = _pss(measured), _pss(idle)
    failed = re.search(r"failed: retryable (\d+).*?terminal (\d+)", measured.output)
    if measured.returncode:
        report.say(f"   the run exited with status {measured.returncode}"
                   + (f": {failed[1]} retryable and {failed[2]} terminal sample failures" if failed else ""))
    if tools := re.search(r"^\s+terminal\s+(\d+)\s+(\d+)\s+(\d+)", measured.output, re.MULTILINE):
        report.say(f"   sandboxed commands: {tools[1]}, of which {tools[3]} failed")
    cores = os.cpu_count() or 1
    cpu_bound = (measured.cpu + f["endpoint_cpu"]) / cores  # the simulated endpoint shares the cores
    report.figure(f"efficiency, {sessions:,} sessions × {samples:,} at {latency:g} s", f["efficiency"], ".2f", 0.90,
                  True, f"endpoint answered at most {f['max_in_flight']} calls at once; CPU bound {cpu_bound:.0f} s "
                        f"(orchestrator and simulated endpoint over {cores} cores) against the ideal {f['ideal']:.0f} s")
    report.figure(f"CPU s/sample all in ({sessions:,} × {samples:,})", f["cpu_per_sample"], ".4f", 0.010, False,
                  f"{measured.cpu:.0f} CPU-s, start-up included")
    report.figure("peak PSS of the whole tree (MB)", peak.peak_mb, ".0f", PSS_TARGET_MB, False,
                  f"{peak.peak_processes} processes at most ({peak.unreadable} exiting), {peak.samples} samples, "
                  f"sampler {peak.cpu_seconds:.1f} CPU-s")
    per_session = (peak.peak_mb - idle_mb.peak_mb) / sessions
    report.figure("memory per live session (MB)", per_session, ".2f", (PSS_TARGET_MB - idle_mb.peak_mb) / sessions,
                  False, f"(peak − idle {idle_mb.peak_mb:.0f} MB: an empty resume, {idle.wall:.1f} s, exit status "
                         f"{idle.returncode}) ÷ {sessions:,}; target = what 1 GB leaves")


def _pss(measured: Measured) -> TreePss:
    assert measured.pss is not None
    return measured.pss


def planning(report: Report, workdir: Path) -> None:
    dataset = write_prompts(workdir / "prompts-100k.jsonl", 100_000,
                            "Task {i}: write a function that returns the {i}th prime number, with tests")
    argv = [str(BIN / "hermes-batch"), f"--dataset_file={dataset}", "--run_name=plan100k",
            "--base_url=http://127.0.0.1:9/v1", "--distribution=default", "--plan_only"]
    first = run_measured(argv, batch_env(workdir))
    again = run_measured(argv, batch_env(workdir))
    with open(dataset, "a") as handle:  # planned again in full: the dataset is validated and keyed again
        handle.write('{"prompt": "one more row"}\n')
    grown = run_measured(argv, batch_env(workdir))
    report.figure("100k rows planned, first time (s)", first.wall, ".2f", 3.0, False)
    report.figure("100k rows planned, resume (s)", again.wall, ".2f", 3.0, False, "(unchanged: the saved plan)")
    report.figure("100k rows planned after one more row (s)", grown.wall, ".2f", 3.0, False)
    report.figure("100k rows planned: peak RSS (MB)", max(first.max_rss_mb, again.max_rss_mb, grown.max_rss_mb),
                  ".0f", 1024, False)


def profile(report: Report, workdir: Path, endpoint: Endpoint) -> None:
    """py-spy, GIL holders only (what the orchestrator's own Python costs), 64 × 2,000."""
    dataset = write_prompts(workdir / "prompts-profile.jsonl", 2000)
    raw = RESULTS / "profile-64x2000.txt"
    subprocess.run([str(BIN / "py-spy"), "record", "--gil", "-r", "100", "--format", "raw", "-o", str(raw), "--",
                    *batch_argv(dataset, "profiled", endpoint, 64, 100)], env=batch_env(workdir), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    top = summarize_profile(raw)
    (RESULTS / "profile-64x2000-top.txt").write_text(top)
    report.say(f"profile: {raw} (collapsed stacks), summary in profile-64x2000-top.txt")


def _frame_name(frame: str) -> str:
    """py-spy's "function (path/to/file.py:line)" as "function file.py"."""
    match = re.match(r"^(.*) \((?:.*/)?([^/:]+)(?::\d+)?\)$", frame)
    return f"{match[1]} {match[2]}" if match else frame


def summarize_profile(raw: Path, rows: int = 40) -> str:
    """Share of GIL-holding samples under each function (inclusive), largest first."""
    inclusive: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        total += int(count)
        for frame in {_frame_name(frame) for frame in stack.split(";")[1:]}:
            inclusive[frame] = inclusive.get(frame, 0) + int(count)
    ranked = sorted(inclusive.items(), key=lambda item: -item[1])[:rows]
    return f"{total} samples at 100 Hz\n" + "".join(f"{count / total:6.1%}  {name}\n" for name, count in ranked)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, default=0.5, help="seconds per model call (default 0.5)")
    parser.add_argument("--quick", action="store_true", help="skip the 64 × 2,000 and 256 × 4,000 runs")
    parser.add_argument("--profile", action="store_true", help="also profile the 64-session run with py-spy")
    parser.add_argument("--repeat", type=int, default=1, help="runs per configuration; the median wall is kept")
    parser.add_argument("--realistic", action="store_true", help="also run 1,024 sessions × 10,000 samples at 5 s "
                        "per call (~2.5 min), with the tree's PSS")
    parser.add_argument("--realistic_only", action="store_true", help="only the realistic run")
    args = parser.parse_args()
    require_bwrap("the runs use the local sandbox backend")
    report = Report()
    report.say(f"# hermes-foundry throughput, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="hermes-bench-") as tmp:
        workdir = Path(tmp)
        if not args.realistic_only:
            latency_runs(report, workdir, args)
        if args.realistic or args.realistic_only:
            realistic_run(report, workdir, **REALISTIC)
    if not args.quick or args.realistic_only:
        RESULTS.mkdir(exist_ok=True)
        name = "realistic.txt" if args.realistic_only else "throughput.txt"
        (RESULTS / name).write_text("\n".join(report.lines) + "\n")


def latency_runs(report: Report, workdir: Path, args: argparse.Namespace) -> None:
    """The runs at `--latency` (0.5 s) on one endpoint, and the 100k-row plan."""
    report.say(f"# latency {args.latency:g} s per call")
    endpoint = Endpoint(args.latency, workdir)
    try:
        new_home(report, workdir, endpoint)
        fixed_cpu = small_run(report, workdir, endpoint, args.latency, args.repeat)
        if not args.quick:
            medium_run(report, workdir, endpoint, args.latency, args.repeat, fixed_cpu)
            large_run(report, workdir, endpoint, args.latency, args.repeat)
        planning(report, workdir)
        if args.profile:
            RESULTS.mkdir(exist_ok=True)
            profile(report, workdir, endpoint)
    finally:
        endpoint.close()


if __name__ == "__main__":
    main()
