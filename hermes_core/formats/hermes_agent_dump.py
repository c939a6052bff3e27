"""The exact-text dumper (issue 19, `--hermes_agent_python`). A standalone script: it runs INSIDE
another Python that has hermes-agent installed (hermes_core/formats/hermes_agent_text.py starts it,
offline and with HERMES_HOME in a temporary folder), imports the real Hermes Agent and nothing of
this project, and prints the original's prose as one JSON document on stdout:

- version: the installed hermes-agent version;
- system_turn: one system turn rendered by the original's own converter
  (AIAgent._convert_to_trajectory_format, the method its batch runner saves rows with); the caller
  reads the prose back out of it (HermesText.from_system_turn);
- untrusted_notice: the line the original writes after `<untrusted_tool_result source="...">`
  (agent.tool_dispatch_helpers._maybe_wrap_untrusted), or null when it has no such wrapper;
- tools: {name: {description, parameters}} for every requested name the original has, as its
  model_tools.get_tool_definitions offers them with all the requested tools enabled. A tool whose
  description the original rebuilds from the other tools offered (get_tool_definitions: execute_code
  lists the sandbox tools it can import, browser_navigate drops its pointer to the web tools when
  neither is offered; the parameter text of execute_code too) also has `depends_on` and `variants`:
  {",".join(sorted(dependencies present)): {description, parameters}}, each made by
  get_tool_definitions itself;
- missing: requested names the original does not define.

Every tool is taken as a fully configured installation offers it (check functions cleared), as
scripts/hermes_oracle_dump.py does, so the dump is the same on every machine.

Usage (inside that Python): python hermes_agent_dump.py TOOL_NAME...
"""

from __future__ import annotations

import itertools
import json
import logging
import sys
from importlib.metadata import version
from typing import Any

# The agent's own offline complaints (auxiliary providers, browser checks) are noise here; a
# failure still ends with its traceback, whose last line is the reason.
logging.disable(logging.WARNING)

import model_tools  # noqa: E402  (after logging is quietened: importing registers every tool)
import toolsets  # noqa: E402
from run_agent import AIAgent  # noqa: E402
from tools.code_execution_tool import SANDBOX_ALLOWED_TOOLS  # noqa: E402
from tools.registry import registry  # noqa: E402

# Descriptions get_tool_definitions rebuilds from the set of tools offered (read from its source).
DEPENDS_ON = {"execute_code": sorted(SANDBOX_ALLOWED_TOOLS), "browser_navigate": ["web_extract", "web_search"]}
_counter = itertools.count()


def force_all_available() -> None:
    """A tool without check_fn is always offered (tools/registry.py get_definitions)."""
    for name in registry.get_all_tool_names():
        registry.get_entry(name).check_fn = None
    model_tools._clear_tool_defs_cache()


def offline_agent(enabled_toolsets: list[str]) -> AIAgent:
    """An agent built as batch_runner._process_single_prompt builds one; it never calls the model."""
    return AIAgent(
        base_url="http://127.0.0.1:9/v1", api_key="oracle-offline", model="oracle/offline",
        max_iterations=10, enabled_toolsets=enabled_toolsets, save_trajectories=False, quiet_mode=True,
        log_prefix_chars=100, skip_context_files=True, skip_memory=True,
    )


def offered_with(names: list[str]) -> dict[str, dict[str, Any]]:
    """{name: function definition} as get_tool_definitions offers exactly these tools."""
    toolset = f"hermes_foundry_exact_{next(_counter)}"  # a fresh name: get_tool_definitions caches per name
    toolsets.create_custom_toolset(toolset, "exact-text dump", tools=sorted(names))
    return {d["function"]["name"]: d["function"]
            for d in model_tools.get_tool_definitions(enabled_toolsets=[toolset], quiet_mode=True)}


def tool_texts(names: list[str]) -> dict[str, dict[str, Any]]:
    every = offered_with(names)
    result: dict[str, dict[str, Any]] = {}
    for name in names:
        entry = {"description": every[name].get("description", ""), "parameters": every[name].get("parameters", {})}
        alone = offered_with([name])[name]
        depends = [d for d in DEPENDS_ON.get(name, []) if d in names]
        if not depends and alone.get("description", "") != entry["description"]:
            raise SystemExit(f"the description of {name} depends on the other tools offered, in a way this "
                             "dumper does not know (hermes_core/formats/hermes_agent_dump.py DEPENDS_ON)")
        if depends:
            entry["depends_on"] = depends
            entry["variants"] = {}
            for size in range(len(depends) + 1):
                for present in itertools.combinations(depends, size):
                    variant = offered_with([name, *present])[name]
                    entry["variants"][",".join(present)] = {"description": variant.get("description", ""),
                                                            "parameters": variant.get("parameters", {})}
        result[name] = entry
    return result


def untrusted_notice() -> str | None:
    try:
        from agent.tool_dispatch_helpers import _maybe_wrap_untrusted
    except ImportError:
        return None
    wrapped = _maybe_wrap_untrusted("web_search", "x" * 64)
    return wrapped.split("\n")[1] if isinstance(wrapped, str) and wrapped.startswith("<untrusted_tool_result") else None


def dump(requested: list[str]) -> dict[str, Any]:
    force_all_available()
    known = set(registry.get_all_tool_names())
    names = [name for name in requested if name in known]
    query = "hello"
    system = offline_agent(["todo"])._convert_to_trajectory_format([{"role": "user", "content": query}], query, True)
    return {
        "version": version("hermes-agent"),
        "system_turn": system[0]["value"],
        "untrusted_notice": untrusted_notice(),
        "tools": tool_texts(names),
        "missing": [name for name in requested if name not in known],
    }


if __name__ == "__main__":
    json.dump(dump(sys.argv[1:]), sys.stdout, ensure_ascii=False)  # key order kept: it is part of the bytes
    sys.stdout.write("\n")
