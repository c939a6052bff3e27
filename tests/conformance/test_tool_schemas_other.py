"""Issue 19, the tools outside the terminal and file toolsets: each parameter schema (names, types,
enums, required, defaults, bounds; descriptions excluded) and property order is the original's,
and so is the batch-run view of each of their toolsets."""

from __future__ import annotations

from typing import Any

import pytest

from hermes_core.tools import registry
from conformance.test_hermes_agent_oracle import without_descriptions

TOOLS = ["execute_code", "web_search", "web_extract", "vision_analyze", "image_generate", "browser_navigate",
         "browser_snapshot", "browser_click", "browser_type", "browser_scroll", "browser_back", "browser_press",
         "browser_get_images", "browser_vision", "browser_console", "memory", "todo"]


def _property_order(schema: dict[str, Any]) -> list[Any]:
    """Property names in order, recursively into array items (the order the system turn shows)."""
    order: list[Any] = []
    for name, sub in (schema.get("properties") or {}).items():
        order.append(name)
        if isinstance(sub.get("items"), dict) and "properties" in sub["items"]:
            order.append(_property_order(sub["items"]))
    return order


@pytest.mark.parametrize("name", TOOLS)
def test_parameter_schema_is_the_originals(oracle: dict[str, Any], name: str) -> None:
    ours = registry.get(name).parameters
    theirs = oracle["tools"][name]["function"]["parameters"]
    assert without_descriptions(ours) == without_descriptions(theirs)
    assert _property_order(ours) == _property_order(theirs)


@pytest.mark.parametrize("toolset", ["code_execution", "web", "vision", "image_gen", "browser", "memory", "todo"])
def test_toolset_offers_the_originals_tools(oracle: dict[str, Any], toolset: str) -> None:
    """As a default batch run offers them: without the browser_cdp/browser_dialog pair, which the
    original offers only when a CDP URL is configured."""
    theirs = {d["function"]["name"] for d in oracle["tool_definitions_by_toolset"][toolset]}
    assert set(registry.toolsets[toolset]) == theirs - {"browser_cdp", "browser_dialog"}
