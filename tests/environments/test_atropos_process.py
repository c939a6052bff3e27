"""`hermes-foundry env process` on the simulated model: atroposlib's own ScoredData validates every
group, rewards follow the scripted outcomes, masks cover exactly the assistant turns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermes_assets.foundry_cli import foundry_main
from hermes_core.environments.tokens import IGNORE, trained_spans

pytest.importorskip("atroposlib", reason="the atropos extra (make test installs it)")
from atroposlib.api.server import ScoredData  # noqa: E402


@pytest.fixture()
def cache(tokenizer_cache):
    return tokenizer_cache.parent  # $HERMES_CACHE_DIR: its tokenizers/ folder is the session's


def tasks_file(tmp_path):
    rows = [{"id": "answer", "prompt": "run it [sim:command=echo 42 > answer.txt]", "category": "files",
             "verifier": {"type": "file_equals", "path": "answer.txt", "content": "42", "strip": True}},
            {"id": "nothing", "prompt": "run it [sim:command=true]", "category": "files",
             "verifier": {"type": "file_contains", "path": "answer.txt", "text": "42"}},
            {"id": "held-out", "prompt": "run it [sim:command=echo 42 > answer.txt]", "split": "eval", "category": "files",
             "verifier": {"type": "file_equals", "path": "answer.txt", "content": "42", "strip": True}}]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def run(tmp_path, sim_url, monkeypatch, cache, *extra):
    monkeypatch.setenv("HERMES_CACHE_DIR", str(cache))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.chdir(tmp_path)
    return foundry_main(["env", *extra[:1], "--tasks", str(tasks_file(tmp_path)), "--base_url", sim_url,
                         "--model", "hermes-sim", *extra[1:]])


def test_process_writes_groups_that_atroposlib_accepts_with_the_scripted_rewards(tmp_path, sim_url, monkeypatch, cache):
    from transformers import AutoTokenizer

    # balanced: each member draws its toolsets; only members given the terminal run the command.
    assert run(tmp_path, sim_url, monkeypatch, cache, "process", "--groups", "2", "--group_size", "4",
               "--distribution", "balanced", "--seed", "5", "--keep_equal_scores", "--out", "groups.jsonl") == 0
    groups = [json.loads(line) for line in (tmp_path / "groups.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in (tmp_path / "groups.sharegpt.jsonl").read_text().splitlines()]
    assert [g["group_overrides"]["task_id"] for g in groups] == ["answer", "nothing"]
    assert len(rows) == 8 and {r["task_id"] for r in rows} == {"answer", "nothing"}
    tokenizer = AutoTokenizer.from_pretrained(next(p for p in (cache / "tokenizers").iterdir() if not p.name.startswith(".")))
    for group in groups:
        ScoredData(**group)  # atroposlib's own schema of what the API server takes
        members = [r for r in rows if r["task_id"] == group["group_overrides"]["task_id"]]
        expected = [float(group["group_overrides"]["task_id"] == "answer" and "terminal" in r["toolsets"])
                    for r in sorted(members, key=lambda r: r["member"])]
        assert group["scores"] == expected
        assert group["group_overrides"]["token_source"] == "rendered"
        for tokens, masks, messages in zip(group["tokens"], group["masks"], group["messages"]):
            assert len(tokens) == len(masks) and all(m in (IGNORE, t) for t, m in zip(tokens, masks))
            assistants = [m for m in messages if m["role"] == "assistant"]
            spans = trained_spans(masks)
            assert len(spans) == len(assistants)  # every assistant turn, nothing else
            for (start, end), message in zip(spans, assistants):
                assert tokenizer.decode(tokens[start:end]).startswith(message["content"])
    assert any(0.0 < sum(g["scores"]) < 4 for g in groups)  # the draw made a group with signal for GRPO


def test_groups_whose_scores_are_all_equal_are_dropped_by_default(tmp_path, sim_url, monkeypatch, cache):
    assert run(tmp_path, sim_url, monkeypatch, cache, "process", "--groups", "2", "--group_size", "2",
               "--out", "groups.jsonl") == 0
    assert (tmp_path / "groups.jsonl").read_text() == ""  # terminal_only: all 1s, then all 0s
    assert len((tmp_path / "groups.sharegpt.jsonl").read_text().splitlines()) == 4  # still rows for SFT


def test_evaluate_scores_the_eval_split(tmp_path, sim_url, monkeypatch, cache, capsys):
    assert run(tmp_path, sim_url, monkeypatch, cache, "evaluate", "--eval_dir", "eval") == 0
    assert '"eval/pass_rate": 1.0' in capsys.readouterr().out
    saved = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert saved["results"]["all"]["eval/tasks"] == 1.0 and saved["results"]["all"]["eval/pass_rate"] == 1.0
    samples = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    assert [(s["task_id"], s["reward"], s["error"]) for s in samples] == [("held-out", 1.0, None)]


def test_a_bad_task_file_is_one_line_and_nothing_runs(tmp_path, sim_url, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "prompt": "p"}\n')
    assert foundry_main(["env", "process", "--tasks", str(bad), "--base_url", sim_url]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hermes-foundry env: {bad}: 1 invalid line(s)") and "line 1: missing field 'verifier'" in err


def test_the_documented_example_environment_runs_with_its_own_tasks_and_verifier(tmp_path, sim_url, monkeypatch, cache):
    example = Path(__file__).resolve().parents[2] / "examples" / "rl_environment.py"
    monkeypatch.setenv("HERMES_CACHE_DIR", str(cache))
    monkeypatch.chdir(tmp_path)
    assert foundry_main(["env", "process", "--env_class", f"{example}:CountingEnv", "--base_url", sim_url,
                         "--groups", "3", "--group_size", "2", "--keep_equal_scores", "--out", "counting.jsonl"]) == 0
    groups = [json.loads(line) for line in (tmp_path / "counting.jsonl").read_text().splitlines()]
    assert [(g["group_overrides"]["task_id"], g["scores"]) for g in groups] == [
        ("count-3", [1.0, 1.0]), ("count-5", [1.0, 1.0]), ("count-8", [0.875, 0.875])]


def test_an_env_class_that_is_not_an_environment_is_one_line(tmp_path, sim_url, capsys):
    assert foundry_main(["env", "process", "--env_class", "json:JSONDecoder", "--base_url", sim_url]) == 2
    assert capsys.readouterr().err == ("hermes-foundry env: --env_class 'json:JSONDecoder': JSONDecoder is not a "
                                       "subclass of HermesEnv\n")


def test_nothing_reaches_weights_and_biases_unless_asked(tmp_path, sim_url, monkeypatch, cache):
    import wandb

    def refuse(*args, **kwargs):
        raise AssertionError("wandb.init called")

    monkeypatch.setattr(wandb, "init", refuse)  # atroposlib's own CLI forces W&B on in process and evaluate
    assert run(tmp_path, sim_url, monkeypatch, cache, "process", "--groups", "1", "--group_size", "2",
               "--keep_equal_scores", "--out", "groups.jsonl") == 0
    assert run(tmp_path, sim_url, monkeypatch, cache, "evaluate", "--eval_dir", "eval") == 0


def test_what_would_need_the_network_is_one_line_not_a_hang(tmp_path, sim_url, monkeypatch, cache, capsys):
    from procs import free_port

    assert run(tmp_path, sim_url, monkeypatch, cache, "process", "--tokenizer", "someone/unknown-model") == 2
    assert "tokenizer 'someone/unknown-model' is not in the local Hugging Face cache" in capsys.readouterr().err
    nowhere = f"http://127.0.0.1:{free_port()}"
    assert run(tmp_path, sim_url, monkeypatch, cache, "serve", "--api_url", nowhere) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hermes-foundry env: no Atropos API server answers at {nowhere}") and err.count("\n") == 1
