"""Scored groups and their ledger: resumed by content key, over worker processes as over one."""

from __future__ import annotations

import json

import pytest

from batch_runs import Sent
from hermes_core.config import Endpoint
from hermes_core.environments.env_run import EnvRun, run_tasks


@pytest.mark.parametrize("processes", ["1", "2"])
def test_groups_land_once_and_a_second_pass_sends_nothing(tmp_path, sim_server, tokenizer_cache, monkeypatch,
                                                           processes):
    monkeypatch.setenv("HERMES_WORKER_PROCESSES", processes)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "prompt": f"{processes} {tmp_path.name} task {i} run it "
                                         f"[sim:command=echo {i} > a.txt]",
                                         "verifier": {"type": "file_equals", "path": "a.txt", "content": "2",
                                                      "strip": True}}) + "\n" for i in range(4)))
    run = EnvRun(env_name="g", tasks_file=str(tasks), model="hermes-sim", group_size=2, groups_per_task=2,
                 concurrency=2, tokenizer=str(next(p for p in tokenizer_cache.iterdir() if not p.name.startswith("."))))
    endpoint = Endpoint(sim_server.base_url, "k", "hermes-sim")
    sent = Sent(sim_server)
    assert run_tasks(run, tmp_path, run.tasks().tasks, endpoint) == {"run": 8, "skipped": 0, "failed": 0}
    assert sum(sent.counts().values()) == 16  # 4 tasks x 2 groups x 2 rollouts
    records = run.current_records(tmp_path, run.tasks().tasks)
    assert [(r["task_id"], r["group"]) for r in records] == [(f"t{i}", g) for i in range(4) for g in range(2)]
    assert [r["scores"] for r in records if r["task_id"] == "t2"] == [[1.0, 1.0], [1.0, 1.0]]
    sent = Sent(sim_server)
    assert run_tasks(run, tmp_path, run.tasks().tasks, endpoint) == {"run": 0, "skipped": 8, "failed": 0}
    assert sent.counts() == {}
