"""Toolsets "web", "vision", "image_gen" and "browser": tools that need an outside service.

They are registered with their real schemas so the tool universe (and the dataset schema) is the
same everywhere. A toolset is offered only when its backend is configured (`ToolBackends`).
"""

from __future__ import annotations

from typing import Any, Callable, Literal

from hermes_core.tools import images, web
from hermes_core.tools.browser import BrowserError, Page, shared_browser
from hermes_core.tools.backends import BackendError, ToolBackends
from hermes_core.tools.registry import ToolContext, ToolError, tool



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


@_networked("web", read_only=True)
def web_search(ctx: ToolContext, query: str, limit: int = 5) -> dict[str, Any]:
    """Search the web and return the top results, each with title, URL and a short snippet.

    Args:
        query: The search query, as you would type it into a search engine.
        limit: Maximum number of results to return (default 5).
    """
    return _checked(lambda: web.search(ctx.backends, query, limit))


@_networked("web", read_only=True)
def web_extract(ctx: ToolContext, urls: list[str]) -> dict[str, Any]:
    """Fetch web pages and return their main content as readable text (markdown), one entry per URL.

    Args:
        urls: The http(s) URLs of the pages to read.
    """
    if not urls:
        raise ToolError("give at least one URL")
    pages = []
    for url in urls[:5]:
        try:
            pages.append(web.extract(ctx.backends, url))
        except web.WebError as exc:
            pages.append({"url": url, "error": str(exc)})
    if all("error" in page for page in pages):
        raise ToolError("; ".join(page["error"] for page in pages))
    return {"pages": pages, **({"skipped_urls": urls[5:]} if len(urls) > 5 else {})}


@_networked("vision", read_only=True)
def vision_analyze(ctx: ToolContext, image: str, question: str) -> dict[str, Any]:
    """Look at an image and answer a question about it (describe it, read text in it, find details).

    Args:
        image: An image URL, or the path of an image file in the sandbox.
        question: What you want to know about the image.
    """
    service = ctx.backends.vision
    assert service is not None  # not offered otherwise
    return _checked(lambda: images.analyze(service, images.as_image_url(image, ctx.sandbox), question))


@_networked("image_gen")
def image_generate(ctx: ToolContext, prompt: str, size: str = "1024x1024") -> dict[str, Any]:
    """Generate an image from a text description, save it in the working directory and return its path.

    Args:
        prompt: A detailed description of the image to create.
        size: Image size as WIDTHxHEIGHT in pixels (default "1024x1024").
    """
    service = ctx.backends.image
    assert service is not None  # not offered otherwise
    data = _checked(lambda: images.generate(service, prompt, size))
    path = ctx.sandbox.write_file(images.file_name(prompt, data), data)
    return {"path": path, "bytes": len(data), "mime_type": images.mime_of(data), "size": size}


@_networked("browser")
def browser_navigate(ctx: ToolContext, url: str) -> dict[str, Any]:
    """Open a URL in the browser and return a text snapshot of the loaded page.

    Args:
        url: The http(s) address to open.
    """
    _checked(lambda: ctx.backends.check_reachable(url))
    return _on_page(ctx, lambda page: page.navigate(url))


@_networked("browser", read_only=True)
def browser_snapshot(ctx: ToolContext) -> dict[str, Any]:
    """Return a text snapshot of the current page: its text and interactive elements, each with a
    ref (like "@e5") to pass to browser_click or browser_type."""
    return _on_page(ctx, lambda page: page.snapshot())


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
def browser_vision(ctx: ToolContext, question: str) -> dict[str, Any]:
    """Take a screenshot of the current page and answer a question about what it shows (layout,
    charts, CAPTCHAs and other visual content the text snapshot misses).

    Args:
        question: What you want to know about the page's appearance.
    """
    service = ctx.backends.vision
    assert service is not None  # not offered otherwise
    screenshot = _on_page(ctx, lambda page: page.screenshot())
    return _checked(lambda: images.analyze(service, screenshot, question))


@_networked("browser", read_only=True)
def browser_console(ctx: ToolContext) -> dict[str, Any]:
    """Return the JavaScript console messages and errors logged by the current page."""
    return {"messages": _on_page(ctx, lambda page: list(page.console[-100:])), "untrusted_content": True}
