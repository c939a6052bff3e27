"""Issue 19, the terminal toolset: `terminal` and `process` have the original's parameter schemas
(names, types, enums, required, defaults, bounds; descriptions excluded) in the original's property order."""

from __future__ import annotations

from typing import Any

import pytest

from conformance.test_hermes_agent_oracle import without_descriptions
from hermes_core.tools import registry


@pytest.mark.parametrize("name", ["terminal", "process"])
def test_parameter_schema_is_the_originals(oracle: dict[str, Any], name: str) -> None:
    ours = registry.get(name).parameters
    theirs = oracle["tools"][name]["function"]["parameters"]
    assert without_descriptions(ours) == without_descriptions(theirs)
    assert list(ours["properties"]) == list(theirs["properties"])
    assert ours["required"] == theirs["required"]
