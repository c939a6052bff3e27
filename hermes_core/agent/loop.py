"""AIAgent: the tool-calling conversation loop (SPEC §4), used by the library, the batch pipeline
and the API server alike, so served behaviour matches the training data."""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import time
import uuid
from typing import Any, Awaitable, Callable, TypeVar

import aiohttp

from hermes_core.endpoints import constrained
from hermes_core.config import DEFAULT_REQUEST_TIMEOUT_S, Endpoint
from hermes_core.endpoints.model_client import Completion, ModelClient, ModelError
from hermes_core.endpoints.request_options import RequestOptions
from hermes_core.agent.reasoning import extract_reasoning
from hermes_core.sandbox import Sandbox, SandboxBackend, SandboxError, get_backend
from hermes_core.formats.hermes_text import OWN_TEXT, HermesText
from hermes_core.formats.sharegpt import tool_stats as count_tool_stats
from hermes_core.tools import TOOLSET_ORDER, Tool, registry as default_registry
from hermes_core.tools.backends import ToolBackends
from hermes_core.tools.registry import ToolRegistry
from hermes_core.agent.session import Session

SUMMARY_REQUEST = (
    "You have reached the maximum number of tool-calling iterations. Without calling any more tools, "
    "summarize what you did and give your best final answer."
)
MAX_TURNS_WITHOUT_VALID_CALL = 3
T = TypeVar("T")


def resolve_toolsets(
    enabled: list[str] | None, disabled: list[str] | None, tool_registry: ToolRegistry = default_registry,
    backends: ToolBackends | None = None,
) -> list[str]:
    """SPEC §4: None → every toolset with an available tool; a list → only those; minus disabled."""
    known = tool_registry.toolsets
    unknown = sorted((set(enabled or []) | set(disabled or [])) - set(known))
    if unknown:
        raise ValueError(f"unknown toolset(s) {unknown}; known: {sorted(known)}")
    order = [name for name in TOOLSET_ORDER if name in known] + [n for n in known if n not in TOOLSET_ORDER]
    chosen = [n for n in order if n in enabled] if enabled is not None else [
        n for n in order if tool_registry.available([n], backends)
    ]
    return [name for name in chosen if name not in set(disabled or [])]


def run_sync(make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine from sync code, also when the caller already has an event loop (notebooks)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


class AIAgent:
    def __init__(
        self,
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        quiet_mode: bool = False,
        enabled_toolsets: list[str] | None = None,
        disabled_toolsets: list[str] | None = None,
        max_iterations: int = 90,
        ephemeral_system_prompt: str | None = None,
        reasoning_effort: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        stream: bool = False,
        max_retries: int = 5,
        backoff_base_s: float = 1.0,
        max_concurrent_requests: int | None = None,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        sample_timeout_s: float | None = None,  # no model call past this many seconds from the conversation's start
        sandbox_backend: SandboxBackend | str | None = None,
        image: str | None = None,
        cwd: str | None = None,
        tool_registry: ToolRegistry | None = None,
        http_client: aiohttp.ClientSession | None = None,
        tool_progress: Callable[[dict[str, str]], None] | None = None,
        tool_call_mode: str = constrained.NATIVE,
        tool_backends: ToolBackends | None = None,
        sample_budget: Callable[[dict[str, int]], str | None] | None = None,
        request_options: RequestOptions | None = None,
        hermes_text: HermesText = OWN_TEXT,
        prepare_sandbox: bool = True,  # open the sandbox while the first reply is written (False: at the first tool call)
        max_parallel_tools: int | None = None,  # tool calls running at once (None: a whole read-only group)
        model_call: Callable[[dict[str, Any]], Awaitable[Completion]] | None = None,  # instead of the endpoint's
        close_sandbox: Callable[[Sandbox], None] | None = None,  # takes the sandbox at the end, to close it
    ):
        cap = {} if max_concurrent_requests is None else {"max_concurrent_requests": max_concurrent_requests}
        self.endpoint = Endpoint.resolve(
            base_url, api_key, model, max_retries=max_retries, backoff_base_s=backoff_base_s,
            request_timeout_s=request_timeout_s, sample_timeout_s=sample_timeout_s, **cap
        )
        self.model = self.endpoint.model
        self.quiet_mode = quiet_mode
        self.registry = tool_registry or default_registry
        self.tool_backends = ToolBackends.resolve() if tool_backends is None else tool_backends
        self.toolsets = resolve_toolsets(enabled_toolsets, disabled_toolsets, self.registry, self.tool_backends)
        self.tools: list[Tool] = self.registry.available(self.toolsets, self.tool_backends)
        # Sent with every model call, in the run's wording (the original's with --hermes_agent_python).
        self._tool_schemas = [{"type": "function", "function": definition}
                              for definition in hermes_text.definitions([tool.definition() for tool in self.tools])]
        self.max_iterations = max_iterations
        self.ephemeral_system_prompt = ephemeral_system_prompt
        self.reasoning_effort = reasoning_effort
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.stream = stream
        self.image, self.cwd = image, cwd
        self._backend = sandbox_backend if isinstance(sandbox_backend, SandboxBackend) else None
        self._backend_given = self._backend is not None
        self._backend_name = sandbox_backend if isinstance(sandbox_backend, str) else None
        self.prepare_sandbox = prepare_sandbox
        # Given, the conversation hands its sandbox over instead of closing it (the batch runner closes it
        # while the record is written): the caller must close it.
        self.close_sandbox = close_sandbox
        self.max_parallel_tools = max_parallel_tools
        # Token-level RL rollouts answer through atroposlib's managed server instead (environments/atropos_env.py).
        self.model_call = model_call
        self._http = http_client
        self._tool_progress = tool_progress  # {tool, label, toolCallId, status: running|completed}
        if tool_call_mode not in constrained.TOOL_CALL_MODES:
            raise ValueError(f"tool_call_mode {tool_call_mode!r}: expected one of {', '.join(constrained.TOOL_CALL_MODES)}")
        self.tool_call_mode = tool_call_mode  # constrained: for models without tool calling (hermes_core.endpoints.constrained)
        self.sample_budget = sample_budget  # usage so far -> why the sample must stop calling the model
        self.hermes_text = hermes_text  # the prose the model reads: tool definitions, the untrusted notice
        # A batch run's reasoning form, provider routing and prefill (hermes_core.endpoints.request_options).
        self.request_options = request_options

    # -- public API -------------------------------------------------------------------------
    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools offered with every model call, as sent."""
        return self._tool_schemas

    def chat(self, message: str) -> str:
        """Run a whole conversation for one message; return the final answer only."""
        return run_sync(lambda: self.achat(message))

    async def achat(self, message: str) -> str:
        result = await self.arun_conversation(message)
        if result["failed"]:
            raise ModelError(result["error"])
        return result["final_response"] or ""

    def run_conversation(
        self,
        user_message: str,
        system_message: str | None = None,
        conversation_history: list[dict[str, Any]] | None = None,
        task_id: str | None = None,
    ) -> dict[str, Any]:
        return run_sync(lambda: self.arun_conversation(user_message, system_message, conversation_history, task_id))

    async def arun_conversation(
        self,
        user_message: str,
        system_message: str | None = None,
        conversation_history: list[dict[str, Any]] | None = None,
        task_id: str | None = None,
        inspect_sandbox: Callable[[Sandbox], Awaitable[Any]] | None = None,
    ) -> dict[str, Any]:
        """The loop of SPEC §4. Never raises for model or tool failures: see `failed`/`error`.
        `inspect_sandbox`, given, is awaited with the conversation's sandbox once the conversation
        ended normally and before the sandbox closes (a verifier's view; opened for it if no tool ran);
        what it returns is the result's `inspected`."""
        started = time.monotonic()
        session = Session(self, task_id or uuid.uuid4().hex[:12])
        messages = [dict(m) for m in conversation_history or []] + [{"role": "user", "content": user_message}]
        system = "\n\n".join(p for p in (self.ephemeral_system_prompt, system_message) if p)
        client = ModelClient(self.endpoint, self._http, on_retry=None if self.quiet_mode else self._say)
        outcome = {"completed": False, "partial": False, "failed": False, "error": None, "stopped": None}
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, "reasoning_tokens": 0}
        api_calls, final, turns_without_valid_call, inspected = 0, None, 0, None
        served_models: list[str] = []

        async def call_model(with_tools: bool) -> dict[str, Any]:
            nonlocal api_calls
            tools = self._tool_schemas if with_tools else []
            if self.tool_call_mode == constrained.CONSTRAINED:
                body = constrained.request_body(self._wire(system, messages), tools)
            else:
                body = {"messages": self._wire(system, messages), **({"tools": tools} if tools else {})}
            for key, value in (("max_tokens", self.max_tokens), ("temperature", self.temperature),
                               ("reasoning_effort", self.reasoning_effort)):
                if value is not None:
                    body[key] = value
            if self.request_options is not None:
                self.request_options.apply(body)
            api_calls += 1
            self._say(f"⏳ model call {api_calls}")
            completion = await (self.model_call(body) if self.model_call else client.complete(body, stream=self.stream))
            if completion.served_model and completion.served_model not in served_models:
                served_models.append(completion.served_model)
            for key in usage:
                usage[key] += completion.usage.get(key, 0)
            reasoning, content = extract_reasoning(completion.message)
            calls = completion.message.get("tool_calls")
            if self.tool_call_mode == constrained.CONSTRAINED:
                content, calls = constrained.parse_reply(content, calls_allowed=bool(tools))
            # Streams send "" where non-streamed responses send null: one shape for both.
            assistant: dict[str, Any] = {"role": "assistant", "content": content or None, "reasoning": reasoning}
            if calls:
                assistant["tool_calls"] = calls
            messages.append(assistant)
            return assistant

        try:
            if self.tools and self.prepare_sandbox:
                session.prepare()
            while True:
                if api_calls and self.sample_budget and (reason := self.sample_budget(usage)):
                    outcome.update(partial=True, stopped=reason)  # no final answer: the data says so
                    break
                if api_calls >= self.max_iterations:
                    messages.append({"role": "user", "content": SUMMARY_REQUEST})
                    final = (await call_model(with_tools=False))["content"]
                    break
                assistant = await call_model(with_tools=True)
                if not assistant.get("tool_calls"):
                    final, outcome["completed"] = assistant["content"], True
                    break
                valid = await session.run_tool_calls(assistant["tool_calls"], messages)
                turns_without_valid_call = 0 if valid else turns_without_valid_call + 1
                if turns_without_valid_call >= MAX_TURNS_WITHOUT_VALID_CALL:
                    outcome["partial"] = True
                    break
            if inspect_sandbox is not None:
                inspected = await inspect_sandbox(await session.open_sandbox())
        except ModelError as exc:
            outcome.update(failed=True, error=str(exc))
            self._say(f"❌ {exc}")
        except SandboxError as exc:  # no sandbox, or one broken for good (SandboxFailed): infrastructure, not data
            outcome.update(failed=True, error=f"sandbox: {exc}")
            session.failed = True
            self._say(f"❌ sandbox: {exc}")
        finally:
            try:
                await session.close()
            finally:
                await client.aclose()
        stats, _ = count_tool_stats(messages, self.registry.universe)
        return {
            "final_response": final,
            "messages": messages,
            "api_calls": api_calls,
            **outcome,
            "usage": usage,
            "tool_stats": {name: s for name, s in stats.items() if s["count"]},
            "reasoning": [m.get("reasoning") for m in messages if m["role"] == "assistant"],
            "model": self.model,
            "served_model": ",".join(served_models) or None,
            "duration_s": round(time.monotonic() - started, 3),
            "toolsets": [name for name in self.toolsets if any(t.toolset == name for t in self.tools)],  # offered
            "tools_offered": [tool.name for tool in self.tools],
            "tool_call_mode": self.tool_call_mode,
            "sandbox_created": session.sandbox is not None,
            "sandbox_failed": session.failed,
            **({"inspected": inspected} if inspect_sandbox is not None else {}),
        }

    # -- internals ----------------------------------------------------------------------------
    @staticmethod
    def _wire(system: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Messages as sent: the ephemeral system prompt first, our bookkeeping keys dropped."""
        wire = [{"role": "system", "content": system}] if system else []
        for message in messages:
            wire.append({k: v for k, v in message.items() if k != "reasoning"})
        return wire

    def _say(self, text: str) -> None:
        if not self.quiet_mode:
            print(text, file=sys.stderr, flush=True)

    def _progress(self, tool: str, label: str, call_id: str, status: str) -> None:
        if self._tool_progress:
            self._tool_progress({"tool": tool, "label": label, "toolCallId": call_id, "status": status})

    def _sandbox_backend(self) -> SandboxBackend:
        if self._backend is None:
            self._backend = get_backend(self._backend_name)
        return self._backend
