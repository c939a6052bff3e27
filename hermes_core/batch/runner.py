"""Runs sample jobs through one pool of concurrent agent sessions and records each as it ends.

One pool spans all batches of an invocation, so there is no idle tail at the end of each batch;
records are handed to `on_records` the moment a sample finishes (the ledger fsyncs them). A pool of
many sessions is spread over worker processes (workers.py), its records still handed to
`on_records` in this process, those that arrived together at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections import deque
from typing import Any, Callable

import aiohttp

from hermes_core.agent.loop import AIAgent
from hermes_core.config import Endpoint, usable_cores
from hermes_core.endpoints.model_client import http_session
from hermes_core.batch.records import RunContext, SampleJob, build_record
from hermes_core.batch.recipe import Recipe
from hermes_core.batch.workers import NextIndex, process_count, run_in_processes
from hermes_core.sandbox import Sandbox, SandboxBackend
from hermes_core.tools.backends import ToolBackends


# Sessions start one per START_GAP_CORE_S ÷ cores (15 ms apart on 2 cores), at most MAX_START_SPREAD_S
# after the first: see _Sessions.serve.
START_GAP_CORE_S = 0.03
MAX_START_SPREAD_S = 2.0


def run_jobs(
    jobs: list[SampleJob],
    recipe: Recipe,
    endpoint: Endpoint,
    ctx: RunContext,
    backend: SandboxBackend,
    on_records: Callable[[list[dict[str, Any]]], None],
    stop: Callable[[], str | None] = lambda: None,
) -> None:
    """Blocking: run every job with at most `recipe.num_workers` sessions at once; `on_records` gets
    the records that finished together (in one process, one at a time). Once `stop()`
    gives a reason, no new job starts; the ones in flight finish and are recorded. With many
    sessions they run in worker processes (`workers.process_count`); a worker that dies raises
    `workers.WorkerFailed` once the others have finished."""
    if not jobs:
        return
    sessions = min(recipe.num_workers, len(jobs))
    pool = _Sessions(jobs, recipe, endpoint, ctx, backend)
    processes = process_count(sessions)
    if processes > 1:
        run_in_processes(len(jobs), sessions, processes, pool.serve, backend, on_records, stop)
        return
    queue = deque(range(len(jobs)))

    async def next_index(_position: int) -> int | None:
        return queue.popleft() if queue and not stop() else None

    asyncio.run(pool.serve(list(range(sessions)), next_index, lambda _index, record: on_records([record])))


class _Sessions:
    """Agent sessions over `jobs`, in whichever process serves them."""

    def __init__(self, jobs: list[SampleJob], recipe: Recipe, endpoint: Endpoint, ctx: RunContext,
                 backend: SandboxBackend) -> None:
        self.jobs, self.recipe, self.endpoint, self.ctx, self.backend = jobs, recipe, endpoint, ctx, backend
        self.tool_backends = ToolBackends.resolve(recipe.tool_backends)  # once: the environment as the run starts
        self.sample_budget = recipe.sample_budget()

    async def session(self, job: SampleJob, http: aiohttp.ClientSession,
                      sandboxes: _ClosedBehind) -> dict[str, Any]:
        recipe, endpoint = self.recipe, self.endpoint
        agent = AIAgent(
            model=endpoint.model, base_url=endpoint.base_url, api_key=endpoint.api_key, quiet_mode=True,
            enabled_toolsets=job.toolsets, max_iterations=recipe.max_turns,
            ephemeral_system_prompt=recipe.ephemeral_system_prompt,
            request_options=recipe.request_options(),  # reasoning, provider routing, prefill, as the original sends them
            max_tokens=recipe.max_tokens, temperature=recipe.temperature, stream=recipe.stream,
            max_retries=endpoint.max_retries, backoff_base_s=endpoint.backoff_base_s,
            request_timeout_s=endpoint.request_timeout_s, sample_timeout_s=endpoint.sample_timeout_s,
            max_concurrent_requests=endpoint.max_concurrent_requests,
            sandbox_backend=sandboxes, close_sandbox=sandboxes.close_later, image=job.sample.image,
            cwd=job.sample.cwd, http_client=http,
            tool_call_mode=recipe.tool_call_mode, tool_backends=self.tool_backends, sample_budget=self.sample_budget,
            hermes_text=self.ctx.hermes_text,
        )
        result = await agent.arun_conversation(job.sample.prompt, task_id=job.sample.sample_key[:16])
        return build_record(job, result, self.ctx)

    async def serve(self, positions: list[int], next_index: NextIndex,
                    on_done: Callable[[int, dict[str, Any]], None]) -> None:
        """One session per position until `next_index` gives None; each record to `on_done`."""
        # Tools run in threads: one per session, or sessions would queue behind each other's commands.
        asyncio.get_running_loop().set_default_executor(
            concurrent.futures.ThreadPoolExecutor(max_workers=len(positions) + 4, thread_name_prefix="hermes-tool")
        )
        closer = concurrent.futures.ThreadPoolExecutor(max_workers=len(positions), thread_name_prefix="hermes-close")
        gap = START_GAP_CORE_S / usable_cores()
        if any(job.toolsets and job.sample.image is None for job in self.jobs):  # their sandboxes open at once
            self.backend.prepare(len(positions))
        async with http_session(self.endpoint.request_timeout_s, connections=len(positions)) as http:

            async def worker(position: int) -> None:
                # Staggered starts: sessions started together stay in lockstep, each model reply
                # and each sandbox command arriving for all of them at once, so every burst queues
                # for the CPU. 15 ms apart on 2 cores (64 sessions: ~1 s, once per run) the work
                # spreads over the cycle: 64 x 2,000 went from 40 to 36 s of sampling. The cap
                # bounds what a spread costs at the end (a session that started S later still runs
                # its last sample when the others are done: ~0.8 S at 1,024 sessions); with slots
                # made ahead and cheap to make, 1,024 sessions at 5 s per call took 115-116 s
                # capped at 1-2 s, 119-120 s at 5 s and 121 s at 15 s (bench/throughput.py
                # --realistic). Positions are run-wide, so starts stay apart across worker processes.
                await asyncio.sleep(min(position * gap, MAX_START_SPREAD_S))
                sandboxes = _ClosedBehind(self.backend, closer)
                while (index := await next_index(position)) is not None:
                    on_done(index, await self.session(self.jobs[index], http, sandboxes))
                await asyncio.get_running_loop().run_in_executor(None, sandboxes.wait_closed)
                # No job is left for this session: what the backend keeps for later sessions (idle
                # slots) goes now, while the last samples run, rather than all after them (1,024
                # sessions: ~1 s at the end of the run).
                await asyncio.get_running_loop().run_in_executor(None, self.backend.close)

            sessions = [asyncio.ensure_future(worker(position)) for position in positions]
            try:
                await asyncio.gather(*sessions)
            finally:
                # One session raising (its record did not fit on the disk) ends the pool: the others are
                # cancelled, and their samples go unrecorded, before the HTTP session closes. Closed
                # under them, their requests in flight failed as "Server disconnected" and were recorded
                # as the endpoint's failures.
                for session in sessions:
                    session.cancel()
                await asyncio.gather(*sessions, return_exceptions=True)
                await asyncio.to_thread(closer.shutdown)  # every sandbox closed before the pool ends


class _ClosedBehind(SandboxBackend):
    """One session's sandboxes, each closed behind its conversation: in a thread of `closer` once the
    conversation ends, while its record is handed on and the next conversation's first request goes
    out (64 sessions at 0.5 s per call: a close took 8-13 ms there, between every two samples). The
    next sandbox opens once it is closed, as it opens ahead of its first tool call (agent.session.prepare),
    so a session still holds one sandbox at a time and takes its slot back as before."""

    def __init__(self, backend: SandboxBackend, closer: concurrent.futures.Executor) -> None:
        self.backend, self.closer = backend, closer
        self._closing: concurrent.futures.Future | None = None

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.backend.name

    @property
    def isolated(self) -> bool:  # type: ignore[override]
        return self.backend.isolated

    def close_later(self, sandbox: Sandbox) -> None:
        self._closing = self.closer.submit(sandbox.close)  # the one before: waited for by this one's `open`

    def wait_closed(self) -> None:
        closing, self._closing = self._closing, None
        if closing is not None:
            closing.result()

    def open(self, session_id: str, image: str | None = None, cwd: str | None = None) -> Sandbox:
        self.wait_closed()
        return self.backend.open(session_id, image, cwd)
