"""An environment run in Dagster: its asset group from the runs file, scored rollouts partitioned by
task and resumed by content key (the endpoint counts what each materialization sent), the evaluation's
metadata, and a failed blocking check that stops the SFT export."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import dagster as dg
import pytest

from batch_runs import Sent
from hermes_assets.definitions import build_definitions
from hermes_core.config import data_root
from procs import wait_until

pytest.importorskip("atroposlib", reason="the atropos extra (make test installs it)")
NAME = "rl"


def key(name: str) -> dg.AssetKey:
    return dg.AssetKey([NAME, name])


@pytest.fixture()
def environment(isolated_homes, sim_server, tokenizer_cache):
    root = data_root()
    root.mkdir(parents=True)
    tag = uuid.uuid4().hex[:6]
    tasks = [{"id": "right", "category": "files", "prompt": f"{tag} run it [sim:command=echo 42 > a.txt]",
              "verifier": {"type": "file_equals", "path": "a.txt", "content": "42", "strip": True}},
             {"id": "wrong", "category": "files", "prompt": f"{tag} run it [sim:command=echo 41 > a.txt]",
              "verifier": {"type": "file_equals", "path": "a.txt", "content": "42", "strip": True}},
             {"id": "shell", "category": "shell", "prompt": f"{tag} run it [sim:command=true]",
              "verifier": {"type": "command", "command": "true"}}]
    (root / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    tokenizer = next(p for p in tokenizer_cache.iterdir() if not p.name.startswith("."))
    (root / "runs.yaml").write_text(
        f"- env_name: {NAME}\n  tasks_file: tasks.jsonl\n  model: hermes-sim\n  base_url: {sim_server.base_url}\n"
        f"  group_size: 2\n  tokenizer: {tokenizer}\n")
    return root, {t["id"]: t["prompt"] for t in tasks}


def materialize(defs, selection, **kwargs):
    return dg.materialize(list(defs.assets) + list(defs.asset_checks or []), instance=dg.DagsterInstance.get(),
                          resources=defs.resources, selection=selection, **kwargs)


def test_an_environment_run_resumes_by_task_and_its_evaluation_equals_its_groups(environment, sim_server):
    root, prompts = environment
    defs = build_definitions(root)
    instance = dg.DagsterInstance.get()
    assert materialize(defs, [f"{NAME}/task_set"]).success
    assert instance.get_dynamic_partitions(f"{NAME}__tasks") == ["right", "wrong", "shell"]

    sent = Sent(sim_server)
    assert materialize(defs, [f"{NAME}/scored_rollouts"], partition_key="right").success
    assert sent.counts() == {prompts["right"]: 2}  # one group of two rollouts

    sent = Sent(sim_server)  # every task now: only the two that are not done are paid for
    assert materialize(defs, [f"{NAME}/scored_rollouts"], tags={"dagster/asset_partition_range_start": "right",
                                                                "dagster/asset_partition_range_end": "shell"}).success
    assert sent.counts() == {prompts["wrong"]: 2, prompts["shell"]: 2}
    assert instance.get_materialized_partitions(key("scored_rollouts")) == {"right", "wrong", "shell"}

    sent = Sent(sim_server)
    result = materialize(defs, [f"{NAME}/evaluation", f"{NAME}/sft_rows"])
    assert result.success and sent.counts() == {}
    groups = [json.loads(line) for line in (root / NAME / "groups.jsonl").read_text().splitlines()]
    assert {g["task_id"]: g["scores"] for g in groups} == {"right": [1.0, 1.0], "wrong": [0.0, 0.0],
                                                            "shell": [1.0, 1.0]}
    shown = instance.get_latest_materialization_event(key("evaluation")).asset_materialization.metadata
    assert shown["groups"].value == 3 and shown["rollouts"].value == 6
    assert shown["pass_rate"].value == pytest.approx(4 / 6, abs=1e-4) and shown["zero_variance_groups"].value == 3
    assert shown["categories"].value == {"files": {"groups": 2, "pass_rate": 0.5, "mean_reward": 0.5, "std_reward": 0.5},
                                         "shell": {"groups": 1, "pass_rate": 1.0, "mean_reward": 1.0, "std_reward": 0.0}}
    assert shown["splits"].value == {"train": {"groups": 3, "pass_rate": 0.6667, "mean_reward": 0.6667,
                                               "std_reward": 0.4714}}
    rows = [json.loads(line) for line in (root / NAME / "sft.jsonl").read_text().splitlines()]
    assert [(r["task_id"], r["reward"], r["member"], r["run_name"], r["model"]) for r in rows] == [
        ("right", 1.0, 0, NAME, "hermes-sim"), ("shell", 1.0, 0, NAME, "hermes-sim")]
    assert rows[0]["conversations"][1] == {"from": "human", "value": prompts["right"]}
    assert rows[0]["messages"][0]["content"] == prompts["right"] and rows[0]["messages"][1]["tool_calls"]
    assert "terminal" in {tool["function"]["name"] for tool in json.loads(rows[0]["tools"])}
    import datasets

    loaded = datasets.load_dataset("json", data_files=str(root / NAME / "sft.jsonl"), split="train")
    assert loaded.num_rows == 2 and {"conversations", "messages", "tools", "reward", "task_id"} <= set(loaded.column_names)

    # The rows feed the batch runs' exports: an HF dataset + card and TRL messages, lineage in each row.
    assert materialize(defs, [f"{NAME}/hf_dataset", f"{NAME}/trl_messages"]).success and sent.counts() == {}
    exported = datasets.load_from_disk(str(root / NAME / "hf"))
    lineage = [json.loads(extra) for extra in exported["extra"]]
    assert [(x["task_id"], x["reward"], x["group"]) for x in lineage] == [("right", 1.0, 0), ("shell", 1.0, 0)]
    assert [m["run_name"] for m in exported["metadata"]] == [NAME, NAME]
    assert exported[0]["conversations"] == rows[0]["conversations"] and exported[0]["sample_key"] == lineage[0]["rollout_key"]
    card = (root / NAME / "hf" / "README.md").read_text()
    assert "Reward-filtered best-of-N" in card and "SIMULATED" in card and "| 3 | 6 | 0.6667 |" in card
    messages = [json.loads(line) for line in (root / NAME / "trl" / "messages.jsonl").read_text().splitlines()]
    assert [m["messages"][0]["content"] for m in messages] == [prompts["right"], prompts["shell"]]
    assert messages[0]["messages"][1]["tool_calls"][0]["function"]["name"] == "terminal"
    shown = instance.get_latest_materialization_event(key("hf_dataset")).asset_materialization.metadata
    assert shown["dagster/row_count"].value == 2
    from hermes_core.exports import export_main  # and from the CLI: `hermes-foundry export --run_name rl`

    assert export_main(["--run_name", NAME, "--output_dir", str(root), "--format", "parquet"]) == 0
    assert datasets.load_dataset("parquet", data_files=str(root / NAME / "trajectories.parquet"), split="train").num_rows == 2


def test_a_failed_blocking_check_stops_the_sft_export(environment, sim_server):
    root, _ = environment
    defs = build_definitions(root)
    assert materialize(defs, [f"{NAME}/task_set"]).success
    assert materialize(defs, [f"{NAME}/scored_rollouts"], partition_key="right").success
    ledger = root / NAME / "groups.jsonl"
    record = json.loads(ledger.read_text().splitlines()[0])
    record["masks"][0] = record["masks"][0][:-1]  # one mask entry short: a trainer would misalign
    with ledger.open("a") as handle:
        handle.write(json.dumps(record) + "\n")
    result = materialize(defs, [f"{NAME}/evaluation", f"{NAME}/sft_rows"], raise_on_error=False)
    assert not result.success
    [check] = [e for e in result.get_asset_check_evaluations() if e.check_name == "groups_aligned"]
    assert not check.passed and "right group 0: sequence 0" in check.metadata["first"].value
    assert not (root / NAME / "sft.jsonl").exists()
    assert dg.DagsterInstance.get().get_latest_materialization_event(key("sft_rows")) is None


def test_a_bad_environment_entry_is_reported_on_itself_and_the_others_load(isolated_homes, sim_server):
    root = data_root()
    root.mkdir(parents=True)
    (root / "tasks.jsonl").write_text(json.dumps({"id": "a", "prompt": "p", "verifier": {"type": "command",
                                                                                      "command": "true"}}) + "\n")
    (root / "runs.yaml").write_text(
        "- env_name: good\n  tasks_file: tasks.jsonl\n  model: m\n"
        "- env_name: bad\n  tasks_file: tasks.jsonl\n  model: m\n  group_sise: 2\n"
        "- env_name: small\n  tasks_file: tasks.jsonl\n  model: m\n  group_size: 0\n")
    defs = build_definitions(root)
    keys = {asset_key.to_user_string() for a in defs.assets for asset_key in a.keys}
    assert {"good/task_set", "good/scored_rollouts", "good/evaluation", "good/sft_rows"} <= keys
    assert {"bad/declaration", "small/declaration"} <= keys and "bad/task_set" not in keys
    [bad] = [a for a in defs.assets if dg.AssetKey(["bad", "declaration"]) in a.keys]
    problem = bad.specs_by_key[dg.AssetKey(["bad", "declaration"])].metadata["problem"].value
    assert "entry #2" in problem and "unknown setting 'group_sise'" in problem
    [small] = [a for a in defs.assets if dg.AssetKey(["small", "declaration"]) in a.keys]
    assert "group_size must be a whole number ≥ 1" in small.specs_by_key[dg.AssetKey(["small", "declaration"])].metadata["problem"].value


def test_killed_mid_way_and_materialized_again_it_sends_only_the_unfinished_groups(environment, sim_server,
                                                                                    tmp_path):
    root, prompts = environment
    runs = (root / "runs.yaml").read_text()
    slow = runs.replace("  group_size: 2\n", "  group_size: 2\n  concurrency: 1\n")  # one group at a time
    (root / "runs.yaml").write_text(slow)
    tasks = (root / "tasks.jsonl").read_text().replace("[sim:command=true]", "[sim:command=true] [sim:latency=3]")
    (root / "tasks.jsonl").write_text(tasks)
    prompts["shell"] += " [sim:latency=3]"
    defs = build_definitions(root)
    assert materialize(defs, [f"{NAME}/task_set"]).success
    ledger = root / NAME / "groups.jsonl"
    sent = Sent(sim_server)
    worker = subprocess.Popen([str(Path(sys.executable).with_name("dagster")), "asset", "materialize", "-m",
                               "hermes_assets.definitions", "--select", f"{NAME}/scored_rollouts",
                               "--partition-range", "right...shell"], cwd=tmp_path, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:  # killed while the slow third task is being rolled out, after the first two groups landed
        assert wait_until(lambda: ledger.is_file() and len(ledger.read_text().splitlines()) == 2, timeout=120)
        assert wait_until(lambda: sent.counts()[prompts["shell"]] == 2, timeout=30)
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
    assert {json.loads(line)["task_id"] for line in ledger.read_text().splitlines()} == {"right", "wrong"}
    sent = Sent(sim_server)
    assert materialize(defs, [f"{NAME}/scored_rollouts"], tags={"dagster/asset_partition_range_start": "right",
                                                                "dagster/asset_partition_range_end": "shell"}).success
    assert sent.counts() == {prompts["shell"]: 2}  # the finished groups are not paid for again
    assert len(ledger.read_text().splitlines()) == 3
