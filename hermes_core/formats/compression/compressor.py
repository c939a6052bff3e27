"""Compress one over-budget trajectory by summarising a middle span (SPEC §10).

The protected head (the first system, human, gpt and tool turns) and the last N turns are kept
verbatim (each head role can be unprotected, as in the original's `protected_turns`). Between
them, the smallest span of turns that brings the row under budget is replaced by ONE `human` turn
`[CONTEXT SUMMARY]: ...` written by a summariser model, and the system turn before it gets the
summary notice. A span boundary never sits on a `tool` turn, so a gpt turn with tool calls and the
tool turn answering it are kept or summarised together and every remaining `tool` turn still
follows its `gpt` call.
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
from typing import TYPE_CHECKING, Any, Mapping, Sequence


from hermes_core.formats.compression.metrics import row_metrics
from hermes_core.formats.compression.tokens import TURN_OVERHEAD, TokenCounter, turn_tokens
from hermes_core.fileio import append_record, read_jsonl
from hermes_core.endpoints.errors import ModelError

if TYPE_CHECKING:  # aiohttp only where a summariser runs: the Dagster definitions import this module
    from hermes_core.endpoints.model_client import ModelClient

SUMMARY_PREFIX = "[CONTEXT SUMMARY]:"
HEAD_ROLES = ("system", "human", "gpt", "tool")
# Appended to the system turn of a compressed row (our wording; `summary_notice_text` sets any other).
SUMMARY_NOTICE = "\n\nEarlier parts of this conversation may have been condensed into a summary."
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
    protect_first_system: bool = True
    protect_first_human: bool = True
    protect_first_gpt: bool = True
    protect_first_tool: bool = True
    temperature: float | None = 0.3  # of the summariser; None: the endpoint's default
    add_summary_notice: bool = True
    summary_notice_text: str = SUMMARY_NOTICE
    save_over_limit: bool = True  # False: rows still over budget are left out of the output
    per_trajectory_metrics: bool = True  # False: rows get no `compression_metrics`

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
        kinds = cls.kinds()
        for key, value in data.items():
            if key not in kinds:
                raise ValueError(f"unknown compression setting {key!r}; known: {', '.join(kinds)}")
            if isinstance(value, bool) != (bool in kinds[key]) or not isinstance(value, kinds[key]):
                raise ValueError(f"compression setting {key!r}: wrong type {type(value).__name__}")
        return cls(**data)

    @classmethod
    def kinds(cls) -> dict[str, tuple[type, ...]]:
        """The accepted value types of each setting (a bool is never taken for a number)."""
        special: dict[str, tuple[type, ...]] = {
            "sample_percent": (int, float, type(None)), "timeout_s": (int, float),
            "temperature": (int, float, type(None)), "summary_notice_text": (str,)}
        return {f.name: special.get(f.name) or ((bool,) if isinstance(f.default, bool) else (int,))
                for f in fields(cls)}

    @property
    def head_roles(self) -> tuple[str, ...]:
        """The roles whose first turn is protected."""
        return tuple(role for role in HEAD_ROLES if getattr(self, f"protect_first_{role}"))

    def summary_estimate(self, counter: TokenCounter) -> int:
        """Tokens the summary turn is planned to cost (the model is asked for this length)."""
        texts = [SUMMARY_PREFIX + " "] + ([self.summary_notice_text] if self.add_summary_notice else [])
        return self.summary_target_tokens + sum(counter.count_many(texts)) + TURN_OVERHEAD


@dataclass(frozen=True)
class Plan:
    start: int  # first summarised turn
    end: int  # first kept turn after the span (exclusive)
    span_tokens: int
    reaches_budget: bool  # False: even the largest allowed span leaves the row over budget


def plan_span(roles: Sequence[str], counts: Sequence[int], target: int, summary_estimate: int,
              protect_last_n_turns: int, head_roles: Sequence[str] = HEAD_ROLES) -> Plan | str:
    """The span to summarise, or the reason to leave the row alone."""
    firsts = [roles.index(role) for role in head_roles if role in roles]
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


def summary_request(turns: Sequence[dict[str, Any]], target_tokens: int,
                    temperature: float | None = None) -> dict[str, Any]:
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
        **({} if temperature is None else {"temperature": temperature}),
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
            append_record(self.path, {"key": key, "summary": summary})


class SummaryFailed(RuntimeError):
    """No usable summary for a span (endpoint error after retries, empty answer, timeout)."""

    def __init__(self, message: str, calls: int = 1) -> None:
        super().__init__(message)
        self.calls = calls  # model calls made for it (retries included)


class Summariser:
    """Calls the summariser model; at most `concurrency` calls run at once, sharing one client."""

    def __init__(self, client: ModelClient, config: CompressionConfig, cache: SummaryCache) -> None:
        self.client, self.config, self.cache = client, config, cache
        self.slot = asyncio.Semaphore(config.concurrency)
        self.calls = self.cache_hits = self.prompt_tokens = self.completion_tokens = 0

    async def summarise(self, turns: Sequence[dict[str, Any]]) -> tuple[str, int]:
        """(summary, model calls made: 0 from the cache, more than 1 after retries)."""
        from hermes_core.endpoints.model_client import TRANSPORT_ERRORS  # loaded already: a client exists

        body = summary_request(turns, self.config.summary_target_tokens, self.config.temperature)
        key = SummaryCache.key(self.client.endpoint.model, body)
        cached = self.cache.get(key)
        if cached is not None:
            self.cache_hits += 1
            return cached, 0
        try:
            completion = await asyncio.wait_for(self.client.complete(body), self.config.timeout_s)
        except asyncio.TimeoutError as exc:
            raise SummaryFailed(f"timed out after {self.config.timeout_s:g}s") from exc
        except (ModelError, *TRANSPORT_ERRORS) as exc:
            # A retryable error surfaced after every retry was spent.
            retried = isinstance(exc, ModelError) and exc.retryable
            raise SummaryFailed(str(exc), 1 + self.client.endpoint.max_retries if retried else 1) from exc
        finally:
            self.calls += 1
        self.prompt_tokens += completion.usage.get("prompt_tokens", 0)
        self.completion_tokens += completion.usage.get("completion_tokens", 0)
        text = clean_summary(completion.message.get("content"))
        if not text:
            raise SummaryFailed(f"empty summary (finish_reason={completion.finish_reason})", completion.attempts)
        self.cache.put(key, text)
        return text, completion.attempts


def with_metrics(raw_line: str, row: dict[str, Any], metrics: dict[str, Any] | None) -> str:
    """The row's line plus `compression_metrics` (none: the line as it was). The original bytes are
    kept when possible, so an untouched row differs from its input only by the added key."""
    body = raw_line.rstrip()
    if metrics is None:
        return body
    if "compression_metrics" not in row and body.endswith("}"):
        head = body[:-1].rstrip()
        separator = "" if head.endswith("{") else ", "
        return f'{head}{separator}"compression_metrics": {json.dumps(metrics)}}}'
    return json.dumps({**row, "compression_metrics": metrics}, ensure_ascii=False)


def with_notice(turns: Sequence[dict[str, Any]], config: CompressionConfig) -> list[dict[str, Any]]:
    """The turns before the summary, the system turn(s) among them carrying the summary notice."""
    if not config.add_summary_notice:
        return list(turns)
    return [{**t, "value": t["value"] + config.summary_notice_text} if t.get("from") == "system" else t
            for t in turns]


async def compress_row(raw_line: str, row: dict[str, Any], config: CompressionConfig, counter: TokenCounter,
                       summariser: Summariser | None) -> tuple[str, dict[str, Any]]:
    """(output line, metrics) of one row. `summariser=None` is a dry run: the plan is costed with the
    summary's target length and nothing is called."""
    started = time.monotonic()
    turns: list[dict[str, Any]] = row["conversations"]
    counts = turn_tokens(turns, counter)
    original, target = sum(counts), config.target_max_tokens
    keep = config.per_trajectory_metrics

    def unchanged(reason: str, calls: int = 0, errors: int = 0) -> tuple[str, dict[str, Any]]:
        metrics = row_metrics(original, len(turns), target, started, reason=reason, calls=calls, errors=errors)
        return with_metrics(raw_line, row, metrics if keep else None), metrics

    if original <= target:
        return unchanged("under_budget")
    estimate = config.summary_estimate(counter)
    plan = plan_span([str(t.get("from")) for t in turns], counts, target, estimate, config.protect_last_n_turns,
                     config.head_roles)
    if isinstance(plan, str):
        return unchanged(plan)
    if summariser is None:
        metrics = row_metrics(original, len(turns), target, started, span=(plan.start, plan.end),
                              summary_tokens=estimate,
                              compressed_tokens=original - plan.span_tokens + estimate,
                              compressed_turns=len(turns) - (plan.end - plan.start) + 1)
        return raw_line, metrics
    async with summariser.slot:
        started = time.monotonic()  # the row's clock starts when it gets a summariser slot
        try:
            summary, calls = await summariser.summarise(turns[plan.start:plan.end])
        except SummaryFailed as exc:
            return unchanged(f"summary_failed: {exc}", exc.calls, exc.calls)
    summary_turn = {"from": "human", "value": f"{SUMMARY_PREFIX} {summary}"}
    new_turns = [*with_notice(turns[:plan.start], config), summary_turn, *turns[plan.end:]]
    new_counts = turn_tokens(new_turns, counter)
    if sum(new_counts) >= original:
        return unchanged("summary_not_smaller", calls, max(calls - 1, 0))
    metrics = row_metrics(original, len(turns), target, started, compressed_tokens=sum(new_counts),
                          compressed_turns=len(new_turns), span=(plan.start, plan.end),
                          summary_tokens=new_counts[plan.start],
                          calls=calls, errors=max(calls - 1, 0))
    out = {**row, "conversations": new_turns, **({"compression_metrics": metrics} if keep else {})}
    return json.dumps(out, ensure_ascii=False), metrics
