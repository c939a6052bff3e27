"""CPU per model call of the HTTP clients we could use, against the simulated endpoint in its own process.

    .venv/bin/python bench/http_clients.py [--sessions 64] [--calls 20]

Each session keeps one keep-alive connection and posts an agent-sized chat completion body
`--calls` times; prints this process's CPU seconds per call for httpx and for aiohttp (what
hermes_core.endpoints.model_client uses). The endpoint's latency is 0.5 s, so sessions overlap as in a run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
from pathlib import Path
from typing import Awaitable, Callable

import aiohttp
import httpx

sys.path.insert(0, str(Path(__file__).parent))
from harness import Endpoint  # noqa: E402

BODY = {"model": "bench", "messages": [{"role": "user", "content": "Task 1: run a shell command"}] * 3,
        "tools": [{"type": "function", "function": {"name": "terminal", "description": "Run a command. " * 40,
                                                    "parameters": {"type": "object", "properties": {
                                                        "command": {"type": "string"}}}}}]}


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def with_httpx(url: str, sessions: int, calls: int) -> None:
    async def session() -> None:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=1)) as client:
            for _ in range(calls):
                (await client.post(url, json=BODY)).json()

    await asyncio.gather(*(session() for _ in range(sessions)))


async def with_aiohttp(url: str, sessions: int, calls: int) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=sessions)) as client:
        async def session() -> None:
            for _ in range(calls):
                async with client.post(url, data=json.dumps(BODY), headers={"Content-Type": "application/json"}) as r:
                    json.loads(await r.read())

        await asyncio.gather(*(session() for _ in range(sessions)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    clients: dict[str, Callable[[str, int, int], Awaitable[None]]] = {"httpx": with_httpx, "aiohttp": with_aiohttp}
    with tempfile.TemporaryDirectory() as tmp:
        endpoint = Endpoint(0.5, Path(tmp))
        try:
            url = endpoint.base_url + "/chat/completions"
            for name, run in clients.items():
                before = cpu_seconds()
                asyncio.run(run(url, args.sessions, args.calls))
                per_call = (cpu_seconds() - before) / (args.sessions * args.calls)
                print(f"{name:<8} {per_call * 1000:.2f} ms CPU per call ({args.sessions} sessions × {args.calls} calls)")
        finally:
            endpoint.close()


if __name__ == "__main__":
    main()
