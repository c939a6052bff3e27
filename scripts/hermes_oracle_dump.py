"""The conformance oracle's dumper (issue 19). Runs INSIDE the oracle venv (scripts/hermes_oracle.sh),
offline and with HERMES_HOME in a temporary folder; it imports the real Hermes Agent and nothing of
this project, and writes what the original defines as one JSON document:

- version: the installed hermes-agent version;
- toolsets: {toolset: [tool names]} as the original resolves each of its toolsets;
- tools: {name: OpenAI function definition} of every registered tool;
- tool_definitions_by_toolset: {toolset: model_tools.get_tool_definitions([toolset], quiet_mode=True)};
- check_fns: {tool: the check function gating it, or null}: what a tool needs to be offered;
- distributions: toolset_distributions.DISTRIBUTIONS;
- sharegpt: {case: conversations} the original saves for each fixture case (below);
- sharegpt_direct, agent_messages, tool_stats, reasoning_stats: the details behind `sharegpt`.

Tool availability: the original offers a tool only when its check_fn passes (API keys, a browser
CLI, ...), which varies between machines. `tools` and `tool_definitions_by_toolset` are taken with
every check_fn cleared, i.e. as a fully configured installation offers them, so the dump is the same
everywhere; `check_fns` says which tools a given installation would offer. (The unforced view is
not dumped: it depends on the machine, and the offline probes behind it take ~10 s.) The `sharegpt`
conversions offer the tools as a batch run of such an installation does: without the tools that need
its desktop app or a CDP browser (BATCH_GATED, whose own checks say no here).

ShareGPT: each fixture case (tests/conformance/fixtures/messages.json) holds the session's messages
with assistant messages as an endpoint returned them. `sharegpt` runs them through the original's
own path: AIAgent._build_assistant_message (reasoning extraction, inline-tag stripping), tool
results through make_tool_result_message (or the loop's unknown-tool reply), then
AIAgent._convert_to_trajectory_format, the method batch_runner.py calls for `conversations`.
`sharegpt_direct` feeds the fixture messages to the converter as they are.

Usage (inside the oracle venv): python hermes_oracle_dump.py OUTPUT_JSON FIXTURES_JSON
"""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
import os
import sys
import tempfile
from importlib.metadata import version
from types import SimpleNamespace
from typing import Any

# The agent's own offline complaints (auxiliary providers, browser checks) are noise here; a
# failure of this script still ends with its traceback, whose last line is the reason.
logging.disable(logging.WARNING)

import model_tools  # noqa: E402  (after logging is quietened: importing registers every tool)
import toolsets  # noqa: E402
import toolset_distributions  # noqa: E402
from batch_runner import _extract_reasoning_stats, _extract_tool_stats  # noqa: E402
from agent.conversation_loop import _invalid_tool_name_error_content  # noqa: E402
from agent.tool_dispatch_helpers import make_tool_result_message  # noqa: E402
from tools.registry import registry  # noqa: E402

# The product's exact-text dumper (also run inside a hermes-agent venv) drives the original the same
# way: its helpers are shared, loaded by path (it is a standalone script, not importable from here).
_spec = importlib.util.spec_from_file_location(
    "hermes_agent_dump", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "hermes_core", "formats",
                                      "hermes_agent_dump.py"))
_shared = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shared)
_force_all_available, _agent = _shared.force_all_available, _shared.offline_agent
# Offered only with the desktop app (HERMES_DESKTOP) or a CDP URL (BROWSER_CDP_URL), never in a batch run.
BATCH_GATED = ("browser_cdp", "browser_dialog", "read_terminal", "close_terminal")


def _definitions(toolset_names: list[str]) -> dict[str, list[dict[str, Any]]]:
    model_tools._clear_tool_defs_cache()
    return {ts: model_tools.get_tool_definitions(enabled_toolsets=[ts], quiet_mode=True) for ts in toolset_names}


def _check_fns() -> dict[str, str | None]:
    result = {}
    for name in registry.get_all_tool_names():
        check = registry.get_entry(name).check_fn
        result[name] = f"{check.__module__}.{check.__qualname__}" if check else None
    return result


def _all_tools() -> dict[str, dict[str, Any]]:
    """Every registered tool's definition as offered with every toolset enabled; tools whose
    definition is built from live state (e.g. discord) and dropped offline get their raw schema."""
    offered = {d["function"]["name"]: d for d in model_tools.get_tool_definitions(quiet_mode=True)}
    result = {}
    for name in registry.get_all_tool_names():
        result[name] = offered.get(name) or {"type": "function", "function": {**registry.get_schema(name), "name": name}}
    return result


def _model_message(message: dict[str, Any]) -> SimpleNamespace:
    """An assistant message as the OpenAI SDK hands it to the agent (attributes, not keys)."""
    calls = [
        SimpleNamespace(id=c["id"], type=c.get("type", "function"),
                        function=SimpleNamespace(name=c["function"]["name"], arguments=c["function"]["arguments"]))
        for c in message.get("tool_calls") or []
    ]
    fields = {k: message[k] for k in ("reasoning", "reasoning_content", "reasoning_details") if k in message}
    return SimpleNamespace(content=message.get("content"), tool_calls=calls or None, **fields)


def _convert_case(case: dict[str, Any]) -> dict[str, Any]:
    agent = _agent(case["toolsets"])
    fixture = copy.deepcopy(case["messages"])
    stored: list[dict[str, Any]] = [fixture[0]]
    for message in fixture[1:]:
        if message["role"] == "assistant":
            finish = "tool_calls" if message.get("tool_calls") else "stop"
            stored.append(agent._build_assistant_message(_model_message(message), finish))
        elif message["role"] == "tool" and message.pop("unknown_tool_reply", False):
            # The loop's own reply (agent/conversation_loop.py), not make_tool_result_message.
            message["content"] = _invalid_tool_name_error_content(message["name"], agent.valid_tool_names)
            stored.append(dict(message))
        elif message["role"] == "tool":
            stored.append(make_tool_result_message(message["name"], message["content"], message["tool_call_id"]))
        else:
            stored.append(message)
    query, completed = fixture[0]["content"], case.get("completed", True)
    return {
        "sharegpt": agent._convert_to_trajectory_format(copy.deepcopy(stored), query, completed),
        "sharegpt_direct": agent._convert_to_trajectory_format(copy.deepcopy(fixture), query, completed),
        "agent_messages": stored,
        "tool_stats": _extract_tool_stats(stored),
        "reasoning_stats": _extract_reasoning_stats(stored),
    }


def dump(fixtures_path: str) -> dict[str, Any]:
    names = toolsets.get_toolset_names()
    check_fns = _check_fns()
    gated = {name: registry.get_entry(name).check_fn for name in BATCH_GATED if name in check_fns}
    _force_all_available()
    for name, check in gated.items():  # the conversions offer the tools as a batch run does
        registry.get_entry(name).check_fn = check
    model_tools._clear_tool_defs_cache()
    with open(fixtures_path, encoding="utf-8") as handle:
        cases = json.load(handle)["cases"]
    converted = {name: _convert_case(case) for name, case in cases.items()}
    _force_all_available()
    return {
        "version": version("hermes-agent"),
        "toolsets": {ts: toolsets.resolve_toolset(ts) for ts in names},
        "tools": _all_tools(),
        "tool_definitions_by_toolset": _definitions(names),
        "check_fns": check_fns,
        "distributions": copy.deepcopy(toolset_distributions.DISTRIBUTIONS),
        **{key: {name: result[key] for name, result in converted.items()}
           for key in ("sharegpt", "sharegpt_direct", "agent_messages", "tool_stats", "reasoning_stats")},
    }


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: hermes_oracle_dump.py OUTPUT_JSON FIXTURES_JSON", file=sys.stderr)
        return 2
    out = os.path.abspath(argv[1])
    text = json.dumps(dump(argv[2]), ensure_ascii=False, indent=1, default=str)
    # Atomic: a reader never sees half a file.
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(out), prefix=".oracle-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text + "\n")
    os.chmod(tmp, 0o644)  # mkstemp makes it private; it is a plain build artefact
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
