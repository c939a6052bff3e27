"""Local stand-ins for the outside world of the networked tools, on 127.0.0.1: a small static site
and a SearXNG-compatible search API over it; for the address policy, pages on the site that reach
for another address by every route a browser has (`/attack/<route>?to=URL`), and a `HitRecorder`
standing in for a private service."""

from __future__ import annotations

import html
import json
import shutil
import socket
import socketserver
import threading
from typing import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from hermes_core.asgi_thread import ThreadedServer, uvicorn_config

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (`make test` installs it when run as root)")

ARTICLE = ("Hermes Foundry turns prompts into multi-turn tool-calling trajectories. Each sample runs an agent "
           "with its own sandbox, and every finished sample is recorded in a ledger at once, so a crash never "
           "loses more than the samples in flight.")
PAGES = {
    "/index.html": f"""<html><head><title>Foundry notes</title></head><body>
<nav>Home | Blog | Contact</nav>
<article><h1>About the foundry</h1><p>{ARTICLE}</p>
<p>Read the <a href="/next.html">next page</a> or <a href="/form.html">sign up</a>.</p></article>
<footer>(c) 2026 nobody</footer></body></html>""",
    "/next.html": """<html><head><title>Next</title></head><body><article><h1>Second page</h1>
<p>You followed the link from the first page: this is the second page of the site, with enough words to be
its main content.</p></article></body></html>""",
    "/form.html": """<html><head><title>Sign up</title></head><body><h1>Sign up</h1>
<form action="/thanks.html" method="get"><label for="name">Name</label><input id="name" name="name">
<button type="submit">Send</button></form><img src="/logo.png" alt="Foundry logo">
<script>console.log("form ready")</script></body></html>""",
}


# Each route by which a page can make the browser reach `to`: a link to click, redirects, subresources.
ATTACKS = {
    "link": '<a href="{attr}">the private page</a>',
    "meta": '<meta http-equiv="refresh" content="0;url={attr}">',
    "js": "<script>location.href = {js}</script>",
    "img": '<img src="{attr}" alt="private">',
    "script": '<script src="{attr}"></script>',
    "iframe": '<iframe src="{attr}"></iframe>',
    "fetch": '<script>fetch({js}, {{mode: "no-cors"}}).catch(e => console.log("fetch failed"))</script>',
    "xhr": '<script>const x = new XMLHttpRequest(); x.open("GET", {js}); x.send()</script>',
    "websocket": '<script>new WebSocket({js}.replace(/^http/, "ws"))</script>',
    "preconnect": '<link rel="preconnect" href="{attr}"><link rel="prefetch" href="{attr}">',
    "webrtc": ("<script>const at = new URL({js}).host; const pc = new RTCPeerConnection({{iceServers: [{{urls: "
               "[`stun:${{at}}`, `turn:${{at}}?transport=udp`, `turn:${{at}}?transport=tcp`], username: 'u', "
               "credential: 'p'}}]}}); pc.createDataChannel('x'); pc.createOffer().then(o => pc.setLocalDescription(o))"
               "</script>"),
}


def attack_page(route: str, to: str) -> str:
    """A page on the site that makes the browser reach `to` by `route` (a key of ATTACKS)."""
    body = ATTACKS[route].format(attr=html.escape(to, quote=True), js=json.dumps(to))
    return f"<html><head><title>Attack {route}</title></head><body><p>Attack page.</p>{body}</body></html>"


class HitRecorder:
    """A stand-in for a private service (a loopback admin port, a metadata service): a raw TCP server
    on 127.0.0.1 that records every connection, even one that never sends a request (a preconnect),
    and the request line of each request, and answers with a small page holding SECRET; and the same
    port for UDP, recording every datagram (WebRTC's STUN and TURN) as a connection."""

    SECRET = "private-service-secret"

    def __init__(self) -> None:
        self.connections: list[tuple[str, int]] = []  # the peers, one per connection
        self.requests: list[str] = []  # "GET /img HTTP/1.1"
        recorder = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                recorder.connections.append(self.client_address)
                self.request.settimeout(5)
                data = b""
                try:
                    while b"\r\n\r\n" not in data and len(data) < 65536:
                        chunk = self.request.recv(4096)
                        if not chunk:
                            return
                        data += chunk
                except OSError:
                    return
                recorder.requests.append(data.split(b"\r\n", 1)[0].decode(errors="replace"))
                body = f"<html><head><title>Private</title></head><body>{recorder.SECRET}</body></html>".encode()
                self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: close\r\n"
                                     b"Access-Control-Allow-Origin: *\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="hit-recorder", daemon=True)
        self._udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._udp.bind(self._server.server_address)
        threading.Thread(target=self._receive, name="hit-recorder-udp", daemon=True).start()

    def _receive(self) -> None:
        while True:
            try:
                self.connections.append(self._udp.recvfrom(2048)[1])
            except OSError:  # closed
                return

    def paths(self) -> set[str]:
        """The paths requested so far."""
        return {line.split(" ")[1] for line in self.requests if line.count(" ") >= 2}

    def __enter__(self) -> "HitRecorder":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._udp.close()


def site_app() -> Starlette:
    async def page(request: Request) -> Response:
        path = request.url.path
        if path.startswith("/attack/") and path[8:] in ATTACKS:
            return HTMLResponse(attack_page(path[8:], request.query_params["to"]))
        if path == "/redirect":
            return RedirectResponse(request.query_params["to"], status_code=302)
        if path == "/big.html":
            paragraphs = "".join(f"<p>Paragraph {i}: " + "many words " * 200 + "</p>" for i in range(50))
            return HTMLResponse(f"<html><body><article>{paragraphs}</article></body></html>")
        if path == "/thanks.html":
            return HTMLResponse(f"<html><body><h1>Thanks, {request.query_params.get('name', '')}!</h1></body></html>")
        return HTMLResponse(PAGES[path]) if path in PAGES else HTMLResponse("not found", status_code=404)

    return Starlette(routes=[Route("/{path:path}", page)])


def searx_app(site: str) -> Starlette:
    """`/search?q=...&format=json` as SearXNG answers it: results over the local site."""
    async def search(request: Request) -> Response:
        if request.query_params.get("format") != "json":
            return HTMLResponse("format=json required", status_code=400)
        query = request.query_params.get("q", "")
        results = [{"title": "About the foundry", "url": f"{site}/index.html", "content": ARTICLE[:120],
                    "engine": "local"},
                   {"title": "Second page", "url": f"{site}/next.html", "content": "The second page.",
                    "engine": "local"}]
        return JSONResponse({"query": query, "number_of_results": len(results), "results": results})

    return Starlette(routes=[Route("/search", search)])


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    server = ThreadedServer(uvicorn_config(site_app()), name="site").start()
    yield server.url()
    server.stop()


@pytest.fixture(scope="module")
def searx(site: str) -> Iterator[str]:
    server = ThreadedServer(uvicorn_config(searx_app(site)), name="searx").start()
    yield server.url()
    server.stop()


@pytest.fixture
def private_service() -> Iterator[HitRecorder]:
    with HitRecorder() as recorder:
        yield recorder
