"""One conversation's tool side (SPEC §4): its sandbox, opened while the first reply is written or at
the first tool call and closed when the conversation ends, and its tool calls run in worker threads."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from typing import Any

from hermes_core.formats.hermes_text import wrap_untrusted
from hermes_core.sandbox import Sandbox, SandboxBackend, SandboxError
from hermes_core.tools import Tool, ToolContext
from hermes_core.tools.registry import unknown_tool_reply

RECHECK_THREADS_S = 1.0  # a cancelled conversation's close stops its sandbox's commands again this often


def _open_ready(backend: SandboxBackend, task_id: str, image: str | None, cwd: str | None) -> Sandbox:
    """A new sandbox, ready for its first command; it stays open if only getting ready fails (the
    first command then tries again: failing again, SandboxFailed, it fails the sample)."""
    sandbox = backend.open(task_id, image, cwd)
    try:
        sandbox.start()
    except SandboxError:
        pass
    except BaseException:  # not the contract's error: nobody would close it
        sandbox.close()
        raise
    return sandbox


def _close_when_opened(opening: "asyncio.Future[Sandbox]") -> None:
    if not opening.cancelled() and opening.exception() is None:
        threading.Thread(target=opening.result().close, name="hermes-sandbox-close", daemon=True).start()


async def _opened(opening: "asyncio.Future[Sandbox]") -> Sandbox:
    """The sandbox `opening` gives (or its error); cancelled meanwhile, the thread still opens it, and
    it is closed once it has."""
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(_close_when_opened)
        raise


class Session:
    """One conversation's tool side: its sandbox (prepared as the conversation starts, or opened at
    the first tool call; closed in finally) and state."""

    def __init__(self, agent: Any, task_id: str):  # the AIAgent (loop.py, which imports this module)
        self.agent = agent
        self.task_id = task_id
        self.sandbox: Sandbox | None = None  # set once a tool needs it
        self._opening: asyncio.Future[Sandbox] | None = None
        self.failed = False
        self.state: dict[str, Any] = {}
        self.ctx: ToolContext | None = None
        self.offered = {tool.name: tool for tool in agent.tools}
        self._threads: set[asyncio.Future] = set()  # tool calls running in worker threads
        limit = agent.max_parallel_tools
        self._slots = asyncio.Semaphore(limit) if limit else contextlib.nullcontext()

    def prepare(self) -> None:
        """Open the sandbox and ready it for commands in the background, while the model writes its
        first reply: the first tool call then finds it ready instead of waiting for it (64 sessions at
        0.5 s per call: 80 ms of a 1.1 s sample). A conversation whose tools never run closes it unused."""
        if self._opening is None:
            backend = self.agent._sandbox_backend()  # an unknown backend name: ValueError, a usage error
            self._opening = asyncio.ensure_future(asyncio.to_thread(_open_ready, backend, self.task_id,
                                                                    self.agent.image, self.agent.cwd))

    async def _context(self) -> ToolContext:
        if self.sandbox is None:
            self.prepare()
            opening, self._opening = self._opening, None  # this call's now: its sandbox or its error
            self.sandbox = await _opened(opening)
        if self.ctx is None:
            self.ctx = ToolContext(sandbox=self.sandbox, task_id=self.task_id, state=self.state,
                                   backends=self.agent.tool_backends, offered=frozenset(self.offered))
        return self.ctx

    async def open_sandbox(self) -> Sandbox:
        """The conversation's sandbox, opened now if no tool has needed it yet."""
        return (await self._context()).sandbox

    async def close(self) -> None:
        for close in reversed(self.ctx.on_close if self.ctx else []):  # e.g. the sample's browser context
            await asyncio.to_thread(close)
        sandbox = self.sandbox
        if sandbox is None and self._opening is not None:  # prepared, never used
            opening, self._opening = self._opening, None
            try:
                sandbox = await _opened(opening)
            except SandboxError:
                pass  # no tool needed it: not a failure of this sample
        if sandbox is not None and self.agent.close_sandbox is not None and not self._threads:
            self.agent.close_sandbox(sandbox)  # its caller closes it (no tool thread is left to stop)
        elif sandbox is not None:
            await asyncio.to_thread(sandbox.close)
        await self._settle(sandbox)
        if self.agent._backend is not None and not self.agent._backend_given:
            await asyncio.to_thread(self.agent._backend.close)  # one the agent made: free what it keeps

    async def _settle(self, sandbox: Sandbox | None) -> None:
        """Wait for the tool threads a cancelled conversation left running: until they return they
        hold workers that other conversations need. Closing the sandbox stopped their commands; it is
        closed again while any remain, as a tool may have started its next command meanwhile."""
        while self._threads:
            await asyncio.wait(set(self._threads), timeout=RECHECK_THREADS_S)
            if self._threads and sandbox is not None:
                await asyncio.to_thread(sandbox.close)

    async def _call(self, tool: Tool, arguments: dict[str, Any], ctx: ToolContext) -> str:
        """One tool call in a worker thread, at most `max_parallel_tools` of the conversation's at once.
        Shielded: cancelling the conversation does not lose track of the thread (`_settle` waits for it)."""
        async with self._slots:
            thread = asyncio.ensure_future(asyncio.to_thread(self.agent.registry.call, tool.name, arguments, ctx))
            self._threads.add(thread)
            thread.add_done_callback(self._threads.discard)
            return await asyncio.shield(thread)

    async def run_tool_calls(self, calls: list[dict[str, Any]], messages: list[dict[str, Any]]) -> bool:
        """Execute one assistant message's calls in order (consecutive read-only calls run
        concurrently); append one tool message per call. Returns whether any call named a real tool."""
        results: list[str] = [""] * len(calls)
        pending: list[tuple[int, Tool, dict[str, Any]]] = []
        any_valid = False
        for index, call in enumerate(calls):
            if "parse_error" in call:  # a malformed <tool_call> block of a raw completion (environments/tool_calls.py)
                results[index] = json.dumps({"error": call["parse_error"]})
                continue
            name = call["function"]["name"]
            tool = self.offered.get(name)
            if tool is None:
                results[index] = unknown_tool_reply(name, list(self.offered))
                continue
            any_valid = True
            try:
                arguments = json.loads(call["function"].get("arguments") or "{}")
                if not isinstance(arguments, dict):
                    raise ValueError("arguments must be a JSON object")
            except ValueError as exc:
                results[index] = json.dumps({"error": f"could not parse the arguments of '{name}' as JSON: {exc}"})
                continue
            pending.append((index, tool, arguments))
        await self._execute(pending, results, [call.get("id", "") for call in calls])
        for call, result in zip(calls, results):
            messages.append(
                {"role": "tool", "tool_call_id": call.get("id", ""), "name": call["function"]["name"], "content": result}
            )
        return any_valid

    async def _execute(
        self, pending: list[tuple[int, Tool, dict[str, Any]]], results: list[str], call_ids: list[str]
    ) -> None:
        """Run calls in order; a run of consecutive read-only calls executes concurrently."""
        if not pending:
            return
        ctx = await self._context()
        groups: list[list[tuple[int, Tool, dict[str, Any]]]] = []
        for call in pending:
            if groups and call[1].read_only and groups[-1][-1][1].read_only:
                groups[-1].append(call)
            else:
                groups.append([call])
        for group in groups:
            labels = {index: f"{tool.name} {json.dumps(arguments, ensure_ascii=False)[:120]}"
                      for index, tool, arguments in group}
            for index, tool, _ in group:
                self.agent._say(f"🔧 {labels[index]}")
                self.agent._progress(tool.name, labels[index], call_ids[index], "running")
            outputs = await asyncio.gather(*(self._call(tool, arguments, ctx) for _, tool, arguments in group))
            for (index, tool, _), output in zip(group, outputs):
                # Web/browser output is marked as data, as Hermes Agent marks it.
                results[index] = wrap_untrusted(tool.name, output, self.agent.hermes_text.untrusted_notice)
                self.agent._progress(tool.name, labels[index], call_ids[index], "completed")
