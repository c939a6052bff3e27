"""The web, vision and image_gen toolsets against servers on 127.0.0.1: a static site, a
SearXNG-compatible search API, and the simulated endpoint's images and vision answers."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from hermes_assets.cli import batch_main
from hermes_core import AIAgent
from hermes_core.config import data_root
from hermes_core.asgi_thread import ThreadedServer, uvicorn_config
from hermes_core.batch.ledger import Ledger
from hermes_core.endpoints.simulated.media import png
from hermes_core.formats.hermes_text import unwrap_untrusted
from hermes_core.sandbox import SandboxSettings
from hermes_core.sandbox.bubblewrap import BubblewrapBackend
from hermes_core.tools import ToolContext, registry, result_failed
from hermes_core.tools.backends import Service, ToolBackends
from web_servers import ARTICLE, CHROMIUM, needs_chromium, searx, site  # noqa: F401  (fixtures)


def configured(searx_url: str, sim_url: str, **options: Any) -> ToolBackends:
    service = Service(sim_url, "k", "hermes-sim")
    return ToolBackends(web_search_url=searx_url, web_allow_private=True, vision=service, image=service,
                        browser_executable=CHROMIUM, **options)


@pytest.fixture
def ctx(tmp_path: Path, searx: str, sim_url: str):
    with BubblewrapBackend(SandboxSettings(state_root=tmp_path / "sandboxes")).open("net") as sandbox:
        yield ToolContext(sandbox=sandbox, task_id="net", backends=configured(searx, sim_url))


def call(ctx: ToolContext, name: str, **arguments: Any) -> Any:
    text = registry.call(name, arguments, ctx)
    assert not result_failed(text), text
    return json.loads(text)


def test_web_search_returns_bounded_results_marked_untrusted(ctx: ToolContext, site: str) -> None:
    found = call(ctx, "web_search", query="foundry", limit=1)
    assert found["untrusted_content"] is True and "not as instructions" in found["note"].replace("never", "not")
    assert found["results"] == [{"title": "About the foundry", "url": f"{site}/index.html", "snippet": ARTICLE[:120]}]


def test_web_extract_gives_the_main_text_and_refuses_private_addresses(ctx: ToolContext, site: str) -> None:
    page = call(ctx, "web_extract", urls=[f"{site}/index.html"])["pages"][0]
    assert ARTICLE in page["content"].replace("\n", " ") and "Home | Blog" not in page["content"]
    assert page["untrusted_content"] and not page["truncated"] and page["title"] == "About the foundry"
    big = call(ctx, "web_extract", urls=[f"{site}/big.html"])["pages"][0]
    assert big["truncated"] and "characters omitted" in big["content"]
    strict = ToolContext(sandbox=ctx.sandbox, task_id="net", backends=ToolBackends(web_search_url="http://127.0.0.1:9"))
    error = json.loads(registry.call("web_extract", {"urls": [f"{site}/index.html"]}, strict))["error"]
    assert "127.0.0.1, a private address: refused" in error
    # Redirects and the browser's links and subresources: tests/tools/test_browser_policy.py.


def test_web_extract_char_limit_keeps_head_and_tail_and_saves_the_whole_text(ctx: ToolContext, site: str) -> None:
    default = call(ctx, "web_extract", urls=[f"{site}/big.html"])["pages"][0]
    # At most 15000 characters of page (cut at line ends), plus the omission mark.
    assert 7500 < len(default["content"]) <= 15100 and "characters omitted" in default["content"]
    short = call(ctx, "web_extract", urls=[f"{site}/big.html"], char_limit=2000)["pages"][0]
    assert short["truncated"] and len(short["content"]) <= 2100
    whole = ctx.sandbox.read_file(short["full_text_path"]).decode()
    assert short["full_text_path"].startswith("/workspace/web_extract/") and whole.count("Paragraph ") == 50
    assert short["content"].startswith(whole[:1000]) and short["content"].endswith(whole[-400:])  # head and tail
    assert "Paragraph 1:" not in short["content"]
    roomy = call(ctx, "web_extract", urls=[f"{site}/big.html"], char_limit=500_000)["pages"][0]
    assert not roomy["truncated"] and roomy["content"] == whole and "full_text_path" not in roomy
    assert call(ctx, "web_extract", urls=[f"{site}/index.html"], char_limit=2000)["pages"][0]["truncated"] is False


def test_image_generate_saves_a_png_in_the_sandbox_and_vision_reads_it(ctx: ToolContext) -> None:
    made = call(ctx, "image_generate", prompt="a red fox in the snow", aspect_ratio="portrait")
    assert made["mime_type"] == "image/png" and made["path"].startswith("/workspace/images/a-red-fox-in-the-snow-")
    assert made["aspect_ratio"] == "portrait" and made["size"] == "1024x1536"
    data = ctx.sandbox.read_file(made["path"])
    assert data.startswith(b"\x89PNG") and len(data) == made["bytes"]
    seen = call(ctx, "vision_analyze", image_url=made["path"], question="What is in it?")
    assert "a 1024x1536 PNG image" in seen["answer"] and "What is in it?" in seen["answer"]
    wide = call(ctx, "vision_analyze", image_url=call(ctx, "image_generate", prompt="a fox")["path"], question="?")
    assert "a 1536x1024 PNG image" in wide["answer"]  # landscape is the default
    by_url = call(ctx, "vision_analyze", image_url="https://example.com/cat.png", question="Cat?")
    assert "https://example.com/cat.png" in by_url["answer"]
    assert "aspect_ratio must be one of" in json.loads(
        registry.call("image_generate", {"prompt": "x", "aspect_ratio": "wide"}, ctx))["error"]


def test_image_generate_with_image_url_asks_for_an_edit(ctx: ToolContext, tmp_path: Path) -> None:
    """image_url (and reference_image_urls) turn the request into an edit of those images."""
    bodies: list[dict[str, Any]] = []

    async def edits(request: Request) -> JSONResponse:
        bodies.append(await request.json())
        return JSONResponse({"data": [{"b64_json": base64.b64encode(png(8, 4, (0, 0, 255))).decode()}]})

    server = ThreadedServer(uvicorn_config(Starlette(routes=[Route("/v1/images/edits", edits, methods=["POST"])])),
                            name="edits").start()
    try:
        editing = ToolContext(sandbox=ctx.sandbox, task_id="net", backends=ToolBackends(
            image=Service(f"{server.url()}/v1", "k", "editor")))
        ctx.sandbox.write_file("source.png", png(2, 2, (255, 0, 0)))
        edited = call(editing, "image_generate", prompt="make it blue", aspect_ratio="square",
                      image_url="source.png", reference_image_urls=["https://example.com/style.png"])
    finally:
        server.stop()
    assert edited["edited"] == "source.png" and ctx.sandbox.read_file(edited["path"]) == png(8, 4, (0, 0, 255))
    [body] = bodies
    assert body["prompt"] == "make it blue" and body["size"] == "1024x1024" and body["model"] == "editor"
    assert body["images"][0]["image_url"].startswith("data:image/png;base64,")
    assert body["images"][1] == {"image_url": "https://example.com/style.png"}
    assert "give the image to edit as image_url" in json.loads(registry.call(
        "image_generate", {"prompt": "x", "reference_image_urls": ["https://example.com/a.png"]}, ctx))["error"]


def test_an_agent_chains_search_then_extract_and_generate_then_look(searx: str, sim_url: str) -> None:
    agent = AIAgent(model="hermes-sim", base_url=sim_url, api_key="k", quiet_mode=True,
                    enabled_toolsets=["web", "image_gen", "vision"], tool_backends=configured(searx, sim_url))
    web = agent.run_conversation("Search the web for the foundry, then read the article [sim:tools=2]")
    calls = [c["function"] for m in web["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert [c["name"] for c in calls] == ["web_search", "web_extract"]
    assert ARTICLE[:40] in web["messages"][4]["content"]  # the extracted page, from the searched URL
    art = agent.run_conversation("Draw an image of a lighthouse, then describe the picture [sim:tools=2]")
    calls = [c["function"]["name"] for m in art["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert calls == ["image_generate", "vision_analyze"] and "1024x1024 PNG image" in art["final_response"]
    assert art["tool_stats"] == {"image_generate": {"count": 1, "success": 1, "failure": 0},
                                 "vision_analyze": {"count": 1, "success": 1, "failure": 0}}


@needs_chromium
def test_browser_navigates_clicks_types_and_submits_in_its_own_context(ctx: ToolContext, site: str) -> None:
    page = call(ctx, "browser_navigate", url=f"{site}/index.html")
    assert page["title"] == "Foundry notes" and page["untrusted_content"]
    assert '- link "next page" [@e1]' in page["snapshot"] and ARTICLE in page["snapshot"]
    assert call(ctx, "browser_click", ref="@e1")["url"] == f"{site}/next.html"
    assert call(ctx, "browser_back")["url"] == f"{site}/index.html"
    form = call(ctx, "browser_navigate", url=f"{site}/form.html")
    assert '- textbox "Name" [@e1]' in form["snapshot"] and '- button "Send" [@e2]' in form["snapshot"]
    assert "text: Ada" in call(ctx, "browser_type", ref="@e1", text="Ada")["snapshot"]
    thanks = call(ctx, "browser_press", key="Enter")
    assert thanks["url"] == f"{site}/thanks.html?name=Ada" and "Thanks, Ada!" in thanks["snapshot"]
    call(ctx, "browser_back")
    assert call(ctx, "browser_get_images")["images"] == [{"src": f"{site}/logo.png", "alt": "Foundry logo"}]
    assert "log: form ready" in call(ctx, "browser_console")["messages"]
    assert "PNG image" in call(ctx, "browser_vision", question="What does the page look like?")["answer"]
    # full: the structural elements too (the compact view leaves out nameless containers).
    compact, full = call(ctx, "browser_snapshot")["snapshot"], call(ctx, "browser_snapshot", full=True)["snapshot"]
    assert "- generic" not in compact and "- generic" in full and '- textbox "Name" [@e1]' in full
    # expression: evaluated in the page, its value as JSON; clear: the messages are read once.
    assert call(ctx, "browser_console", expression="document.title") == {
        "result": "Sign up", "result_type": "str", "untrusted_content": True}
    assert call(ctx, "browser_console", expression="JSON.stringify({n: document.images.length})")["result"] == {"n": 1}
    assert call(ctx, "browser_console", expression="Promise.resolve(6 * 7)")["result"] == 42
    assert "ReferenceError" in json.loads(registry.call("browser_console", {"expression": "nope()"}, ctx))["error"]
    call(ctx, "browser_console", expression="console.warn('careful')")
    assert call(ctx, "browser_console", clear=True)["messages"][-1] == "warning: careful"
    assert call(ctx, "browser_console")["messages"] == []
    # annotate: numbered labels on the interactive elements, each the ref of that number.
    annotated = call(ctx, "browser_vision", question="Where is the button?", annotate=True)
    assert annotated["annotations"] == [{"label": "[1]", "ref": "@e1"}, {"label": "[2]", "ref": "@e2"}]
    assert "PNG image" in annotated["answer"]
    assert call(ctx, "browser_console", expression="document.querySelectorAll('[data-hermes-label]').length")[
        "result"] == 0  # the labels are gone again
    assert "no element '@e9'" in json.loads(registry.call("browser_click", {"ref": "@e9"}, ctx))["error"]
    # Closing the sample disposes of its browser context: another sample starts with no history.
    for close in ctx.on_close:
        close()
    other = ToolContext(sandbox=ctx.sandbox, task_id="other", backends=ctx.backends)
    assert "no previous page" in json.loads(registry.call("browser_back", {}, other))["error"]


@needs_chromium
def test_an_agent_browses_a_local_page_and_follows_a_link(site: str, searx: str, sim_url: str) -> None:
    agent = AIAgent(model="hermes-sim", base_url=sim_url, api_key="k", quiet_mode=True, enabled_toolsets=["browser"],
                    tool_backends=configured(searx, sim_url))
    result = agent.run_conversation(f"Browse {site}/index.html and click the first link [sim:tools=2]")
    calls = [c["function"] for m in result["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert [c["name"] for c in calls] == ["browser_navigate", "browser_click"]
    assert json.loads(calls[1]["arguments"]) == {"ref": "@e1"}
    assert json.loads(unwrap_untrusted(result["messages"][4]["content"]))["url"] == f"{site}/next.html"
    form = agent.run_conversation(f"Browse the web page {site}/form.html, then type 'Grace' into it [sim:tools=2]")
    calls = [c["function"] for m in form["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert [c["name"] for c in calls] == ["browser_navigate", "browser_type"]
    assert json.loads(calls[1]["arguments"]) == {"ref": "@e1", "text": "Grace"}
    assert "text: Grace" in json.loads(unwrap_untrusted(form["messages"][4]["content"]))["snapshot"]


@needs_chromium
def test_batch_run_with_the_default_distribution_over_local_servers(isolated_homes, site: str, searx: str,
                                                                    sim_url: str, tmp_path: Path, capsys) -> None:
    prompts = ["Search the web for the foundry, then read the article [sim:tools=2]",
               "Draw an image of a lighthouse, then describe the picture [sim:tools=2]",
               "Run a shell command that lists the folder",
               f"Browse {site}/index.html and click the first link [sim:tools=2]",
               "Write a file named notes.txt containing 'hello'"]
    dataset = tmp_path / "d.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    flags = [f"--tool_backend=HERMES_WEB_SEARCH_URL={searx}", "--tool_backend=HERMES_WEB_ALLOW_PRIVATE=1",
             f"--tool_backend=HERMES_VISION_BASE_URL={sim_url}", f"--tool_backend=HERMES_IMAGE_BASE_URL={sim_url}",
             f"--tool_backend=HERMES_BROWSER_EXECUTABLE={CHROMIUM}"]
    assert batch_main([f"--dataset_file={dataset}", "--run_name=net", f"--base_url={sim_url}", "--api_key=k",
                       "--distribution=default", *flags]) == 0
    run = data_root() / "net"
    rows = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    used = {name for row in rows for name, stat in row["tool_stats"].items() if stat["count"]}
    assert {"web_search", "web_extract", "image_generate", "vision_analyze", "terminal", "browser_navigate",
            "browser_click", "write_file"} <= used  # every toolset of `default`
    assert all(list(row["tool_stats"]) == registry.universe for row in rows)  # the schema is unchanged
    stats = json.loads((run / "statistics.json").read_text())
    assert stats["toolsets_lost_samples"] == 0 and len(rows) == 5
    assert "not offered" not in capsys.readouterr().out
    # Without the vision, image and browser backends those toolsets are not offered, counted as lost and said.
    assert batch_main([f"--dataset_file={dataset}", "--run_name=net2", f"--base_url={sim_url}", "--api_key=k",
                       "--distribution=default", *flags[:2]]) == 0
    stats = json.loads((data_root() / "net2" / "statistics.json").read_text())
    assert stats["toolsets_lost_samples"] == 5
    assert stats["toolsets_lost"] == {"vision": 5, "image_gen": 5, "browser": 5}
    assert ("toolsets drawn but not offered, their backend not configured (docs/reference/tools.md): vision in 5, "
            "image_gen in 5, browser in 5 of 5 samples") in capsys.readouterr().out
    lost = {tuple(r["toolsets_lost"]) for r in Ledger(data_root() / "net2" / "raw").latest.values()}
    assert lost == {("vision", "image_gen", "browser")}
    recipe = json.loads((run / "recipe.json").read_text())
    assert recipe["tool_backends"]["HERMES_WEB_SEARCH_URL"] == searx
