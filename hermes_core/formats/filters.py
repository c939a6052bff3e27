"""Sample dispositions and the quality filters (SPEC §7)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hermes_core.formats.sharegpt import iter_tool_calls, reasoning_coverage


@dataclass(frozen=True)
class FilterSettings:
    require_reasoning: bool = True  # off for models that do not emit reasoning
    reject_hallucinated_tools: bool = True
    strict_offered_tools: bool = False  # a tool outside those offered to the sample counts as hallucinated
    discard_incomplete: bool = False  # drop trajectories that hit max_iterations (completed: false)


class Disposition:
    """How a sample ended; exactly one per sample, stored in its record."""

    KEPT = "kept"
    DISCARDED_NO_REASONING = "discarded_no_reasoning"
    DISCARDED_HALLUCINATED_TOOL = "discarded_hallucinated_tool"
    DISCARDED_INCOMPLETE = "discarded_incomplete"
    FAILED_RETRYABLE = "failed_retryable"
    FAILED_TERMINAL = "failed_terminal"
    ALL = frozenset({KEPT, DISCARDED_NO_REASONING, DISCARDED_HALLUCINATED_TOOL, DISCARDED_INCOMPLETE,
                     FAILED_RETRYABLE, FAILED_TERMINAL})
    # Done for good: a resume never re-runs (or pays for) these again.
    FINAL = ALL - {FAILED_RETRYABLE}


def hallucinated_tools(
    messages: list[dict[str, Any]], universe: list[str], offered: list[str] | None = None
) -> list[str]:
    """Called tool names outside the universe (and outside `offered` when given), first-call order."""
    allowed = set(universe) if offered is None else set(universe) & set(offered)
    names = [name for _, name, _ in iter_tool_calls(messages) if name not in allowed]
    return list(dict.fromkeys(names))


def classify(
    messages: list[dict[str, Any]],
    *,
    completed: bool,
    universe: list[str],
    offered: list[str],
    settings: FilterSettings,
) -> str:
    """Disposition of a trajectory the model finished (failures are decided by the runner).

    Order: hallucinated tool, then missing reasoning, then incomplete — a wrong tool name is the
    more specific defect, so it is the reason reported when several apply.
    """
    if settings.reject_hallucinated_tools and hallucinated_tools(
        messages, universe, offered if settings.strict_offered_tools else None
    ):
        return Disposition.DISCARDED_HALLUCINATED_TOOL
    if settings.require_reasoning and reasoning_coverage(messages)[1] == 0:
        return Disposition.DISCARDED_NO_REASONING
    if settings.discard_incomplete and not completed:
        return Disposition.DISCARDED_INCOMPLETE
    return Disposition.KEPT
