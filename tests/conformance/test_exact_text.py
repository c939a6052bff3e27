"""Issue 19, item 3: exact text on request (`--hermes_agent_python`, env HERMES_AGENT_PYTHON).

The wording is dumped from the oracle venv's Python (.oracle-venv/bin/python) by the product's own
dumper, as a run dumps it, and compared with what the oracle recorded from the original:

- with the dumped text, every fixture case's record is the original's byte for byte;
- with our own text, the record differs only in prose, and the test says which bytes: the four
  sentences of the system turn (`HermesText`: preamble, schema intro, call instruction, example
  intro), every `description` string in the system turn's tool list (a tool's and its parameters';
  the same schema objects have one on both sides, at the same position among their keys), and the
  notice line inside `<untrusted_tool_result>`. Putting the original's words in exactly those places
  turns our record into the original's bytes;
- a hermes-batch run on the simulated endpoint with the flag saves the dump, writes the original's
  text into its rows and sends the original's descriptions; the same command resumes with no
  request; the run without the flag is a changed recipe; a bad path is one line of error.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest
import yaml

from batch_runs import prompts, read_jsonl, run, write_dataset
from hermes_assets.runs_file import adopt_recipe, resolve_runs
from hermes_core.batch.recipe import HERMES_TEXT_FILE, RecipeError, load_hermes_text, run_dir
from hermes_core.formats.hermes_agent_text import dump_hermes_agent_text, dump_sha256, hermes_text_from_dump
from hermes_core.formats.hermes_text import OWN_TEXT, HermesText
from hermes_core.formats.sharegpt import hermes_system_prompt
from hermes_core.tools import registry

from .conftest import ROOT
from .test_record_format import (CASES, our_definitions, records, replay_url, run_case,  # noqa: F401  (fixture)
                                  their_notice, their_tools)

ORACLE_PYTHON = ROOT / ".oracle-venv" / "bin" / "python"


@pytest.fixture(scope="module")
def dump(oracle: dict[str, Any]) -> str:
    """The dump a run with `--hermes_agent_python .oracle-venv/bin/python` makes (the `oracle`
    fixture first: it builds the venv, or skips with the reason it cannot be built here)."""
    return dump_hermes_agent_text(str(ORACLE_PYTHON))


@pytest.fixture(scope="module")
def exact(dump: str) -> HermesText:
    return hermes_text_from_dump(dump, "test")


def reworded(ours: Any, theirs: Any) -> Any:
    """`ours` with every `description` string replaced by the one at the same place in `theirs`; the
    keys stay where ours has them, so any other difference (an order too) is left for the comparison."""
    if isinstance(ours, dict):
        described = isinstance(ours.get("description"), str)
        assert described == isinstance(theirs.get("description"), str)  # the same schema objects are described
        return {key: theirs[key] if key == "description" and described else reworded(value, theirs.get(key))
                for key, value in ours.items()}
    if isinstance(ours, list):
        return [reworded(item, other) for item, other in zip(ours, theirs, strict=True)]
    return ours


def with_their_prose(turns: list[dict[str, str]], oracle: dict[str, Any], name: str, theirs: HermesText) -> list:
    """Our record with the original's words put in exactly the places prose may differ."""
    system = turns[0]["value"]
    assert HermesText.from_system_turn(system, OWN_TEXT.untrusted_notice) == OWN_TEXT
    tools_json = system.partition("<tools>\n")[2].partition("\n</tools>")[0]
    their_defs = {tool["name"]: tool for tool in their_tools(oracle, name)}
    tools = [reworded(tool, their_defs[tool["name"]]) for tool in json.loads(tools_json)]
    rest = system.partition("\n</tools>\n")[2]
    for field in ("schema_intro", "call_instruction", "example_intro"):
        rest = rest.replace(getattr(OWN_TEXT, field), getattr(theirs, field), 1)
    value = f"{theirs.preamble}<tools>\n{json.dumps(tools, ensure_ascii=False)}\n</tools>\n{rest}"
    notice = (json.dumps(OWN_TEXT.untrusted_notice, ensure_ascii=False)[1:-1],
              json.dumps(theirs.untrusted_notice, ensure_ascii=False)[1:-1])
    return [{"from": "system", "value": value}] + [{**t, "value": t["value"].replace(*notice)} for t in turns[1:]]


def test_the_dump_is_the_originals_wording(oracle, dump, exact) -> None:
    data = json.loads(dump)
    assert data["version"] == oracle["version"] and data["missing"] == []
    assert exact.untrusted_notice == their_notice(oracle)
    assert exact.preamble == oracle["sharegpt"]["plain_answer"][0]["value"].partition("<tools>\n")[0]
    assert exact.preamble != OWN_TEXT.preamble
    assert dump_sha256(dump_hermes_agent_text(str(ORACLE_PYTHON))) == dump_sha256(dump)  # same words, same hash


def test_every_toolset_is_offered_as_the_original_offers_it(oracle, exact) -> None:
    """Descriptions that depend on the other tools offered (execute_code's importable tools,
    browser_navigate's pointer to the web tools) come out as the original's for each toolset."""
    compared = 0
    for definitions in oracle["tool_definitions_by_toolset"].values():
        names = [d["function"]["name"] for d in definitions]
        if not names or not set(names) <= set(registry.universe):
            continue
        ours = exact.definitions([registry.get(name).definition() for name in names])
        assert ours == [d["function"] for d in definitions]
        compared += 1
    assert compared >= 9


@pytest.mark.parametrize("name", list(CASES))
def test_with_the_dumped_text_every_byte_is_the_originals(oracle, replay_url, exact, name) -> None:
    result = run_case(replay_url, name, exact)
    ours = records(result, exact.definitions(our_definitions(result)), exact)
    assert json.dumps(ours, ensure_ascii=False) == json.dumps(oracle["sharegpt"][name], ensure_ascii=False)


@pytest.mark.parametrize("name", list(CASES))
def test_without_it_only_the_prose_differs(oracle, replay_url, exact, name) -> None:
    result = run_case(replay_url, name)
    ours = records(result, our_definitions(result))
    assert ours[0]["value"] != oracle["sharegpt"][name][0]["value"]
    expected = json.dumps(oracle["sharegpt"][name], ensure_ascii=False)
    assert json.dumps(with_their_prose(ours, oracle, name, exact), ensure_ascii=False) == expected


def test_a_batch_run_with_the_flag_writes_the_originals_text(oracle, dump, isolated_homes, sim_server, monkeypatch,
                                                             capsys) -> None:
    rows = prompts(3, "exact")
    dataset = write_dataset(isolated_homes / "d.jsonl", rows)
    folder = isolated_homes / "data" / "rs"
    assert run(dataset, sim_server.base_url, f"--hermes_agent_python={ORACLE_PYTHON}") == 0
    saved = (folder / HERMES_TEXT_FILE).read_text(encoding="utf-8")
    assert saved == dump
    recipe = json.loads((folder / "recipe.json").read_text())
    assert recipe["hermes_text_sha256"] == dump_sha256(dump) and recipe["hermes_agent_python"] == str(ORACLE_PYTHON)
    theirs = hermes_text_from_dump(dump, "test")
    output = read_jsonl(folder / "trajectories.jsonl")
    assert len(output) == 3
    for row in output:
        assert {"terminal", "process"} <= set(row["tools_offered"])
        originals = [oracle["tools"][name]["function"] for name in row["tools_offered"]]
        system = row["conversations"][0]["value"]
        assert system == hermes_system_prompt(originals, theirs)  # the original's words throughout
        assert system.startswith(theirs.preamble) and OWN_TEXT.preamble not in system
    for name in output[0]["tools_offered"]:
        assert sim_server.log.tool_descriptions[name] == oracle["tools"][name]["function"]["description"]

    # The same text again (here through the environment variable): a resume, nothing sent.
    before = sim_server.log.requests
    monkeypatch.setenv("HERMES_AGENT_PYTHON", str(ORACLE_PYTHON))
    assert run(dataset, sim_server.base_url) == 0
    assert sim_server.log.requests == before
    monkeypatch.delenv("HERMES_AGENT_PYTHON")

    # Without it the wording would change: a changed recipe, refused as any other; nothing is lost.
    trajectories = (folder / "trajectories.jsonl").read_bytes()
    capsys.readouterr()
    assert run(dataset, sim_server.base_url) == 2
    err = capsys.readouterr().err
    assert "was started with a different recipe (changed: hermes_text_sha256)" in err
    assert "--force-new-fingerprint" in err and sim_server.log.requests == before
    assert (folder / HERMES_TEXT_FILE).read_text(encoding="utf-8") == dump
    assert (folder / "trajectories.jsonl").read_bytes() == trajectories


def test_a_bad_python_is_one_clear_error(isolated_homes, sim_server, capsys) -> None:
    dataset = write_dataset(isolated_homes / "d.jsonl", prompts(1, "bad-python"))
    before = sim_server.log.requests
    cases = {str(isolated_homes / "missing" / "python"): "not an executable file",
             sys.executable: "hermes-agent is not importable there"}  # this project's venv: no hermes-agent
    for python, why in cases.items():
        capsys.readouterr()
        assert run(dataset, sim_server.base_url, f"--hermes_agent_python={python}") == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert err.startswith(f"error: --hermes_agent_python {python}: {why}")
        assert "scripts/hermes_oracle.sh" in err
    assert sim_server.log.requests == before
    assert not (isolated_homes / "data" / "rs").exists()


def test_a_declared_run_takes_the_text_as_well(oracle, dump, isolated_homes) -> None:
    """The Dagster recipe (runs.yaml): the path resolves against the file's folder, the dump is made
    when the code location loads, and saved with the recipe before the run's first materialization."""
    root = isolated_homes / "data"
    root.mkdir()
    (root / "d.jsonl").write_text(json.dumps({"prompt": "hi"}) + "\n")
    (root / "runs.yaml").write_text(yaml.safe_dump([
        {"run_name": "declared", "dataset_file": "d.jsonl", "model": "hermes-sim",
         "hermes_agent_python": os.path.relpath(ORACLE_PYTHON, root)}]))
    recipes, problems = resolve_runs(root)
    assert problems == []
    (recipe,) = recipes
    assert recipe.hermes_agent_python == str(ORACLE_PYTHON) and recipe.hermes_text_sha256 == dump_sha256(dump)
    adopt_recipe(root, recipe)
    assert (run_dir(root, "declared") / HERMES_TEXT_FILE).read_text(encoding="utf-8") == dump
    assert load_hermes_text(run_dir(root, "declared"), recipe) == hermes_text_from_dump(dump, "test")
    # A run never writes rows in words other than those its recipe names.
    (run_dir(root, "declared") / HERMES_TEXT_FILE).write_text(dump.replace("function calling", "function-calling"))
    with pytest.raises(RecipeError, match="hermes_text.json: not the text the recipe names .* same --hermes_agent_python"):
        load_hermes_text(run_dir(root, "declared"), recipe)
