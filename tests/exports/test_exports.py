"""Training exports end to end: a real run (simulated endpoint, real sandboxes, real Dagster) exported as
an HF dataset, Parquet and TRL messages, loaded back with `datasets`, rendered through a tool-aware chat
template with `transformers`, and pushed to a fake Hub. Plus golden tests of the messages conversion."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import datasets
import pytest
import yaml
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from hermes_assets.cli import batch_main
from hermes_assets.export_assets import build_export_assets
from hermes_core.exports import ExportError, export_main, export_run, hf, trl
from hermes_core.exports.trl import TRL_FEATURES, agent_to_messages, message, openai_tools, sharegpt_to_messages
from hermes_core.batch.recipe import load_recipe
from hermes_core.batch.code_versions import code_version
from hermes_core.formats.sharegpt import hermes_system_prompt, to_conversations

RUN = "exports_run"
TEMPLATE = Path(__file__).parents[1] / "fixtures" / "tool_chat_template.jinja"
PROMPTS = [
    {"prompt": "Run a command that prints hello", "id": "terminal"},
    {"prompt": "Write 'hello export' to notes.txt", "id": 7, "metadata": {"k": [1, 2]}, "topic": "files"},
    {"prompt": "Compute the sum with a python script"},
    {"prompt": "Run ls and write 'x' to a.txt [sim:parallel]"},  # two calls in one assistant message
    {"prompt": "Run ls [sim:hallucinate]"},  # calls a tool outside the universe: discarded, kept in raw/
    {"prompt": "Run ls [sim:malformed-args]"},  # unparsable arguments on the first call
    {"prompt": "Run ls [sim:loop]"},  # hits max_turns: a later user message asks for the summary
]
DISTRIBUTIONS = "distributions:\n  export_mix:\n    description: terminal, files and code\n" \
                "    toolsets: {terminal: 100, file: 100, code_execution: 100}\n"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load(kind: str, path: Path, cache: Path) -> datasets.Dataset:
    return datasets.load_dataset(kind, data_files=str(path), split="train", cache_dir=str(cache))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, sim_server) -> Path:
    home = tmp_path_factory.mktemp("exports")
    with pytest.MonkeyPatch.context() as patch:
        for name in ("HERMES_BASE_URL", "HERMES_API_KEY", "HERMES_MODEL", "OPENAI_BASE_URL", "OPENAI_API_KEY",
                     "HERMES_RUNS_FILE", "HERMES_HF_REPO", "HF_TOKEN"):
            patch.delenv(name, raising=False)
        patch.setenv("HERMES_DATA_DIR", str(home / "data"))
        (home / "dagster_home").mkdir()
        patch.setenv("DAGSTER_HOME", str(home / "dagster_home"))
        # Nothing may leave the machine: datasets reads these flags from its config module at call time.
        patch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
        patch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
        (home / "d.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
        (home / "dist.yaml").write_text(DISTRIBUTIONS)
        assert batch_main([
            f"--dataset_file={home / 'd.jsonl'}", f"--run_name={RUN}", f"--base_url={sim_server.base_url}",
            "--api_key=k", "--batch_size=4", "--num_workers=4", f"--distributions_file={home / 'dist.yaml'}",
            "--distribution=export_mix", "--max_turns=3",
        ]) == 0
        yield home / "data" / RUN


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    """A tokenizer built here (no hub download) carrying the test chat template."""
    vocab = {"[UNK]": 0, "<|im_start|>": 1, "<|im_end|>": 2, "assistant": 3, "user": 4, "tool": 5}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    built = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", eos_token="<|im_end|>")
    built.chat_template = TEMPLATE.read_text()
    return built


def render_all(tokenizer: PreTrainedTokenizerFast, rows: datasets.Dataset) -> list[str]:
    """Every row through the template, with `tools` decoded the way TRL's SFTTrainer does."""
    return [tokenizer.apply_chat_template(row["messages"], tools=json.loads(row["tools"]) or None, tokenize=False)
            for row in rows]


def test_hf_dataset_and_parquet_load_with_the_declared_features(run_dir, tmp_path):
    outputs = export_run(run_dir, ("hf", "parquet"))
    assert any(str(run_dir / "hf") == where for where in outputs.values())
    kept = read_jsonl(run_dir / "trajectories.jsonl")
    features = hf.trajectory_features()
    saved = datasets.load_from_disk(str(run_dir / "hf"))
    parquet = load("parquet", run_dir / "trajectories.parquet", tmp_path)
    assert saved.features == features and parquet.features == features
    assert load("json", run_dir / "trajectories.jsonl", tmp_path).num_rows == len(kept) == saved.num_rows == 6
    for exported in (saved, parquet):
        assert exported["sample_key"] == [r["sample_key"] for r in kept]
        assert exported["conversations"] == [r["conversations"] for r in kept]
        assert set(exported["disposition"]) == {"kept"}
    by_key = {r["sample_key"]: r for r in kept}
    for row in saved:
        source = by_key[row["sample_key"]]
        assert json.loads(row["id"]) == source["id"] and json.loads(row["extra"]) == source["extra"]
        assert json.loads(row["metadata"]["input_metadata"]) == source["metadata"]["input_metadata"]
        assert row["metadata"]["run_name"] == RUN and json.loads(row["metadata"]["other"]) == {}
        assert row["toolset_seed"] == source["toolset_seed"]  # exact: a 63-bit int64
        assert {n: s for n, s in row["tool_stats"].items() if s["count"]} == \
            {n: s for n, s in source["tool_stats"].items() if s["count"]}
        # The tools column is the system turn's list: sorted by name, as Hermes Agent writes it.
        assert [t["name"] for t in json.loads(row["tools"])] == sorted(source["tools_offered"])
        assert row["tool_stats_other"] == []
    used = {name for row in saved for name, s in row["tool_stats"].items() if s["count"]}
    assert {"terminal", "write_file", "execute_code"} <= used
    assert saved[1]["id"] == "7" and json.loads(saved[1]["metadata"]["input_metadata"]) == {"k": [1, 2]}
    assert not list(run_dir.glob(".*.tmp")) and not list(run_dir.glob(".*.old"))


def test_discarded_rows_export_with_their_disposition_in_the_same_schema(run_dir, tmp_path, tokenizer):
    result = hf.export_hf(run_dir, include_discarded=True)
    assert result.dispositions == {"kept": 6, "discarded_hallucinated_tool": 1}
    root = run_dir / "with_discarded"
    saved = datasets.load_from_disk(str(root / "hf"))
    assert saved.features == hf.trajectory_features() == load("parquet", root / "trajectories.parquet", tmp_path).features
    bad = saved.filter(lambda row: row["disposition"] == "discarded_hallucinated_tool")
    assert bad.num_rows == 1 and bad[0]["tool_stats_other"] == [
        {"tool": "quantum_teleport", "count": 1, "success": 0, "failure": 1}]
    assert "quantum_teleport" not in saved.features["tool_stats"]
    assert saved["prompt_index"] == sorted(saved["prompt_index"])  # dataset order, discarded in place

    trl.export_trl(run_dir, include_discarded=True)
    messages = load("json", root / "trl" / "messages.jsonl", tmp_path)
    assert messages.features == TRL_FEATURES and messages.num_rows == 7
    assert render_all(tokenizer, messages)  # the hallucinated call renders like any other call


def test_trl_export_loads_with_one_schema_and_every_row_renders(run_dir, tmp_path, tokenizer):
    result = trl.export_trl(run_dir)
    assert result.rows == 6
    as_json = load("json", run_dir / "trl" / "messages.jsonl", tmp_path)
    as_parquet = load("parquet", run_dir / "trl" / "messages.parquet", tmp_path)
    assert as_json.features == as_parquet.features == TRL_FEATURES
    assert as_json.to_list() == as_parquet.to_list()
    rendered = render_all(tokenizer, as_json)
    assert len(rendered) == 6
    for text, row in zip(rendered, as_json):
        assert text.count("<tool_call>") == sum(len(m["tool_calls"] or []) for m in row["messages"])
        assert text.count("<tool_response>") == sum(m["role"] == "tool" for m in row["messages"])
        assert "<think>" in text and '"name": "terminal"' in text  # every tool list offers terminal
        assert all(m["role"] != "system" for m in row["messages"])  # tools column instead
    ids = tokenizer.apply_chat_template(as_json[0]["messages"], tools=json.loads(as_json[0]["tools"]))
    assert len(ids["input_ids"] if hasattr(ids, "keys") else ids) > 0
    later_user = [row for row in as_json if [m["role"] for m in row["messages"]].count("user") == 2]
    assert later_user and "summar" in later_user[0]["messages"][-2]["content"].lower()
    parallel = [m for row in as_json for m in row["messages"] if m["tool_calls"] and len(m["tool_calls"]) == 2]
    assert {c["function"]["name"] for c in parallel[0]["tool_calls"]} == {"terminal", "write_file"}


def test_recorded_messages_and_the_sharegpt_parse_agree_except_malformed_arguments(run_dir):
    ledger = [r for path in sorted((run_dir / "raw").glob("*.jsonl")) for r in read_jsonl(path)]
    malformed = 0
    for record in ledger:
        recorded = agent_to_messages(record["messages"])
        parsed, tools = sharegpt_to_messages(record["row"]["conversations"])
        assert [t["function"]["name"] for t in tools] == sorted(record["row"]["tools_offered"])  # system turn order
        for ours, theirs in zip(recorded, parsed, strict=True):
            for a, b in zip(ours["tool_calls"] or [], theirs["tool_calls"] or [], strict=True):
                if a["function"]["arguments"] != b["function"]["arguments"]:
                    malformed += 1  # the ledger keeps the model's text; ShareGPT wrote {} for it
                    assert b["function"]["arguments"] == "{}"
                    a["function"]["arguments"] = "{}"
            assert ours == theirs
    assert malformed == 1


def test_dataset_card_describes_the_run(run_dir):
    hf.export_hf(run_dir, targets=("parquet",))
    card = (run_dir / "DATASET_CARD.md").read_text()
    assert card.startswith("---\n")
    front = yaml.safe_load(card.split("---\n")[1])
    assert {"tool-calling", "simulated"} <= set(front["tags"]) and front["license"] == "other"
    assert front["size_categories"] == ["n<1K"] and front["task_categories"] == ["text-generation"]
    assert [c["config_name"] for c in front["configs"]] == ["default", "messages"]
    recipe = load_recipe(run_dir.parent, RUN)
    stats = json.loads((run_dir / "statistics.json").read_text())
    dataset_sha = json.loads((run_dir / "dataset.json").read_text())["sha256"]
    for text in ("SIMULATED", "`export_mix`: terminal 100%, file 100%, code_execution 100%", "| max_turns | 3 |",
                 "run seed 0", "require reasoning: True", recipe.fingerprint(), dataset_sha,
                 "| kept | 6 | 6 |", f"| discarded_hallucinated_tool | {stats['counts']['discarded_hallucinated_tool']} | 0 |",
                 "code version: `0.1.0`", f"rows shaped by code version(s) `{code_version('raw_trajectories')}`",
                 "load_from_disk", "SFTTrainer", "`tool_stats_other`"):
        assert text in card, text
    assert "content sha256" in card and hf.export_hf(run_dir, targets=()).sha256 in card


def test_push_to_hub_uploads_card_and_both_parquet_files_to_a_fake_hub(run_dir, monkeypatch, capsys):
    calls: list[tuple] = []

    class FakeHfApi:  # the upload boundary: records what would leave the machine
        def __init__(self, token=None):
            calls.append(("init", token))

        def create_repo(self, repo_id, **options):
            calls.append(("create_repo", repo_id, options))

        def upload_folder(self, **options):
            folder = Path(options["folder_path"])
            files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
            card = (folder / "README.md").read_text()
            calls.append(("upload_folder", options["repo_id"], options["repo_type"], files, card))
            return "https://hub.invalid/datasets/me/trajectories/commit/abc"

    monkeypatch.setattr(hf, "HfApi", FakeHfApi)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("HERMES_HF_REPO", "me/trajectories")
    assert export_main(["--run_name", RUN, "--output_dir", str(run_dir.parent), "--format", "parquet"]) == 0
    assert "hub: https://hub.invalid/datasets/me/trajectories/commit/abc" in capsys.readouterr().out
    assert calls[0] == ("init", "hf_secret")
    assert calls[1] == ("create_repo", "me/trajectories", {"repo_type": "dataset", "private": True, "exist_ok": True})
    _, repo, kind, files, card = calls[2]
    assert (repo, kind) == ("me/trajectories", "dataset")
    assert files == ["README.md", hf.HUB_TRAJECTORIES, hf.HUB_MESSAGES]
    assert 'load_dataset("me/trajectories", "messages", split="train")' in card

    calls.clear()
    hf.push_to_hub(run_dir, "me/public", token="t2", private=False)
    assert calls[:2] == [("init", "t2"), ("create_repo", "me/public", {"repo_type": "dataset", "private": False,
                                                                      "exist_ok": True})]
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setattr(hf, "get_token", lambda: None)
    with pytest.raises(ExportError, match="HF_TOKEN"):
        hf.push_to_hub(run_dir, "me/x")


def test_cli_exports_one_format_and_reports_errors(run_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HERMES_HF_REPO", raising=False)
    copy = tmp_path / "data" / RUN
    copy.mkdir(parents=True)
    for name in ("prompts.jsonl", "recipe.json", "dataset.json", "statistics.json"):
        (copy / name).write_bytes((run_dir / name).read_bytes())
    (copy / "raw").mkdir()
    for path in (run_dir / "raw").glob("*.jsonl"):
        (copy / "raw" / path.name).write_bytes(path.read_bytes())
    assert export_main(["--run_name", RUN, "--output_dir", str(tmp_path / "data"), "--format", "trl"]) == 0
    assert "messages_jsonl (6 rows)" in capsys.readouterr().out
    assert (copy / "trl" / "messages.parquet").is_file()
    assert not (copy / "hf").exists() and not (copy / "trajectories.parquet").exists()
    assert export_main(["--run_name", "nope", "--output_dir", str(tmp_path / "data")]) == 2
    assert "no planned run" in capsys.readouterr().err


def test_a_failed_export_leaves_the_previous_one_in_place(run_dir, monkeypatch):
    hf.export_hf(run_dir, targets=("hf",))
    before = sorted(p.name for p in (run_dir / "hf").iterdir())

    def broken(self, path, **options):
        Path(path).mkdir()
        (Path(path) / "half-written.arrow").write_text("x")
        raise OSError("disk full")

    monkeypatch.setattr(datasets.Dataset, "save_to_disk", broken)
    with pytest.raises(OSError, match="disk full"):
        hf.export_hf(run_dir, targets=("hf",))
    assert sorted(p.name for p in (run_dir / "hf").iterdir()) == before
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".hf.")]


def test_export_assets_materialize_in_the_run_group(run_dir, monkeypatch):
    monkeypatch.delenv("HERMES_HF_REPO", raising=False)
    recipe = load_recipe(run_dir.parent, RUN)
    assets = build_export_assets(recipe, run_dir.parent)
    assert [a.key for a in assets] == [dg.AssetKey([RUN, "hf_dataset"]), dg.AssetKey([RUN, "trl_messages"])]
    for asset in assets:
        assert asset.group_names_by_key[asset.key] == RUN
        assert dg.AssetKey([RUN, "filtered_trajectories"]) in asset.dependency_keys
    result = dg.materialize(assets, instance=dg.DagsterInstance.ephemeral())
    assert result.success
    by_key = {e.materialization.asset_key: e.materialization.metadata for e in result.get_asset_materialization_events()}
    hf_meta = by_key[dg.AssetKey([RUN, "hf_dataset"])]
    assert hf_meta["dagster/row_count"].value == 6
    assert "tool_stats_other" in [c.name for c in hf_meta["dagster/column_schema"].schema.columns]
    assert hf_meta["parquet"].value == str(run_dir / "trajectories.parquet")
    assert by_key[dg.AssetKey([RUN, "trl_messages"])]["dagster/row_count"].value == 6


# -- golden tests of the OpenAI-messages conversion ------------------------------------------------
DEFINITIONS = [
    {"name": "terminal", "description": "Run a command.",
     "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}},
    {"name": "read_file", "description": "Read a file.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
]
AGENT_MESSAGES = [
    {"role": "user", "content": "List the files, then read a.txt"},
    {"role": "assistant", "content": None, "reasoning": "I will list, then read.", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "terminal", "arguments": '{"command": "ls"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.txt"'}},
    ]},
    {"role": "tool", "tool_call_id": "call_a", "name": "terminal", "content": '{"output": "a.txt", "exit_code": 0}'},
    {"role": "tool", "tool_call_id": "call_b", "name": "read_file", "content": "error: unparsable arguments"},
    {"role": "assistant", "content": "  There is one file.  ", "reasoning": None},
    {"role": "user", "content": "Please summarize."},
    {"role": "assistant", "content": "Summary: one file.", "reasoning": "  Short.  "},
]


def call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def golden(malformed_arguments: str) -> list[dict]:
    return [
        message("user", "List the files, then read a.txt"),
        message("assistant", "", reasoning_content="I will list, then read.", tool_calls=[
            call("call_a", "terminal", '{"command": "ls"}'), call("call_b", "read_file", malformed_arguments)]),
        message("tool", '{"output": "a.txt", "exit_code": 0}', tool_call_id="call_a", name="terminal"),
        message("tool", "error: unparsable arguments", tool_call_id="call_b", name="read_file"),
        message("assistant", "There is one file."),
        message("user", "Please summarize."),
        message("assistant", "Summary: one file.", reasoning_content="Short."),
    ]


def test_sharegpt_to_messages_golden():
    """Reasoning as its own field (None when the think block is empty), call ids taken from the tool
    turn, unparsable arguments as ShareGPT wrote them ({}), two calls in one turn, a later user turn,
    and the Hermes system turn turned into the tools column."""
    messages, tools = sharegpt_to_messages(to_conversations(AGENT_MESSAGES, DEFINITIONS))
    assert messages == golden("{}")
    by_name = sorted(DEFINITIONS, key=lambda d: d["name"])  # the system turn lists tools sorted by name
    assert tools == openai_tools(by_name) == [{"type": "function", "function": d} for d in by_name]


def test_recorded_agent_messages_golden():
    """The ledger's messages keep the model's own (malformed) argument text; the ephemeral system
    prompt never reaches the data."""
    recorded = [{"role": "system", "content": "ephemeral"}, *AGENT_MESSAGES]
    assert agent_to_messages(recorded) == golden('{"path": "a.txt"')


def test_sharegpt_from_elsewhere_golden():
    """Hand-made or third-party ShareGPT: a custom system prompt is kept, string arguments are kept
    verbatim, a block that is not a call stays text, replies are matched by name, missing ids are made up."""
    conversations = [
        {"from": "system", "value": "You are terse."},
        {"from": "human", "value": "Go"},
        {"from": "gpt", "value": "<think>\n\n</think>\nOk.\n<tool_call>\nnot json\n</tool_call>\n<tool_call>\n"
                                 '{"name": "terminal", "arguments": "{\\"command\\": \\"pwd\\"}"}\n</tool_call>\n'
                                 '<tool_call>\n{"name": "read_file", "arguments": {"path": "b"}}\n</tool_call>'},
        {"from": "tool", "value": '<tool_response>\n{"name": "read_file", "content": {"text": "B"}}\n</tool_response>\n'
                                  '<tool_response>\n{"tool_call_id": "t1", "name": "terminal", "content": "/w"}\n'
                                  "</tool_response>"},
    ]
    messages, tools = sharegpt_to_messages(conversations)
    assert tools == []
    assert messages == [
        message("system", "You are terse."),
        message("user", "Go"),
        message("assistant", "Ok.\n<tool_call>\nnot json\n</tool_call>", tool_calls=[
            call("t1", "terminal", '{"command": "pwd"}'), call("call_2_1", "read_file", '{"path": "b"}')]),
        message("tool", '{"text": "B"}', tool_call_id="call_2_1", name="read_file"),
        message("tool", "/w", tool_call_id="t1", name="terminal"),
    ]
    system = hermes_system_prompt(DEFINITIONS)
    assert sharegpt_to_messages([{"from": "system", "value": system}])[0] == []  # the template is dropped
