"""Toolsets "web", "vision", "image_gen" and "browser": tools that need an outside service.

They are registered with their real schemas so the tool universe (and the dataset schema) is the
same everywhere. A toolset is offered only when its backend is configured (`ToolBackends`); the
browser backend is not built yet, so its tools are never offered and calling one returns that.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, NoReturn

from hermes_core import images, web
from hermes_core.tools.backends import ToolBackends
from hermes_core.tools.registry import ToolContext, ToolError, tool

BROWSER_NOT_BUILT = "the browser backend is not built yet (Chromium over CDP is planned)"


def _networked(toolset: str, read_only: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def reason(backends: ToolBackends) -> str | None:
        return BROWSER_NOT_BUILT if toolset == "browser" else backends.unavailable(toolset)

    return tool(toolset, read_only=read_only, unavailable_reason=reason)


def _browser_not_built() -> NoReturn:
    """The one body of every browser tool until its backend exists."""
    raise ToolError(BROWSER_NOT_BUILT)


def _checked(call: Callable[[], Any]) -> Any:
    """Backend failures become tool errors: the model reads what went wrong and can try otherwise."""
    try:
        return call()
    except (web.WebError, images.ImageError) as exc:
        raise ToolError(str(exc)) from None


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
    _browser_not_built()


@_networked("browser", read_only=True)
def browser_snapshot(ctx: ToolContext) -> dict[str, Any]:
    """Return a text snapshot of the current page: its text and interactive elements, each with a
    ref (like "@e5") to pass to browser_click or browser_type."""
    _browser_not_built()


@_networked("browser")
def browser_click(ctx: ToolContext, ref: str) -> dict[str, Any]:
    """Click an element of the current page (link, button, checkbox...).

    Args:
        ref: The element's ref from the latest snapshot, e.g. "@e5".
    """
    _browser_not_built()


@_networked("browser")
def browser_type(ctx: ToolContext, ref: str, text: str) -> dict[str, Any]:
    """Type text into an input field of the current page, replacing what it contains.

    Args:
        ref: The input element's ref from the latest snapshot, e.g. "@e3".
        text: The text to type.
    """
    _browser_not_built()


@_networked("browser")
def browser_scroll(ctx: ToolContext, direction: Literal["up", "down"]) -> dict[str, Any]:
    """Scroll the current page by one screen and return the newly visible content.

    Args:
        direction: "down" to read further, "up" to go back.
    """
    _browser_not_built()


@_networked("browser")
def browser_back(ctx: ToolContext) -> dict[str, Any]:
    """Go back to the previous page in the browser history."""
    _browser_not_built()


@_networked("browser")
def browser_press(ctx: ToolContext, key: str) -> dict[str, Any]:
    """Press a keyboard key in the browser, e.g. to submit a form or close a dialog.

    Args:
        key: The key name, e.g. "Enter", "Escape", "Tab" or "ArrowDown".
    """
    _browser_not_built()


@_networked("browser", read_only=True)
def browser_get_images(ctx: ToolContext) -> dict[str, Any]:
    """List the images on the current page with their URLs and alt texts."""
    _browser_not_built()


@_networked("browser", read_only=True)
def browser_vision(ctx: ToolContext, question: str) -> dict[str, Any]:
    """Take a screenshot of the current page and answer a question about what it shows (layout,
    charts, CAPTCHAs and other visual content the text snapshot misses).

    Args:
        question: What you want to know about the page's appearance.
    """
    _browser_not_built()


@_networked("browser", read_only=True)
def browser_console(ctx: ToolContext) -> dict[str, Any]:
    """Return the JavaScript console messages and errors logged by the current page."""
    _browser_not_built()
