"""Rollouts: a task's conversation through `AIAgent` (the batch runs' loop, retries, limiter and
constrained mode), scored by its verifier in the same sandbox before the sandbox closes."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from hermes_core.config import Endpoint
from hermes_core.environments.tasks import Task
from hermes_core.environments.verifiers import Verdict, VerifierError, verify
from hermes_core.sandbox import Sandbox, SandboxBackend
from hermes_core.tools.distributions import Distribution, sample_toolsets

if TYPE_CHECKING:  # the agent and aiohttp load where a rollout runs: runs files import these settings
    import aiohttp

    from hermes_core.endpoints.model_client import Completion


@dataclass(frozen=True)
class RolloutSettings:
    """How every rollout of an environment run talks to the model and draws its tools."""
    endpoint: Endpoint
    distribution: Distribution
    seed: int = 0
    max_turns: int = 10
    temperature: float | None = None
    max_tokens: int | None = None
    tool_call_mode: str = "native"
    system_prompt: str | None = None
    # task, sandbox -> verdict, in a worker thread (default: the task's verifier spec)
    verify: Callable[[Task, Sandbox], Verdict] | None = None


@dataclass
class Rollout:
    task_id: str
    task_key: str
    group: int  # which group of the task (a task is rolled out in several groups over a run)
    member: int  # position in the group
    toolsets: list[str]
    toolset_seed: int
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)  # the schemas offered, as sent
    reward: float | None = None
    detail: str = ""
    error: str | None = None  # the model, the sandbox or the verifier failed: no reward, retry it
    api_calls: int = 0
    usage: dict[str, int] = field(default_factory=dict)
    served_model: str | None = None

    @property
    def key(self) -> str:
        return rollout_key(self.task_key, self.group, self.member)


def rollout_key(task_key: str, group: int, member: int) -> str:
    return hashlib.sha256(f"{task_key}:{group}:{member}".encode("utf-8")).hexdigest()


def draw_toolsets(settings: RolloutSettings, task: Task, group: int, member: int) -> tuple[list[str], int]:
    """The member's toolsets, drawn from the distribution with a seed fixed by task, group and member."""
    return sample_toolsets(settings.distribution, settings.seed, rollout_key(task.key, group, member))


def spec_verdict(task: Task, sandbox: Sandbox) -> Verdict:
    """The verdict of the task's own verifier spec."""
    if task.verifier is None:
        raise VerifierError(f"task {task.id} has no verifier")
    return verify(task.verifier, sandbox)


async def _inspect(task: Task, sandbox: Sandbox, settings: RolloutSettings) -> Verdict | VerifierError:
    try:  # in a worker thread: the event loop keeps serving the other rollouts
        return await asyncio.to_thread(settings.verify or spec_verdict, task, sandbox)
    except VerifierError as exc:
        return exc


async def run_rollout(task: Task, group: int, member: int, settings: RolloutSettings,
                      backend: SandboxBackend, http: aiohttp.ClientSession | None = None,
                      model_call: Callable[[dict[str, Any]], Awaitable[Completion]] | None = None) -> Rollout:
    """One rollout of `task`: the conversation, then its verifier in the same sandbox. Never raises
    for model, sandbox or verifier failures: they are the rollout's `error`, and it has no reward."""
    from hermes_core.agent.loop import AIAgent

    toolsets, toolset_seed = draw_toolsets(settings, task, group, member)
    endpoint = settings.endpoint
    agent = AIAgent(
        model=endpoint.model, base_url=endpoint.base_url, api_key=endpoint.api_key, quiet_mode=True,
        enabled_toolsets=toolsets, max_iterations=settings.max_turns, ephemeral_system_prompt=settings.system_prompt,
        max_tokens=settings.max_tokens, temperature=settings.temperature, max_retries=endpoint.max_retries,
        backoff_base_s=endpoint.backoff_base_s, request_timeout_s=endpoint.request_timeout_s,
        max_concurrent_requests=endpoint.max_concurrent_requests, sandbox_backend=backend, image=task.image,
        cwd=task.cwd, http_client=http, tool_call_mode=settings.tool_call_mode, model_call=model_call,
    )
    rollout = Rollout(task.id, task.key, group, member, toolsets, toolset_seed, tools=agent.tool_schemas)
    result = await agent.arun_conversation(task.prompt, task_id=rollout.key[:16],
                                           inspect_sandbox=lambda sandbox: _inspect(task, sandbox, settings))
    system = [{"role": "system", "content": settings.system_prompt}] if settings.system_prompt else []
    rollout.messages = system + [{k: v for k, v in m.items() if k != "reasoning"} for m in result["messages"]]
    rollout.api_calls, rollout.usage, rollout.served_model = result["api_calls"], result["usage"], result["served_model"]
    verdict = result.get("inspected")
    if result["failed"]:
        rollout.error = result["error"]
    elif isinstance(verdict, VerifierError):
        rollout.error = f"verifier: {verdict}"
    elif isinstance(verdict, Verdict):
        rollout.reward, rollout.detail = verdict.reward, verdict.detail
    return rollout


async def run_group(task: Task, group: int, size: int, settings: RolloutSettings, backend: SandboxBackend,
                    http: aiohttp.ClientSession | None = None) -> list[Rollout]:
    """`size` rollouts of one task at once, in member order."""
    return list(await asyncio.gather(*(run_rollout(task, group, member, settings, backend, http)
                                       for member in range(size))))
