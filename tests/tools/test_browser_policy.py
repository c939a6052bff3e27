"""The private-address policy holds for every request the web tools make, not only the URL given:
a page's links, redirects (HTTP, meta refresh, script) and subresources (images, scripts, iframes,
fetch, XHR, websockets, preconnects) in the browser, and each redirect hop of web_extract.

Only 127.0.0.1 is available here, and it is itself loopback: the "public" site is one port on it,
let through by HERMES_WEB_ALLOW_HOSTS=127.0.0.1:<site port>, and the private service is another
port (`HitRecorder`), which records every connection. With HERMES_WEB_ALLOW_PRIVATE=1 the same
pages do reach it, so the check is what keeps them out."""

from __future__ import annotations

import json
import socket
import time
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

from hermes_core.tools import ToolContext, registry
from hermes_core.tools.backends import BackendError, ToolBackends
from procs import wait_until
from web_servers import ATTACKS, CHROMIUM, HitRecorder, needs_chromium, private_service, site  # noqa: F401  (fixtures)

SETTLE_S = 3.0  # after the last page of every route: time for late requests (meta refresh, script) to be tried


def context(site_url: str, task: str, allow_private: bool = False) -> ToolContext:
    """A session whose policy lets through only the test site's port, or (allow_private) everything.
    The web and browser tools use no sandbox."""
    backends = ToolBackends(web_search_url="http://127.0.0.1:9", browser_executable=CHROMIUM,
                            web_allow_private=allow_private, web_allow_hosts=frozenset({urlsplit(site_url).netloc}))
    return ToolContext(sandbox=None, task_id=task, backends=backends)  # type: ignore[arg-type]


def tool(ctx: ToolContext, name: str, **arguments: Any) -> dict[str, Any]:
    return json.loads(registry.call(name, arguments, ctx))


ROUTES = ["redirect", *ATTACKS]  # an HTTP redirect, then each page of ATTACKS
NO_REQUEST = {"preconnect", "webrtc"}  # connections that need not carry an HTTP request


def attack(ctx: ToolContext, site_url: str, route: str, target: str) -> list[dict[str, Any]]:
    """Open the site's page for `route` aiming at `target` (clicking the link for "link"); the tool results."""
    page = "/redirect" if route == "redirect" else f"/attack/{route}"
    results = [tool(ctx, "browser_navigate", url=f"{site_url}{page}?to={quote(target, safe='')}")]
    if route == "link":
        results.append(tool(ctx, "browser_click", ref="@e1"))
    return results


def test_the_policy_lets_through_only_listed_host_ports() -> None:
    listed = ToolBackends.resolve(environ={"HERMES_WEB_ALLOW_HOSTS": " 127.0.0.1:8080 ,[::1]:81"})
    assert listed.web_allow_hosts == {"127.0.0.1:8080", "[::1]:81"}
    assert listed.check_reachable("http://127.0.0.1:8080/x") == ["127.0.0.1"]
    assert listed.resolve_allowed("::1", 81) == ["::1"]
    for url in ("http://127.0.0.1:8081/", "http://127.0.0.1/", "http://[::ffff:127.0.0.1]:8081/",
                "http://169.254.169.254/latest/meta-data", "http://10.0.0.1:8080/", "http://100.64.0.1/"):
        with pytest.raises(BackendError, match="a private address: refused"):
            listed.check_reachable(url)
    for entry in ("127.0.0.1", "127.0.0.1:http", ":80", "127.0.0.1:0"):
        with pytest.raises(BackendError, match="HERMES_WEB_ALLOW_HOSTS"):
            ToolBackends.resolve(environ={"HERMES_WEB_ALLOW_HOSTS": entry})


def test_web_extract_checks_every_redirect_hop(site: str, private_service: HitRecorder) -> None:
    target = f"{private_service.url}/extract"
    one_hop = f"{site}/redirect?to={quote(target, safe='')}"
    two_hops = f"{site}/redirect?to={quote(one_hop, safe='')}"
    strict = context(site, "extract")
    for url in (one_hop, two_hops, target):
        error = tool(strict, "web_extract", urls=[url])["error"]
        assert "a private address: refused" in error and HitRecorder.SECRET not in error
    assert private_service.connections == []
    assert "About the foundry" in tool(strict, "web_extract", urls=[f"{site}/index.html"])["pages"][0]["title"]
    # Without the policy the same redirects arrive: the check is what stopped them.
    free = context(site, "extract", allow_private=True)
    pages = tool(free, "web_extract", urls=[one_hop, two_hops])["pages"]
    assert all(HitRecorder.SECRET in page["content"] and page["url"] == target for page in pages)
    assert private_service.requests == ["GET /extract HTTP/1.1"] * 2


def test_web_extract_connects_to_the_address_it_checked(site: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One DNS lookup per hop: a second answer (DNS rebinding) is never asked for, let alone used."""
    real, lookups = socket.getaddrinfo, []

    def rebinding(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "rebind.test":
            return real(host, *args, **kwargs)
        lookups.append(host)
        if len(lookups) > 1:
            raise socket.gaierror("the second answer would point elsewhere")
        return real("127.0.0.1", *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    ctx = context(site, "rebind")
    page = tool(ctx, "web_extract", urls=[f"http://rebind.test:{urlsplit(site).port}/index.html"])["pages"][0]
    assert page["title"] == "About the foundry" and lookups == ["rebind.test"]


@needs_chromium
def test_the_browser_reaches_no_private_address_by_any_route(site: str, private_service: HitRecorder) -> None:
    port = urlsplit(private_service.url).port
    # Every route's page stays open in its own session while the next ones load, so one settling time
    # after the last covers them all: each page has had at least SETTLE_S for late requests.
    contexts = {route: context(site, f"strict-{route}") for route in ROUTES}
    try:
        results = {route: attack(ctx, site, route, f"{private_service.url}/{route}") for route, ctx in contexts.items()}
        time.sleep(SETTLE_S)
        for route, ctx in contexts.items():
            results[route].append(tool(ctx, "browser_snapshot"))
            # The refusals cost the page nothing else: the allowed site still loads (no fallback, no ban).
            assert tool(ctx, "browser_navigate", url=f"{site}/index.html")["title"] == "Foundry notes", route
    finally:
        for ctx in contexts.values():
            for close in ctx.on_close:
                close()
    assert private_service.connections == [], private_service.requests  # the paths name the routes
    for route, route_results in results.items():
        told = json.dumps(route_results)
        assert HitRecorder.SECRET not in told, route
        if route not in NO_REQUEST:  # a preconnect is speculative and WebRTC tries in the background
            assert f"127.0.0.1:{port}: 127.0.0.1 resolves to 127.0.0.1, a private address: refused" in told, route
    # The same pages with HERMES_WEB_ALLOW_PRIVATE=1: each route does reach the private service.
    ctx = context(site, "free", allow_private=True)
    try:
        for route in ROUTES:
            before = len(private_service.connections)
            results = attack(ctx, site, route, f"{private_service.url}/{route}")
            arrived = (lambda: len(private_service.connections) > before) if route in NO_REQUEST else (
                lambda: f"/{route}" in private_service.paths())
            assert wait_until(arrived, timeout=15), (route, private_service.requests)
            assert "blocked" not in json.dumps(results), route
    finally:
        for close in ctx.on_close:
            close()
