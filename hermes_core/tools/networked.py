"""Toolsets "web", "vision", "image_gen" and "browser": tools that need an outside service.

They are registered with their real schemas so the tool universe (and the dataset schema) is the
same everywhere. A toolset is offered only when its backend is configured (`ToolBackends`).
"""

from __future__ import annotations

import hashlib
import re
from typing import Annotated, Any, Callable, Literal

from hermes_core.tools import images, web
from hermes_core.tools.browser import BrowserError, Page, shared_browser
from hermes_core.tools.backends import BackendError, ToolBackends
from hermes_core.tools.registry import ToolContext, ToolError, registry, tool



def _networked(toolset: str, read_only: bool = False, also: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A tool of `toolset`, offered when its backend (and the `also` toolset's) is configured."""
    def reason(backends: ToolBackends) -> str | None:
        return backends.unavailable(toolset) or (backends.unavailable(also) if also else None)

    return tool(toolset, read_only=read_only, unavailable_reason=reason)


def _checked(call: Callable[[], Any]) -> Any:
    """Backend failures become tool errors: the model reads what went wrong and can try otherwise."""
    try:
        return call()
    except (web.WebError, images.ImageError, BrowserError, BackendError) as exc:
        raise ToolError(str(exc)) from None


def _page(ctx: ToolContext) -> Page:
    """The sample's browser tab: its own browser context, opened on first use, closed with the sample."""
    page = ctx.state.get("browser_page")
    if page is None:
        assert ctx.backends.browser_executable is not None  # not offered otherwise
        browser = _checked(lambda: shared_browser(ctx.backends.browser_executable))
        page = ctx.state["browser_page"] = _checked(
            lambda: Page.open(browser, ctx.backends.resolve_allowed, ctx.backends.web_max_chars))
        ctx.on_close.append(page.close)
    return page


def _on_page(ctx: ToolContext, action: Callable[[Page], Any]) -> Any:
    return _checked(lambda: action(_page(ctx)))


@_networked("web", read_only=True)  # also offered with the browser toolset: see the end of this module
def web_search(ctx: ToolContext, query: str,
               limit: Annotated[int, {"minimum": 1, "maximum": 100, "default": 5}] = 5) -> dict[str, Any]:
    """Search the web and return the top results, each with title, URL and a short snippet.

    Args:
        query: The search query, as you would type it into a search engine (operators such as
            site:, filetype: or "exact phrase" work where the search backend supports them).
        limit: Maximum number of results to return (default 5).
    """
    return _checked(lambda: web.search(ctx.backends, query, limit))


@_networked("web", read_only=True)
def web_extract(ctx: ToolContext, urls: Annotated[list[str], {"maxItems": 5}],
                char_limit: Annotated[int | None, {"minimum": web.MIN_EXTRACT_CHARS}] = None) -> dict[str, Any]:
    """Fetch web pages and return their main content as readable text (markdown), one entry per URL.
    A page longer than char_limit comes back as its beginning and end; its whole text is then saved
    in the working directory (full_text_path) for read_file.

    Args:
        urls: The http(s) URLs of the pages to read (at most 5 per call).
        char_limit: Characters of text per page (default 15000); raise it to get more of a long
            page at once.
    """
    if not urls:
        raise ToolError("give at least one URL")
    limit = web.DEFAULT_EXTRACT_CHARS if char_limit is None else int(char_limit)
    limit = max(web.MIN_EXTRACT_CHARS, min(limit, web.MAX_EXTRACT_CHARS))
    pages = []
    for url in urls[:5]:
        try:
            page = web.extract(ctx.backends, url, limit)
        except web.WebError as exc:
            pages.append({"url": url, "error": str(exc)})
            continue
        if "full_text" in page:
            full = page.pop("full_text")
            name = "-".join(re.findall(r"[a-z0-9]+", page["url"].lower().split("://", 1)[-1])[:6])[:60] or "page"
            digest = hashlib.sha256(full.encode("utf-8")).hexdigest()[:10]
            page["full_text_path"] = ctx.sandbox.write_file(f"web_extract/{name}-{digest}.md", full.encode("utf-8"))
        pages.append(page)
    if all("error" in page for page in pages):
        raise ToolError("; ".join(page["error"] for page in pages))
    return {"pages": pages, **({"skipped_urls": urls[5:]} if len(urls) > 5 else {})}


@_networked("vision", read_only=True)
def vision_analyze(ctx: ToolContext, image_url: str, question: str) -> dict[str, Any]:
    """Look at an image and answer a question about it (describe it, read text in it, find details).

    Args:
        image_url: An http(s) or data: URL of the image, or the path of an image file in the sandbox.
        question: What you want to know about the image.
    """
    service = ctx.backends.vision
    assert service is not None  # not offered otherwise
    return _checked(lambda: images.analyze(service, images.as_image_url(image_url, ctx.sandbox), question))


@_networked("image_gen")
def image_generate(ctx: ToolContext, prompt: str,
                   aspect_ratio: Annotated[Literal["landscape", "square", "portrait"], {"default": "landscape"}] = "landscape",
                   image_url: str | None = None, reference_image_urls: list[str] | None = None) -> dict[str, Any]:
    """Generate an image from a text description, or edit a given image as described; save it in the
    working directory and return its path.

    Args:
        prompt: A detailed description of the image to create, or of the change to make to image_url.
        aspect_ratio: "landscape" (wide, the default), "square" or "portrait" (tall).
        image_url: An image to edit instead of starting from nothing: an http(s) URL or the path of
            an image file in the sandbox.
        reference_image_urls: Further images (URLs or sandbox paths) guiding an edit, e.g. for style.
    """
    service = ctx.backends.image
    assert service is not None  # not offered otherwise
    if aspect_ratio not in images.SIZES:  # the registry does not enforce enums
        raise ToolError(f"aspect_ratio must be one of {', '.join(images.SIZES)}")
    if reference_image_urls and not image_url:
        raise ToolError("reference_image_urls guide an edit: give the image to edit as image_url too")
    sources = _checked(lambda: [images.as_image_url(url, ctx.sandbox)
                                for url in ([image_url] if image_url else []) + list(reference_image_urls or [])])
    size = images.SIZES[aspect_ratio]
    data = _checked(lambda: images.generate(service, prompt, size, sources))
    path = ctx.sandbox.write_file(images.file_name(prompt, data), data)
    return {"path": path, "bytes": len(data), "mime_type": images.mime_of(data), "aspect_ratio": aspect_ratio,
            "size": size, **({"edited": image_url} if image_url else {})}


@_networked("browser")
def browser_navigate(ctx: ToolContext, url: str) -> dict[str, Any]:
    """Open a URL in the browser and return a text snapshot of the loaded page.

    Args:
        url: The http(s) address to open.
    """
    _checked(lambda: ctx.backends.check_reachable(url))
    return _on_page(ctx, lambda page: page.navigate(url))


@_networked("browser", read_only=True)
def browser_snapshot(ctx: ToolContext, full: Annotated[bool, {"default": False}] = False) -> dict[str, Any]:
    """Return a text snapshot of the current page: its text and interactive elements, each with a
    ref (like "@e5") to pass to browser_click or browser_type.

    Args:
        full: true for the complete tree, with the page's structural elements (sections, groups,
            containers) too; false (default) for the compact view without them.
    """
    return _on_page(ctx, lambda page: page.snapshot(full=full))


@_networked("browser")
def browser_click(ctx: ToolContext, ref: str) -> dict[str, Any]:
    """Click an element of the current page (link, button, checkbox...).

    Args:
        ref: The element's ref from the latest snapshot, e.g. "@e5".
    """
    return _on_page(ctx, lambda page: page.click(ref))


@_networked("browser")
def browser_type(ctx: ToolContext, ref: str, text: str) -> dict[str, Any]:
    """Type text into an input field of the current page, replacing what it contains.

    Args:
        ref: The input element's ref from the latest snapshot, e.g. "@e3".
        text: The text to type.
    """
    return _on_page(ctx, lambda page: page.type(ref, text))


@_networked("browser")
def browser_scroll(ctx: ToolContext, direction: Literal["up", "down"]) -> dict[str, Any]:
    """Scroll the current page by one screen and return the newly visible content.

    Args:
        direction: "down" to read further, "up" to go back.
    """
    return _on_page(ctx, lambda page: page.scroll(direction))


@_networked("browser")
def browser_back(ctx: ToolContext) -> dict[str, Any]:
    """Go back to the previous page in the browser history."""
    return _on_page(ctx, lambda page: page.back())


@_networked("browser")
def browser_press(ctx: ToolContext, key: str) -> dict[str, Any]:
    """Press a keyboard key in the browser, e.g. to submit a form or close a dialog.

    Args:
        key: The key name, e.g. "Enter", "Escape", "Tab" or "ArrowDown".
    """
    return _on_page(ctx, lambda page: page.press(key))


@_networked("browser", read_only=True)
def browser_get_images(ctx: ToolContext) -> dict[str, Any]:
    """List the images on the current page with their URLs and alt texts."""
    return {"images": _on_page(ctx, lambda page: page.images()), "untrusted_content": True}


@_networked("browser", read_only=True, also="vision")
def browser_vision(ctx: ToolContext, question: str, annotate: Annotated[bool, {"default": False, "description": ...}] = False) -> dict[str, Any]:
    """Take a screenshot of the current page and answer a question about what it shows (layout,
    charts, CAPTCHAs and other visual content the text snapshot misses).

    Args:
        question: What you want to know about the page's appearance.
        annotate: true to label each interactive element in the screenshot with a number [N], the
            element @eN of browser_click and browser_type (the refs of a fresh snapshot).
    """
    service = ctx.backends.vision
    assert service is not None  # not offered otherwise
    screenshot, labels = _on_page(ctx, lambda page: page.screenshot(annotate=annotate))
    answer = _checked(lambda: images.analyze(service, screenshot, question))
    return {**answer, **({"annotations": labels} if annotate else {})}


@_networked("browser", read_only=True)
def browser_console(ctx: ToolContext, clear: Annotated[bool, {"default": False, "description": ...}] = False,
                    expression: str | None = None) -> dict[str, Any]:
    """Return the JavaScript console messages and errors logged by the current page, or evaluate a
    JavaScript expression in the page (as in the browser's developer console) and return its value.

    Args:
        clear: true to empty the message list after reading it.
        expression: JavaScript to evaluate in the page, e.g. "document.title"; its value comes back
            as JSON (a JSON string is parsed). Without it, the console messages are returned.
    """
    if expression is not None:
        return {**_on_page(ctx, lambda page: page.evaluate(expression)), "untrusted_content": True}
    page = _page(ctx)
    messages = list(page.console[-100:])  # "TYPE: text"; uncaught exceptions as "error: ..."
    if clear:
        page.console.clear()
    return {"messages": messages, "untrusted_content": True}


# As in Hermes Agent, the browser toolset offers web_search too, under its own check (a web backend).
registry.also_offer("browser", "web_search")
