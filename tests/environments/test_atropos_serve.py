"""`hermes-foundry env serve` against a real Atropos API server (`run-api` on 127.0.0.1) and a test
trainer: batches of exactly batch_size sequences arrive, and the environment stops at its step count."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from procs import free_port, wait_until

pytest.importorskip("atroposlib", reason="the atropos extra (make test installs it)")
from atroposlib.api.server import ScoredData  # noqa: E402

BATCH_SIZE, GROUP_SIZE, STEPS = 4, 2, 2
VENV_BIN = Path(sys.executable).parent


@pytest.fixture()
def run_api():
    port = free_port()
    server = subprocess.Popen([str(VENV_BIN / "run-api"), "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/status", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        assert wait_until(up, timeout=30), "run-api did not start"
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=10)


def test_serve_feeds_a_trainer_exact_batches_then_stops_at_its_steps(tmp_path, sim_url, run_api, tokenizer_cache):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "answer", "prompt": "run it [sim:command=echo 42 > answer.txt]",
                                 "verifier": {"type": "file_equals", "path": "answer.txt", "content": "42\n"}}) + "\n")
    registered = httpx.post(f"{run_api}/register", json={
        "wandb_group": "test", "wandb_project": "test", "batch_size": BATCH_SIZE, "max_token_len": 8192,
        "checkpoint_dir": "", "save_checkpoint_interval": -1, "starting_step": 0, "num_steps": STEPS}).json()
    assert "uuid" in registered
    assert httpx.get(f"{run_api}/batch").json() == {"batch": None}  # the trainer has started, nothing queued yet
    env = subprocess.Popen(
        [str(VENV_BIN / "hermes-foundry"), "env", "serve", "--tasks", str(tasks), "--base_url", sim_url,
         "--model", "hermes-sim", "--api_url", run_api, "--steps", str(STEPS), "--group_size", str(GROUP_SIZE),
         "--distribution", "balanced", "--seed", "5", "--keep_equal_scores"],
        env={**os.environ, "HERMES_CACHE_DIR": str(tokenizer_cache.parent)}, cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    batches, deadline = [], time.monotonic() + 120
    try:
        while len(batches) < STEPS and time.monotonic() < deadline:
            batch = httpx.get(f"{run_api}/batch").json()["batch"]
            if batch is None:
                time.sleep(0.5)
                continue
            batches.append(batch)
        assert len(batches) == STEPS
        for batch in batches:
            assert sum(len(group["tokens"]) for group in batch) == BATCH_SIZE
            for group in batch:
                ScoredData(**group)
                assert group["group_overrides"]["task_id"] == "answer"
        assert env.wait(timeout=60) == 0  # it stopped by itself once the trainer reached its steps
    finally:
        if env.poll() is None:
            os.killpg(env.pid, signal.SIGKILL)
            print(env.communicate()[0].decode(errors="replace")[-3000:])
