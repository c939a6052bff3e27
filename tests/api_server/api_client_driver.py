"""Drives a Hermes API server with `hermes-agent-api-client` (run by the Python 3.13 venv that
scripts/api_client_venv.sh builds, not by the project's venv).

    python api_client_driver.py BASE_URL   (API key in $HERMES_TEST_API_KEY, the plan as JSON on stdin)

The plan: {"turns": [{"prompt": ..., "session_id": ... or null, "session_key": ... or null}, ...]}.
Prints one JSON object: the probed capabilities and, per turn, the events the client yielded.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from hermes_agent_api_client import (AssistantDeltaEvent, HermesAgentApiClient, HermesContractError, KeepaliveEvent,
                                     TerminalEvent, ToolProgressEvent, UsageEvent)


def describe(event: object) -> dict[str, object]:
    if isinstance(event, AssistantDeltaEvent):
        return {"type": "delta", "text": event.text}
    if isinstance(event, ToolProgressEvent):
        return {"type": "tool", "tool": event.tool_name, "status": event.status.value, "id": event.tool_call_id}
    if isinstance(event, UsageEvent):
        return {"type": "usage", "total_tokens": event.total_tokens}
    if isinstance(event, TerminalEvent):
        return {"type": "terminal", "outcome": event.outcome.value, "partial": event.partial}
    if isinstance(event, KeepaliveEvent):
        return {"type": "keepalive"}
    return {"type": type(event).__name__}


async def main(base_url: str, key: str, plan: dict) -> dict[str, object]:
    report: dict[str, object] = {"turns": []}
    async with HermesAgentApiClient(base_url, key) as client:
        caps = await client.probe_capabilities()
        report["capabilities"] = caps.model_dump(mode="json")
    for turn in plan["turns"]:
        request = {"model": report["capabilities"]["model"], "stream": True,
                   "messages": [{"role": "user", "content": turn["prompt"]}]}
        events: list[dict[str, object]] = []
        try:
            async with HermesAgentApiClient(base_url, key) as client:  # single-use by design
                async for event in client.stream_chat_events(request, session_id=turn.get("session_id"),
                                                             session_key=turn.get("session_key")):
                    events.append(describe(event))
        except HermesContractError as exc:
            events.append({"type": "error", "class": type(exc).__name__, "status": exc.status_code})
        report["turns"].append(events)
    return report


if __name__ == "__main__":
    result = asyncio.run(main(sys.argv[1], os.environ["HERMES_TEST_API_KEY"], json.load(sys.stdin)))
    print(json.dumps(result))
