"""OpenAI wire shapes of an agent run: `chat.completion`, `chat.completion.chunk` SSE, error bodies.

Tool progress travels as named `hermes.tool.progress` events. Their data is `{tool, label, toolCallId,
status}` plus the fields of an empty-delta chunk: the official `openai` Python client does not skip
named events (it parses every event's data as a chunk), so a bare progress object would reach its
callers as a chunk whose `choices` is None. With the chunk fields it is a harmless no-op chunk.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

PROGRESS_EVENT = "hermes.tool.progress"
KEEPALIVE = b": ping\n\n"  # an SSE comment: keeps proxies and clients from timing out during long tools
DONE = b"data: [DONE]\n\n"
_PIECE_CHARS = 256


def sse(payload: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()


def error_body(message: str, kind: str = "server_error", code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape; `param` names the request field at fault, e.g. `messages[2].content`."""
    return {"error": {"message": message, "type": kind, "code": code, "param": param}}


def run_error(result: dict[str, Any]) -> dict[str, Any]:
    """The error of a failed agent run (the upstream model or the sandbox gave out)."""
    return error_body(f"the agent run failed: {result.get('error') or 'unknown error'}", "server_error",
                      "agent_run_failed")


def openai_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """The agent's token totals over all its model calls, in OpenAI's shape."""
    prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": int(usage.get("total_tokens", prompt + completion)),
        "completion_tokens_details": {"reasoning_tokens": int(usage.get("reasoning_tokens", 0))},
    }


def finish_reason(result: dict[str, Any]) -> str:
    # Not completed and not stopped for hallucinated calls means the iteration limit was hit.
    return "length" if not result.get("completed") and not result.get("partial") else "stop"


def hermes_status(result: dict[str, Any]) -> dict[str, Any]:
    """The original's `hermes` block: how a run that did not simply complete ended."""
    return {"completed": bool(result.get("completed")), "partial": bool(result.get("partial")),
            "failed": bool(result.get("failed")), "error": result.get("error"),
            "error_code": "output_truncated" if finish_reason(result) == "length" and not result.get("failed")
            else "agent_error"}


def inline_line(progress: dict[str, str]) -> str:
    label = " ".join(progress.get("label", progress.get("tool", "")).split()).replace("`", "'")
    return f"`🔧 {label}`\n"


_INLINE_LINES = re.compile(r"\A(?:`🔧 [^`\n]*`\n)+\n?")


def strip_inline_progress(text: str) -> str:
    """An assistant turn as the agent wrote it: a chat frontend sends our earlier replies back with
    their inline progress lines (always at the start), which the model must not read as its own words."""
    return _INLINE_LINES.sub("", text, count=1)


@dataclass(frozen=True)
class Completion:
    """Identity of one response: every chunk and the final object carry the same id and model."""

    model: str
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex[:24]}")
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def task_id(self) -> str:
        return self.id.removeprefix("chatcmpl-")[:16]

    def chunk(self, delta: dict[str, Any], finish: str | None = None, usage: dict | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                                "model": self.model,
                                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        if usage is not None:
            body["usage"] = usage
        return body

    def response(self, result: dict[str, Any]) -> dict[str, Any]:
        message = {"role": "assistant", "content": result.get("final_response") or "", "refusal": None}
        body = {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason(result)}],
                "usage": openai_usage(result.get("usage") or {})}
        if not result.get("completed"):
            body["hermes"] = hermes_status(result)
        return body

    def failure(self, error: dict[str, Any], usage: dict[str, Any] | None = None) -> dict[str, Any]:
        """The last chunk of a stream whose run failed, as the original ends one: finish_reason "error"
        with the error and the `hermes` block (the `error` key also makes the `openai` client raise)."""
        status = {"completed": False, "partial": False, "failed": True, "error": error["error"]["message"],
                  "error_code": "agent_error"}
        return {**self.chunk({}, "error", openai_usage(usage or {})), **error, "hermes": status}


async def stream_run(
    task: asyncio.Task, progress: asyncio.Queue, completion: Completion, inline: bool, keepalive_s: float
) -> AsyncIterator[bytes]:
    """SSE of one agent run. `progress` yields tool events and finally None (put when `task` ends).

    Closing this generator early (client disconnect) cancels `task`; the agent's own `finally` then
    closes its sandbox, killing whatever tool was running."""
    getter: asyncio.Future | None = None
    try:
        yield sse(completion.chunk({"role": "assistant", "content": ""}))
        inlined = False
        while True:
            getter = getter or asyncio.ensure_future(progress.get())
            # wait() rather than wait_for(): a timeout must not lose an event that just arrived.
            done, _ = await asyncio.wait({getter}, timeout=keepalive_s)
            if not done:
                yield KEEPALIVE
                continue
            event, getter = getter.result(), None
            if event is None:
                break
            yield sse({**completion.chunk({}), **event}, PROGRESS_EVENT)
            if inline and event.get("status") == "running":
                inlined = True
                yield sse(completion.chunk({"content": inline_line(event)}))
        if task.cancelled():
            yield sse(completion.failure(error_body("the agent run was cancelled: the server is shutting down",
                                                    "server_error", "shutting_down")))
        elif task.result()["failed"]:
            yield sse(completion.failure(run_error(task.result()), task.result().get("usage")))
        else:
            result = task.result()
            text = ("\n" if inlined else "") + (result["final_response"] or "")
            for start in range(0, len(text), _PIECE_CHARS):
                yield sse(completion.chunk({"content": text[start:start + _PIECE_CHARS]}))
            yield sse(completion.chunk({}, finish_reason(result), openai_usage(result.get("usage") or {})))
        yield DONE
    except Exception as exc:  # an unexpected agent error must still end the stream properly
        yield sse(completion.failure(error_body(f"internal error: {exc}", "server_error", "internal_error")))
        yield DONE
    finally:
        if getter is not None:
            getter.cancel()
        task.cancel()  # a no-op once the run finished
