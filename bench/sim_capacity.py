"""Can the simulated endpoint alone serve N concurrent requests at its latency? (It must, or it
makes the product look slow: a listen backlog, a thread pool, a connection limit or a per-connection
cost would cap it.)

    .venv/bin/python bench/sim_capacity.py [--clients 1024] [--calls 4] [--latency 5]

`hermes-foundry sim-model` runs in its own process; this process opens `--clients` keep-alive
aiohttp connections to it on 127.0.0.1 (no connection limit), and each client makes `--calls`
sequential chat completions shaped like a sample's first model call (a user prompt and the terminal
tool offered), `--pause` seconds apart. Ideal wall = calls × latency + pauses; achieved = ideal ÷ wall, with the endpoint's own
`max_in_flight` (chat completions it was answering at once, at most) and its CPU seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).parent))
from harness import Endpoint  # noqa: E402

TERMINAL_TOOL = {"type": "function", "function": {
    "name": "terminal", "description": "Run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}


async def client(http: aiohttp.ClientSession, url: str, index: int, calls: int, errors: list[str],
                 durations: list[list[float]], pause: float) -> None:
    body = {"model": "hermes-sim", "tools": [TERMINAL_TOOL],
            "messages": [{"role": "user", "content": f"Task {index}: run a shell command"}]}
    for call in range(calls):
        if call:
            await asyncio.sleep(pause)  # a tool's time between two model calls
        started = time.monotonic()
        async with http.post(url, json=body) as response:
            text = await response.text()
            if response.status != 200:
                errors.append(f"{response.status}: {text[:200]}")
        durations[call].append(time.monotonic() - started)


async def load(base_url: str, clients: int, calls: int, pause: float) -> tuple[float, list[str], list[list[float]]]:
    """Wall of the whole load, errors, and each call's duration by call number (first calls also
    open their connection)."""
    errors: list[str] = []
    durations: list[list[float]] = [[] for _ in range(calls)]
    connector = aiohttp.TCPConnector(limit=0)  # no client-side cap: only the endpoint is measured
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=60, sock_read=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        started = time.monotonic()
        await asyncio.gather(*(client(http, f"{base_url}/chat/completions", i, calls, errors, durations, pause)
                               for i in range(clients)))
        return time.monotonic() - started, errors, durations


def overhead_ms(durations: list[float], latency: float) -> str:
    """Median and slowest time beyond the latency, in ms."""
    ordered = sorted(durations)
    return f"median {1000 * (ordered[len(ordered) // 2] - latency):.0f} ms, max {1000 * (ordered[-1] - latency):.0f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=1024, help="concurrent clients (default 1024)")
    parser.add_argument("--calls", type=int, default=4, help="sequential calls per client (default 4)")
    parser.add_argument("--latency", type=float, default=5.0, help="endpoint seconds per call (default 5)")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds between a client's calls (a slow tool; "
                        "longer than the server's keep-alive timeout, it costs a new connection)")
    args = parser.parse_args()
    # Each client holds a socket here and one in the endpoint: both need room above the usual 1,024.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * args.clients + 256)), hard))
    with tempfile.TemporaryDirectory(prefix="hermes-simcap-") as tmp:
        endpoint = Endpoint(args.latency, Path(tmp))
        try:
            cpu_before, own_before = endpoint.cpu_seconds(), time.process_time()
            wall, errors, durations = asyncio.run(load(endpoint.base_url, args.clients, args.calls, args.pause))
            log = endpoint.log()
            endpoint_cpu, own_cpu = endpoint.cpu_seconds() - cpu_before, time.process_time() - own_before
        finally:
            endpoint.close()
    ideal = args.calls * args.latency + (args.calls - 1) * args.pause
    print(f"# simulated endpoint alone: {args.clients} clients × {args.calls} sequential calls at "
          f"{args.latency:g} s, {os.cpu_count()} cores")
    print(f"wall {wall:.1f} s, ideal {ideal:.1f} s: achieved ÷ ideal {ideal / wall:.3f}   target ≥ 0.98")
    print(f"requests {log['requests']} of {args.clients * args.calls}, errors {len(errors)}, endpoint max in flight "
          f"{log['max_in_flight']} (of {args.clients})")
    print(f"endpoint CPU {endpoint_cpu:.1f} s ({1000 * endpoint_cpu / max(1, log['requests']):.2f} ms per request), "
          f"load-generator CPU {own_cpu:.1f} s")
    later = [duration for call in durations[1:] for duration in call]
    print(f"per call beyond the latency: first call (opens the connection) {overhead_ms(durations[0], args.latency)}"
          + (f"; later calls {overhead_ms(later, args.latency)}" if later else ""))
    if errors:
        print("first errors:", json.dumps(errors[:3]))


if __name__ == "__main__":
    main()
