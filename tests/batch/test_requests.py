"""What hermes-batch sends to the model, asserted at the simulated endpoint (issue 19 item 5):
reasoning in hermes-agent's OpenRouter form (or OpenAI's), OpenRouter provider routing, prefill."""

from __future__ import annotations

import json

import yaml

from batch_runs import prompts, read_jsonl, run, write_dataset

PREFILL = [{"role": "user", "content": "Example task: say hi"}, {"role": "assistant", "content": "hi (prefill)"}]


def _bodies(sim_server, rows: list[dict]) -> list[dict]:
    """Every request of these rows' conversations the endpoint received (each row's tag is unique)."""
    bodies = [b for row in rows for b in sim_server.log.bodies_mentioning(row["prompt"])]
    assert bodies, "the endpoint received none of these rows' requests"
    return bodies


def test_default_request_asks_for_reasoning_as_hermes_agent_does(isolated_homes, sim_server):
    rows = prompts(3, "defaults")
    assert run(write_dataset(isolated_homes / "d.jsonl", rows), sim_server.base_url) == 0
    bodies = _bodies(sim_server, rows)
    assert len(bodies) >= 6  # a tool round and a final answer per sample
    for body in bodies:
        assert body["reasoning"] == {"enabled": True, "effort": "medium"}
        assert "reasoning_effort" not in body and "provider" not in body
        assert body["messages"][0] == {"role": "user", "content": body["messages"][0]["content"]}


def test_routing_effort_and_prefill_flags_reach_the_endpoint_and_not_the_data(isolated_homes, sim_server):
    rows = prompts(2, "routed")
    dataset = write_dataset(isolated_homes / "d.jsonl", rows)
    prefill = isolated_homes / "prefill.json"
    prefill.write_text(json.dumps(PREFILL))
    assert run(dataset, sim_server.base_url, "--reasoning_effort=high", "--providers_allowed=anthropic, openai",
               "--providers_ignored=together", "--providers_order=openai,anthropic", "--provider_sort=price",
               f"--prefill_messages_file={prefill}", "--ephemeral_system_prompt=Be brief.") == 0
    bodies = _bodies(sim_server, rows)
    for body in bodies:
        assert body["reasoning"] == {"enabled": True, "effort": "high"}
        assert body["provider"] == {"only": ["anthropic", "openai"], "ignore": ["together"],
                                    "order": ["openai", "anthropic"], "sort": "price"}
        # After the system message, before the conversation: in every request of the sample.
        assert body["messages"][0] == {"role": "system", "content": "Be brief."}
        assert body["messages"][1:3] == PREFILL
        assert body["messages"][3]["content"] in {r["prompt"] for r in rows}
    output = read_jsonl(isolated_homes / "data" / "rs" / "trajectories.jsonl")
    assert len(output) == 2
    for row in output:  # sent, never saved: the one human turn is the prompt, no turn is a prefill message
        turns = row["conversations"]
        assert [t["value"] for t in turns if t["from"] == "human"] == [rows[row["prompt_index"]]["prompt"]]
        assert not {t["value"] for t in turns} & {m["content"] for m in PREFILL}
    recipe = json.loads((isolated_homes / "data" / "rs" / "recipe.json").read_text())
    assert recipe["prefill_messages"] == PREFILL and recipe["provider_sort"] == "price"


def test_disabled_reasoning_and_the_openai_form(isolated_homes, sim_server):
    disabled, openai_form, openai_off = prompts(1, "off"), prompts(1, "openai"), prompts(1, "openai-off")
    root = isolated_homes
    assert run(write_dataset(root / "a.jsonl", disabled), sim_server.base_url, "--reasoning_disabled",
               run_name="off") == 0
    assert run(write_dataset(root / "b.jsonl", openai_form), sim_server.base_url, "--reasoning_format=openai",
               "--reasoning_effort=low", run_name="oa") == 0
    assert run(write_dataset(root / "c.jsonl", openai_off), sim_server.base_url, "--reasoning_format=openai",
               "--reasoning_disabled", run_name="oaoff") == 0
    assert all(b["reasoning"] == {"effort": "none"} and "reasoning_effort" not in b
               for b in _bodies(sim_server, disabled))
    assert all(b["reasoning_effort"] == "low" and "reasoning" not in b for b in _bodies(sim_server, openai_form))
    assert all("reasoning_effort" not in b and "reasoning" not in b for b in _bodies(sim_server, openai_off))


def test_a_changed_prefill_is_a_changed_recipe(isolated_homes, sim_server, capsys):
    dataset = write_dataset(isolated_homes / "d.jsonl", prompts(1, "refp"))
    prefill = isolated_homes / "prefill.json"
    prefill.write_text(json.dumps(PREFILL))
    assert run(dataset, sim_server.base_url, f"--prefill_messages_file={prefill}") == 0
    # Routing and the reasoning form pick who serves the same request: the run resumes under them.
    assert run(dataset, sim_server.base_url, f"--prefill_messages_file={prefill}", "--provider_sort=latency",
               "--reasoning_format=openai") == 0
    prefill.write_text(json.dumps(PREFILL[:1]))
    capsys.readouterr()
    assert run(dataset, sim_server.base_url, f"--prefill_messages_file={prefill}") == 2
    assert "was started with a different recipe (changed: prefill_messages)" in capsys.readouterr().err


def test_bad_request_flags_get_one_clear_error(isolated_homes, sim_server, capsys):
    dataset = write_dataset(isolated_homes / "d.jsonl", prompts(1, "bad"))
    before = sim_server.log.requests
    cases = {
        "not json": "not valid JSON",
        json.dumps({"role": "user"}): "expected a JSON array of messages, got dict",
        json.dumps([{"content": "no role"}]): "prefill_messages[0]: expected an object with a string `role`",
    }
    for text, why in cases.items():
        (isolated_homes / "p.json").write_text(text)
        assert run(dataset, sim_server.base_url, f"--prefill_messages_file={isolated_homes / 'p.json'}") == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --prefill_messages_file {isolated_homes / 'p.json'}: ") and why in err
        assert "Traceback" not in err
    assert run(dataset, sim_server.base_url, f"--prefill_messages_file={isolated_homes / 'missing.json'}") == 2
    assert "missing.json: No such file" in capsys.readouterr().err
    assert run(dataset, sim_server.base_url, "--reasoning_effort=huge") == 2
    assert "reasoning_effort 'huge': expected one of none, minimal, low, medium, high" in capsys.readouterr().err
    assert sim_server.log.requests == before  # refused before anything was sent


def test_runs_file_takes_the_request_settings_with_their_types(isolated_homes, sim_server):
    from hermes_assets.runs_file import read_runs_file

    runs = isolated_homes / "runs.yaml"
    base = {"run_name": "declared", "dataset_file": "d.jsonl", "model": "m"}
    runs.write_text(yaml.safe_dump([{**base, "providers_allowed": ["a", "b"], "provider_sort": "throughput",
                                     "prefill_messages": PREFILL, "reasoning_format": "openai"}]))
    declared, problems = read_runs_file(runs)
    assert not problems
    assert declared[0].recipe.request_options().provider() == {"only": ["a", "b"], "sort": "throughput"}
    runs.write_text(yaml.safe_dump([{**base, "providers_allowed": "a,b", "provider_sort": "fastest"}]))
    _, problems = read_runs_file(runs)
    assert [p.field for p in problems] == ["providers_allowed"]
    assert "expected list or null" in problems[0].what
    runs.write_text(yaml.safe_dump([{**base, "provider_sort": "fastest"}]))
    _, problems = read_runs_file(runs)
    assert [(p.field, "expected one of price, throughput, latency" in p.what) for p in problems] == [
        ("provider_sort", True)]


def test_verbose_lines_preview_tool_calls_to_log_prefix_chars(isolated_homes, sim_server, capsys):
    rows = prompts(1, "preview")
    assert run(write_dataset(isolated_homes / "d.jsonl", rows), sim_server.base_url, "--verbose",
               "--log_prefix_chars=12") == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("  [P0] ")]
    call = next(m for b in _bodies(sim_server, rows) for m in b["messages"] if m.get("tool_calls"))["tool_calls"][0]
    arguments = call["function"]["arguments"]
    assert len(arguments) > 12
    assert lines == [f"  [P0] {call['function']['name']}: {arguments[:12]}..."]
