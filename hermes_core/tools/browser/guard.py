"""The browser's only way out: a SOCKS5 proxy on 127.0.0.1 that checks every connection a browser
context opens (navigations, redirects, subresources, fetch/XHR, websockets, preconnects) against the
address policy before connecting.

SOCKS5 hands the proxy the host name, so the proxy resolves it once, checks those addresses and
connects to a checked one: a DNS answer that changes between check and connect (rebinding) cannot
slip through. Chromium is told not to bypass the proxy for loopback (`<-loopback>`)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import struct
from typing import Callable

from hermes_core.tools.backends import AddressRefused

CONNECT_TIMEOUT_S = 20.0
BYPASS_LIST = "<-loopback>"  # Chromium skips proxies for localhost unless told otherwise
MAX_BLOCKED = 50  # refusals remembered between two tool results

Resolver = Callable[[str, int], list[str]]  # (host, port) -> addresses allowed; AddressRefused if refused


def refuse_all(host: str, port: int) -> list[str]:
    """The policy of a browser context no sample uses: nothing is reachable."""
    raise AddressRefused(f"{host}:{port}: no network for this browser context")


class GuardProxy:
    """One SOCKS5 server (CONNECT only, no authentication) that lets a connection through only to an
    address `resolve` allowed. Refusals are kept in `blocked` ("host:port: reason") for the tool
    result. Runs on the asyncio loop that calls `start()`."""

    def __init__(self, resolve: Resolver) -> None:
        self.resolve = resolve
        self.blocked: list[str] = []
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> str:
        """Listen on a free port of 127.0.0.1; the proxy URL to give Chromium."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"socks5://127.0.0.1:{port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()

    def take_blocked(self) -> list[str]:
        """The refusals since the last call, each once (Chromium retries a refused connection)."""
        taken, self.blocked = self.blocked, []
        return list(dict.fromkeys(taken))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        upstream: asyncio.StreamWriter | None = None
        try:
            target = await self._handshake(reader, writer)
            if target is None:
                return
            up_reader, upstream = target
            await asyncio.gather(_pipe(reader, upstream), _pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass  # the browser or the server hung up: nothing to report
        except asyncio.CancelledError:
            pass  # closed with its browser context; re-raising would only log noise from asyncio's callback
        finally:
            self._tasks.discard(task)
            for stream in (writer, upstream):
                if stream is not None:
                    stream.close()

    async def _handshake(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """SOCKS5 greeting and CONNECT request (RFC 1928); the upstream connection, or None if refused."""
        version, methods = await reader.readexactly(2)
        await reader.readexactly(methods)
        if version != 5:
            return None
        writer.write(b"\x05\x00")  # no authentication
        _, command, _, kind = await reader.readexactly(4)
        if kind == 1:
            host = socket.inet_ntop(socket.AF_INET, await reader.readexactly(4))
        elif kind == 4:
            host = socket.inet_ntop(socket.AF_INET6, await reader.readexactly(16))
        elif kind == 3:
            host = (await reader.readexactly((await reader.readexactly(1))[0])).decode("idna")
        else:
            raise ValueError(f"SOCKS address type {kind}")
        port = struct.unpack("!H", await reader.readexactly(2))[0]
        if command != 1:  # only CONNECT: no BIND, no UDP relay
            await _reply(writer, 7)
            return None
        loop = asyncio.get_running_loop()
        try:  # getaddrinfo blocks: off the loop
            addresses = await loop.run_in_executor(None, self.resolve, host, port)
        except AddressRefused as exc:
            shown = f"[{host}]" if ":" in host else host
            if len(self.blocked) < MAX_BLOCKED:
                self.blocked.append(f"{shown}:{port}: {exc}")
            await _reply(writer, 2)  # "connection not allowed by ruleset"
            return None
        except Exception:  # the name does not resolve: the page shows it, not a refusal to report
            await _reply(writer, 4)  # "host unreachable"
            return None
        for address in addresses:  # only the addresses just checked: no second lookup
            try:
                up_reader, upstream = await asyncio.wait_for(asyncio.open_connection(address, port),
                                                             CONNECT_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError):
                continue
            await _reply(writer, 0)
            return up_reader, upstream
        await _reply(writer, 5)  # connection refused
        return None


async def _reply(writer: asyncio.StreamWriter, code: int) -> None:
    writer.write(bytes([5, code, 0, 1]) + ipaddress.IPv4Address(0).packed + b"\x00\x00")
    await writer.drain()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until end of stream, then half-close, so the other direction can finish."""
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()
