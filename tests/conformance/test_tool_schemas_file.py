"""Issue 19, toolset "file": read_file, write_file, patch and search_files have the original's
parameter schemas (names, types, enums, required, defaults, bounds and property order;
descriptions are our own words and not compared)."""

from __future__ import annotations

from typing import Any

import pytest

from hermes_core.tools import registry
from conformance.test_hermes_agent_oracle import without_descriptions

FILE_TOOLS = ["read_file", "write_file", "patch", "search_files"]


@pytest.mark.parametrize("name", FILE_TOOLS)
def test_file_tool_schema_is_the_originals(oracle: dict[str, Any], name: str) -> None:
    ours = registry.get(name).parameters
    theirs = oracle["tools"][name]["function"]["parameters"]
    assert without_descriptions(ours) == without_descriptions(theirs)
    assert list(ours["properties"]) == list(theirs["properties"])  # order: the system turn's bytes
    assert ours["required"] == theirs["required"]


def test_the_file_toolset_is_the_originals(oracle: dict[str, Any]) -> None:
    assert sorted(registry.toolsets["file"]) == sorted(oracle["toolsets"]["file"])
