"""Local stand-ins for the outside world of the networked tools, on 127.0.0.1: a small static site
and a SearXNG-compatible search API over it."""

from __future__ import annotations

from typing import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from hermes_core.asgi_thread import ThreadedServer, uvicorn_config

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


def site_app() -> Starlette:
    async def page(request: Request) -> Response:
        path = request.url.path
        if path == "/big.html":
            paragraphs = "".join(f"<p>Paragraph {i}: " + "many words " * 200 + "</p>" for i in range(50))
            return HTMLResponse(f"<html><body><article>{paragraphs}</article></body></html>")
        if path == "/thanks.html":
            return HTMLResponse(f"<html><body><h1>Thanks, {request.query_params.get('name', '')}!</h1></body></html>")
        if path == "/to-metadata":
            return RedirectResponse("http://169.254.169.254/latest/meta-data")
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
