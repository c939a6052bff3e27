"""Runs sample jobs through one pool of concurrent agent sessions and records each as it ends.

One pool spans all batches of an invocation, so there is no idle tail at the end of each batch;
records are handed to `on_record` the moment a sample finishes (the ledger fsyncs them).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Callable

import httpx

from hermes_core.agent import AIAgent
from hermes_core.config import Endpoint
from hermes_core.records import RunContext, SampleJob, build_record
from hermes_core.recipe import Recipe
from hermes_core.sandbox import SandboxBackend


async def _run_jobs(
    jobs: list[SampleJob],
    recipe: Recipe,
    endpoint: Endpoint,
    ctx: RunContext,
    backend: SandboxBackend,
    on_record: Callable[[dict[str, Any]], None],
) -> None:
    queue: asyncio.Queue[SampleJob] = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)
    limits = httpx.Limits(max_connections=recipe.num_workers * 2, max_keepalive_connections=recipe.num_workers * 2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(endpoint.request_timeout_s, connect=30.0), limits=limits) as http:

        async def worker() -> None:
            while not queue.empty():
                job = queue.get_nowait()
                agent = AIAgent(
                    model=endpoint.model,
                    base_url=endpoint.base_url,
                    api_key=endpoint.api_key,
                    quiet_mode=True,
                    enabled_toolsets=job.toolsets,
                    max_iterations=recipe.max_turns,
                    ephemeral_system_prompt=recipe.ephemeral_system_prompt,
                    reasoning_effort=None if recipe.reasoning_disabled else recipe.reasoning_effort,
                    max_tokens=recipe.max_tokens,
                    temperature=recipe.temperature,
                    stream=recipe.stream,
                    max_retries=endpoint.max_retries,
                    backoff_base_s=endpoint.backoff_base_s,
                    sandbox_backend=backend,
                    image=job.sample.image,
                    cwd=job.sample.cwd,
                    http_client=http,
                )
                result = await agent.arun_conversation(job.sample.prompt, task_id=job.sample.sample_key[:16])
                on_record(build_record(job, result, ctx))

        await asyncio.gather(*(worker() for _ in range(min(recipe.num_workers, len(jobs)))))


def run_jobs(
    jobs: list[SampleJob],
    recipe: Recipe,
    endpoint: Endpoint,
    ctx: RunContext,
    backend: SandboxBackend,
    on_record: Callable[[dict[str, Any]], None],
) -> None:
    """Blocking entry point. Tools run in threads: give the loop enough of them for every session."""
    if not jobs:
        return

    async def main() -> None:
        asyncio.get_running_loop().set_default_executor(
            concurrent.futures.ThreadPoolExecutor(max_workers=recipe.num_workers + 4, thread_name_prefix="hermes-tool")
        )
        await _run_jobs(jobs, recipe, endpoint, ctx, backend, on_record)

    asyncio.run(main())
