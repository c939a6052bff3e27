"""Scored groups: a task's rollouts, tokenized, as one record keyed by content, and the durable ledger
of them, so a finished group is never paid for again and a changed task re-runs only itself."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from hermes_core.batch.workers import NextIndex, process_count, run_in_processes
from hermes_core.environments.rollout import Rollout, RolloutSettings, run_rollout
from hermes_core.environments.tasks import Task
from hermes_core.environments.tokens import IGNORE, ChatTokenizer, render_tokens
from hermes_core.fileio import append_record, read_jsonl
from hermes_core.formats.sharegpt import tool_stats
from hermes_core.sandbox import SandboxBackend

if TYPE_CHECKING:  # aiohttp loads where groups run: the runs file and the Dagster definitions import this module
    import aiohttp


class GroupFailed(RuntimeError):
    """A member kept failing after its retries, or cannot be trained on: the group is not scored
    (never a silent 0), and runs again next time."""


def settings_fingerprint(settings: RolloutSettings, group_size: int) -> str:
    """What a group's rollouts depend on besides the task: a change makes every group new."""
    identity = {"model": settings.endpoint.model, "distribution": settings.distribution.probabilities,
                "seed": settings.seed, "max_turns": settings.max_turns, "temperature": settings.temperature,
                "max_tokens": settings.max_tokens, "tool_call_mode": settings.tool_call_mode,
                "system_prompt": settings.system_prompt, "group_size": group_size}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()[:16]


def group_key(task: Task, group: int, fingerprint: str) -> str:
    return hashlib.sha256(f"{task.key}:{group}:{fingerprint}".encode("utf-8")).hexdigest()


async def rollout_with_retries(task: Task, group: int, member: int, settings: RolloutSettings,
                               backend: SandboxBackend, retries: int,
                               http: aiohttp.ClientSession | None = None) -> Rollout:
    """A scored rollout, retried while its model, sandbox or verifier fails; GroupFailed after that."""
    for _attempt in range(retries + 1):
        done = await run_rollout(task, group, member, settings, backend, http)
        if done.error is None:
            return done
    raise GroupFailed(f"task {task.id}, group {group}, member {member}: {done.error}")


def _rollout_facts(rollout: Rollout) -> dict[str, Any]:
    _, failures = tool_stats(rollout.messages, [])
    return {"member": rollout.member, "key": rollout.key, "reward": rollout.reward, "detail": rollout.detail,
            "toolsets": rollout.toolsets, "tools": rollout.tools, "api_calls": rollout.api_calls,
            "usage": rollout.usage, "served_model": rollout.served_model, "toolset_seed": rollout.toolset_seed,
            "turns": sum(m["role"] == "assistant" for m in rollout.messages), "tool_errors": sum(failures.values())}


def group_record(task: Task, group: int, rollouts: list[Rollout], tokenizer: ChatTokenizer,
                 fingerprint: str, model: str) -> dict[str, Any]:
    """The group as stored: every sequence's tokens and masks, scores, messages and what made them."""
    tokens, masks = [], []
    for rollout in rollouts:
        tokenized = render_tokens(tokenizer, rollout.messages, rollout.tools)
        if tokenized.trained == 0:
            raise GroupFailed(f"task {task.id}, member {rollout.member}: no assistant token to train on")
        tokens.append(tokenized.tokens)
        masks.append(tokenized.masks)
    return {"key": group_key(task, group, fingerprint), "task_id": task.id, "task_key": task.key,
            "category": task.category, "split": task.split, "group": group, "fingerprint": fingerprint,
            "model": model, "token_source": tokenized.source, "chat_template": tokenized.template,
            "scores": [r.reward for r in rollouts], "tokens": tokens, "masks": masks,
            "messages": [[{**m, "content": m.get("content") or ""} for m in r.messages] for r in rollouts],
            "rollouts": [_rollout_facts(r) for r in rollouts]}


def scored_data(record: dict[str, Any]) -> dict[str, Any]:
    """The record as atroposlib's scored data group (what its API server and trainers take)."""
    return {"tokens": record["tokens"], "masks": record["masks"], "scores": record["scores"],
            "messages": record["messages"], "advantages": None, "ref_logprobs": None, "inference_logprobs": None,
            "images": None, "overrides": None, "generation_params": None, "distill_token_ids": None,
            "distill_logprobs": None,
            "group_overrides": {"token_source": record["token_source"], "chat_template": record["chat_template"],
                                "task_id": record["task_id"], "task_key": record["task_key"], "group": record["group"]}}


def alignment_problems(record: dict[str, Any]) -> list[str]:
    """Why a trainer could not use the record: tokens, masks and scores misaligned, a mask that is
    neither -100 nor its token, a sequence with nothing to train on."""
    problems = []
    if not len(record["tokens"]) == len(record["masks"]) == len(record["scores"]):
        problems.append(f"{len(record['tokens'])} sequences, {len(record['masks'])} masks, "
                        f"{len(record['scores'])} scores")
    for index, (tokens, masks) in enumerate(zip(record["tokens"], record["masks"])):
        if len(tokens) != len(masks):
            problems.append(f"sequence {index}: {len(tokens)} tokens, {len(masks)} mask entries")
        elif any(m not in (IGNORE, t) for t, m in zip(tokens, masks)):
            problems.append(f"sequence {index}: a mask entry is neither -100 nor its token")
        elif all(m == IGNORE for m in masks):
            problems.append(f"sequence {index}: no trained token")
    return problems


class GroupLedger:
    """`groups.jsonl` of an environment run: one durable line per scored group, appended as it ends."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def records(self) -> dict[str, dict[str, Any]]:
        """Scored groups by key (a torn last line from a crash is skipped; the last record of a key wins)."""
        if not self.path.is_file():
            return {}
        return {record["key"]: record for record in read_jsonl(self.path) if "key" in record}

    def append(self, record: dict[str, Any]) -> None:
        append_record(self.path, record)


class _GroupPool:
    """Groups to score, served by sessions in this process or in forked worker processes (the
    batch runner's workers.py: one event loop, hence one GIL, per process)."""

    def __init__(self, todo: list[tuple[Task, int]], settings: RolloutSettings, group_size: int,
                 backend: SandboxBackend, tokenizer: ChatTokenizer, fingerprint: str, retries: int) -> None:
        self.todo, self.settings, self.group_size, self.backend = todo, settings, group_size, backend
        self.tokenizer, self.fingerprint, self.retries = tokenizer, fingerprint, retries

    async def group(self, index: int, http: aiohttp.ClientSession) -> dict[str, Any]:
        """The scored record of job `index`, or `{"failed": why}`."""
        task, group = self.todo[index]
        try:
            rollouts = await asyncio.gather(*(rollout_with_retries(task, group, member, self.settings, self.backend,
                                                                   self.retries, http)
                                              for member in range(self.group_size)))
            return group_record(task, group, list(rollouts), self.tokenizer, self.fingerprint,
                                self.settings.endpoint.model)
        except GroupFailed as exc:
            return {"failed": str(exc)}

    async def serve(self, positions: list[int], next_index: NextIndex,
                    on_done: Callable[[int, dict[str, Any]], None]) -> None:
        # Sandboxes open and verifiers run in threads: enough for every rollout in flight.
        asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor(
            max_workers=len(positions) * self.group_size * 2 + 4, thread_name_prefix="hermes-rollout"))

        from hermes_core.endpoints.model_client import http_session

        # One connection pool for the process's rollouts (a session per rollout set up TLS and sockets again).
        async with http_session(self.settings.endpoint.request_timeout_s,
                                connections=len(positions) * self.group_size) as http:

            async def session(position: int) -> None:
                while (index := await next_index(position)) is not None:
                    on_done(index, await self.group(index, http))

            await asyncio.gather(*(session(position) for position in positions))


def run_groups(jobs: list[tuple[Task, int]], settings: RolloutSettings, group_size: int,
               backend: SandboxBackend, tokenizer: ChatTokenizer, ledger: GroupLedger, *,
               retries: int = 2, concurrency: int = 8, done: dict[str, dict[str, Any]] | None = None,
               on_group: Callable[[dict[str, Any] | GroupFailed], None] = lambda _: None) -> dict[str, int]:
    """Blocking: every (task, group) whose key the ledger lacks, `concurrency` groups at once (over
    worker processes from 16 groups up); this process appends each scored group the moment it ends.
    Returns counts: run, skipped (already scored), failed. `done`: the ledger's records, when read already."""
    fingerprint = settings_fingerprint(settings, group_size)
    done = ledger.records() if done is None else done
    todo = [(task, group) for task, group in jobs if group_key(task, group, fingerprint) not in done]
    counts = {"run": 0, "skipped": len(jobs) - len(todo), "failed": 0}
    if not todo:
        return counts

    def record(result: dict[str, Any]) -> None:
        if "failed" in result:
            counts["failed"] += 1
            on_group(GroupFailed(result["failed"]))
        else:
            ledger.append(result)
            counts["run"] += 1
            on_group(result)

    pool = _GroupPool(todo, settings, group_size, backend, tokenizer, fingerprint, retries)
    sessions = min(concurrency, len(todo))
    processes = process_count(sessions)
    if processes > 1:
        def record_all(results: list[dict[str, Any]]) -> None:
            for result in results:
                record(result)

        run_in_processes(len(todo), sessions, processes, pool.serve, backend, record_all, lambda: None)
        return counts
    pending = deque(range(len(todo)))

    async def next_index(_position: int) -> int | None:
        return pending.popleft() if pending else None

    asyncio.run(pool.serve(list(range(sessions)), next_index, lambda _index, result: record(result)))
    return counts
