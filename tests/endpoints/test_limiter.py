"""One cap on requests in flight per endpoint, across concurrent runs (counted at the simulated
endpoint), and the adaptive window that a 429 halves and successes grow back."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from hermes_assets.instance import get_instance
from hermes_core import AIAgent
from hermes_core.endpoints.limiter import RequestLimiter
from hermes_core.endpoints.simulated import SimulatedModelServer

HERMES_BATCH = str(Path(sys.executable).with_name("hermes-batch"))


def test_two_concurrent_runs_never_exceed_the_endpoint_cap(isolated_homes, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HERMES_LIMITS_DIR", str(tmp_path / "limits"))
    dataset = tmp_path / "d.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"Run a command that prints {i}"}) + "\n" for i in range(12)))
    get_instance().get_runs(limit=1)  # an instance in use already (two first-ever runs would race to create it)
    with SimulatedModelServer(latency=0.2) as sim:
        runs = [subprocess.Popen([HERMES_BATCH, f"--dataset_file={dataset}", f"--run_name=cap{n}", "--api_key=k",
                                  f"--base_url={sim.base_url}", "--distribution=terminal_only", "--num_workers=4",
                                  "--max_concurrent_requests=3"], env=os.environ.copy(),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for n in (1, 2)]
        errors = [run.communicate(timeout=240)[1] for run in runs]
        assert [run.returncode for run in runs] == [0, 0], errors
        assert sim.log.requests == 48  # 2 runs x 12 samples x 2 calls
        assert 2 <= sim.log.max_in_flight <= 3  # 8 sessions in all, never more than 3 requests at once


def test_a_429_halves_the_window_and_successes_grow_it_back(tmp_path: Path) -> None:
    limiter = RequestLimiter("http://127.0.0.1:9/v1", 8, tmp_path)
    limiter.in_flight = 8
    limiter.rate_limited()
    assert limiter.window == 4.0
    limiter.in_flight = 0
    for _ in range(40):
        limiter.succeeded()
    assert limiter.window == 8.0
    unlimited = RequestLimiter("http://127.0.0.1:9/v1", 0)
    unlimited.in_flight = 6
    unlimited.rate_limited()
    assert unlimited.window == 3.0 and not math.isinf(unlimited.window)


def test_the_model_client_slows_down_on_429_and_retries(sim_url: str, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HERMES_LIMITS_DIR", str(tmp_path / "limits"))
    monkeypatch.setenv("HERMES_MAX_CONCURRENT_REQUESTS", "5")
    agent = AIAgent(model="hermes-sim", base_url=sim_url, api_key="k", quiet_mode=True, enabled_toolsets=[],
                    backoff_base_s=0.01)
    result = agent.run_conversation("Say hello [sim:rate-limit=1]")
    assert result["completed"] and not result["failed"]
    assert RequestLimiter.shared(sim_url.rstrip("/"), 5).window < 5  # halved by the 429, not yet grown back
