"""Compress one over-budget trajectory by summarising a middle span (SPEC §10).

The protected head (the first system, human, gpt and tool turns) and the last N turns are kept
verbatim. Between them, the smallest span of turns that brings the row under budget is replaced by
ONE `human` turn `[CONTEXT SUMMARY]: ...` written by a summariser model. A span boundary never
sits on a `tool` turn, so a gpt turn with tool calls and the tool turn answering it are kept or
summarised together and every remaining `tool` turn still follows its `gpt` call.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import itertools
import json
import re
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping, Sequence


from hermes_core.formats.compression.tokens import TURN_OVERHEAD, TokenCounter, turn_tokens
from hermes_core.fileio import append_jsonl_durable, read_jsonl
from hermes_core.endpoints.model_client import TRANSPORT_ERRORS, ModelClient, ModelError

SUMMARY_PREFIX = "[CONTEXT SUMMARY]:"
HEAD_ROLES = ("system", "human", "gpt", "tool")
SYSTEM_PROMPT = (
    "You compress the middle of an AI agent's conversation for a training dataset. The turns you are "
    "given will be replaced by your summary, so the rest of the conversation must still make sense "
    "after it. Be faithful and factual: never invent results."
)


@dataclass(frozen=True)
class CompressionConfig:
    target_max_tokens: int = 15250
    summary_target_tokens: int = 750
    protect_last_n_turns: int = 4
    sample_percent: float | None = None  # None = every row is eligible
    seed: int = 42
    concurrency: int = 8  # concurrent summariser calls
    timeout_s: float = 300.0  # per trajectory, retries included

    def __post_init__(self) -> None:
        for name in ("target_max_tokens", "summary_target_tokens", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.protect_last_n_turns < 0:
            raise ValueError(f"protect_last_n_turns must be >= 0 (got {self.protect_last_n_turns})")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout must be positive (got {self.timeout_s})")
        if self.sample_percent is not None and not 0 < self.sample_percent <= 100:
            raise ValueError(f"sample_percent must be in (0, 100] (got {self.sample_percent})")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "CompressionConfig":
        """Settings from YAML/JSON (recipe, run config): unknown keys and wrong types are refused."""
        kinds: dict[str, tuple[type, ...]] = {
            f.name: (int, float, type(None)) if f.name == "sample_percent" else
            (int, float) if f.name == "timeout_s" else (int,) for f in fields(cls)
        }
        for key, value in data.items():
            if key not in kinds:
                raise ValueError(f"unknown compression setting {key!r}; known: {', '.join(kinds)}")
            if isinstance(value, bool) or not isinstance(value, kinds[key]):
                raise ValueError(f"compression setting {key!r}: wrong type {type(value).__name__}")
        return cls(**data)

    def summary_estimate(self, counter: TokenCounter) -> int:
        """Tokens the summary turn is planned to cost (the model is asked for this length)."""
        return self.summary_target_tokens + counter.count_many([SUMMARY_PREFIX + " "])[0] + TURN_OVERHEAD


@dataclass(frozen=True)
class Plan:
    start: int  # first summarised turn
    end: int  # first kept turn after the span (exclusive)
    span_tokens: int
    reaches_budget: bool  # False: even the largest allowed span leaves the row over budget


def plan_span(roles: Sequence[str], counts: Sequence[int], target: int, summary_estimate: int,
              protect_last_n_turns: int) -> Plan | str:
    """The span to summarise, or the reason to leave the row alone."""
    firsts = [roles.index(role) for role in HEAD_ROLES if role in roles]
    head_end = max(firsts) + 1 if firsts else 0
    tail_start = max(head_end, len(roles) - protect_last_n_turns)
    # A boundary on a tool turn would separate it from the gpt turn whose calls it answers.
    bounds = [b for b in range(head_end, tail_start + 1) if b == len(roles) or roles[b] != "tool"]
    if len(bounds) < 2:
        return "no_compressible_span"
    prefix = list(itertools.accumulate(counts, initial=0))
    at_bound = [prefix[b] for b in bounds]  # strictly increasing: every turn costs >= TURN_OVERHEAD
    need = prefix[-1] - target + summary_estimate
    best: tuple[int, int] | None = None
    for i, start in enumerate(bounds[:-1]):
        j = bisect.bisect_left(at_bound, prefix[start] + need, lo=i + 1)
        # Fewest turns wins; on a tie the earlier span, so the most recent context stays verbatim.
        if j < len(bounds) and (best is None or bounds[j] - start < best[1] - best[0]):
            best = (start, bounds[j])
    start, end = best or (bounds[0], bounds[-1])
    span_tokens = prefix[end] - prefix[start]
    if span_tokens <= summary_estimate:
        return "would_not_save_tokens"
    return Plan(start, end, span_tokens, best is not None)


def summary_request(turns: Sequence[dict[str, Any]], target_tokens: int) -> dict[str, Any]:
    """The chat-completions body asking for the summary of `turns`."""
    transcript = "\n\n".join(f"[{turn.get('from')}]:\n{turn.get('value')}" for turn in turns)
    instruction = (
        f"Summarize the following {len(turns)} conversation turns in at most {target_tokens} tokens. "
        "Keep what is needed to follow the rest of the conversation: the goal, each tool used and its "
        "key results (paths, commands, values, errors), decisions made and what is still open. Write "
        "plain prose in the past tense, without <tool_call> or <tool_response> markup."
    )
    return {
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"{instruction}\n\n<conversation>\n{transcript}\n</conversation>"},
        ],
        # Headroom over the target, but a cap: a runaway summary must not cost a whole context.
        "max_tokens": 2 * target_tokens,
    }


# A leading "Summary:" / "**Summary:**" / "[CONTEXT SUMMARY]:" label; we add our own prefix.
_LABEL = re.compile(r"^[#*\s]*\[?(?:context\s+)?summary\]?\s*\**\s*:\s*\**\s*", re.I)


def clean_summary(content: Any) -> str:
    """The summary text without inline reasoning or a label the model put in front of it."""
    text = re.sub(r"<think>.*?</think>", "", content if isinstance(content, str) else "", flags=re.S).strip()
    return _LABEL.sub("", text, count=1).strip()


class SummaryCache:
    """Summaries already paid for, keyed by the exact request and model: re-running after failures
    or a crash only asks the model for spans it has not summarised yet."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._entries = {r["key"]: r["summary"] for r in read_jsonl(path)} if path and path.is_file() else {}

    @staticmethod
    def key(model: str, body: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps([model, body], sort_keys=True).encode()).hexdigest()

    def get(self, key: str) -> str | None:
        return self._entries.get(key)

    def put(self, key: str, summary: str) -> None:
        self._entries[key] = summary
        if self.path:
            append_jsonl_durable(self.path, {"key": key, "summary": summary})


class SummaryFailed(RuntimeError):
    """No usable summary for a span (endpoint error after retries, empty answer, timeout)."""


class Summariser:
    """Calls the summariser model; at most `concurrency` calls run at once, sharing one client."""

    def __init__(self, client: ModelClient, config: CompressionConfig, cache: SummaryCache) -> None:
        self.client, self.config, self.cache = client, config, cache
        self.slot = asyncio.Semaphore(config.concurrency)
        self.calls = self.cache_hits = self.prompt_tokens = self.completion_tokens = 0

    async def summarise(self, turns: Sequence[dict[str, Any]]) -> str:
        body = summary_request(turns, self.config.summary_target_tokens)
        key = SummaryCache.key(self.client.endpoint.model, body)
        cached = self.cache.get(key)
        if cached is not None:
            self.cache_hits += 1
            return cached
        try:
            completion = await asyncio.wait_for(self.client.complete(body), self.config.timeout_s)
        except asyncio.TimeoutError as exc:
            raise SummaryFailed(f"timed out after {self.config.timeout_s:g}s") from exc
        except (ModelError, *TRANSPORT_ERRORS) as exc:
            raise SummaryFailed(str(exc)) from exc
        finally:
            self.calls += 1
        self.prompt_tokens += completion.usage.get("prompt_tokens", 0)
        self.completion_tokens += completion.usage.get("completion_tokens", 0)
        text = clean_summary(completion.message.get("content"))
        if not text:
            raise SummaryFailed(f"empty summary (finish_reason={completion.finish_reason})")
        self.cache.put(key, text)
        return text


def row_metrics(original: int, target: int, started: float, *, compressed_tokens: int | None = None,
                plan: Plan | None = None, summary_tokens: int = 0, reason: str | None = None) -> dict[str, Any]:
    """Per-row `compression_metrics`; `still_over_budget` is about the row as written."""
    final = original if compressed_tokens is None else compressed_tokens
    return {
        "original_tokens": original,
        "compressed_tokens": final,
        "turns_removed": plan.end - plan.start if plan and compressed_tokens is not None else 0,
        "compressed": compressed_tokens is not None,
        "still_over_budget": final > target,
        "skipped_reason": reason,
        "summary_tokens": summary_tokens,
        "duration_s": round(time.monotonic() - started, 3),
        "span": [plan.start, plan.end] if plan and compressed_tokens is not None else None,
    }


def with_metrics(raw_line: str, row: dict[str, Any], metrics: dict[str, Any]) -> str:
    """The row's line plus `compression_metrics`. The original bytes are kept when possible, so an
    untouched row differs from its input only by the added key."""
    body = raw_line.rstrip()
    if "compression_metrics" not in row and body.endswith("}"):
        head = body[:-1].rstrip()
        separator = "" if head.endswith("{") else ", "
        return f'{head}{separator}"compression_metrics": {json.dumps(metrics)}}}'
    return json.dumps({**row, "compression_metrics": metrics}, ensure_ascii=False)


async def compress_row(raw_line: str, row: dict[str, Any], config: CompressionConfig, counter: TokenCounter,
                       summariser: Summariser | None, sampled: bool = True) -> tuple[str, dict[str, Any]]:
    """(output line, metrics) of one row. `summariser=None` is a dry run: the plan is costed with the
    summary's target length and nothing is called."""
    started = time.monotonic()
    turns: list[dict[str, Any]] = row["conversations"]
    counts = turn_tokens(turns, counter)
    original, target = sum(counts), config.target_max_tokens

    def unchanged(reason: str) -> tuple[str, dict[str, Any]]:
        metrics = row_metrics(original, target, started, reason=reason)
        return with_metrics(raw_line, row, metrics), metrics

    if not sampled:
        return unchanged("not_sampled")
    if original <= target:
        return unchanged("under_budget")
    estimate = config.summary_estimate(counter)
    plan = plan_span([str(t.get("from")) for t in turns], counts, target, estimate, config.protect_last_n_turns)
    if isinstance(plan, str):
        return unchanged(plan)
    if summariser is None:
        metrics = row_metrics(original, target, started, compressed_tokens=original - plan.span_tokens + estimate,
                              plan=plan, summary_tokens=estimate)
        return raw_line, metrics
    async with summariser.slot:
        started = time.monotonic()  # the row's clock starts when it gets a summariser slot
        try:
            summary = await summariser.summarise(turns[plan.start:plan.end])
        except SummaryFailed as exc:
            return unchanged(f"summary_failed: {exc}")
    summary_turn = {"from": "human", "value": f"{SUMMARY_PREFIX} {summary}"}
    summary_tokens = turn_tokens([summary_turn], counter)[0]
    compressed_tokens = original - plan.span_tokens + summary_tokens
    if compressed_tokens >= original:
        return unchanged("summary_not_smaller")
    new_turns = [*turns[:plan.start], summary_turn, *turns[plan.end:]]
    metrics = row_metrics(original, target, started, compressed_tokens=compressed_tokens, plan=plan,
                          summary_tokens=summary_tokens)
    return json.dumps({**row, "conversations": new_turns, "compression_metrics": metrics}, ensure_ascii=False), metrics
