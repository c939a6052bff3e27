"""The vision and image generation backends: OpenAI-compatible chat completions with an image part,
and `/images/generations`. Images from the session sandbox travel as data URLs."""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Any

from hermes_core.sandbox import Sandbox
from hermes_core.tools.backends import Service

MAX_IMAGE_BYTES = 20 * 1024 * 1024
SIZES = {"landscape": "1536x1024", "square": "1024x1024", "portrait": "1024x1536"}  # per aspect_ratio
TIMEOUT_S = 120.0
_MIME = {b"\x89PNG": "image/png", b"\xff\xd8\xff": "image/jpeg", b"GIF8": "image/gif", b"RIFF": "image/webp"}


class ImageError(RuntimeError):
    """A vision or generation request failed; the message is what the model reads."""


def mime_of(data: bytes) -> str | None:
    return next((mime for magic, mime in _MIME.items() if data.startswith(magic)), None)


def as_image_url(image: str, sandbox: Sandbox) -> str:
    """An http(s) or data URL as given; anything else is a path in the session sandbox, sent inline."""
    if re.match(r"^(https?://|data:image/)", image):
        return image
    data = sandbox.read_file(image)
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"{image}: {len(data)} bytes, more than the {MAX_IMAGE_BYTES} a vision request takes")
    mime = mime_of(data)
    if mime is None:
        raise ImageError(f"{image}: not a PNG, JPEG, GIF or WebP image")
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def _post(service: Service, path: str, body: dict[str, Any]) -> dict[str, Any]:
    import httpx  # when an image tool runs: importing it costs every command ~0.1 s of start-up

    try:
        response = httpx.post(f"{service.base_url}{path}", json={"model": service.model, **body},
                              headers={"Authorization": f"Bearer {service.api_key}"}, timeout=TIMEOUT_S)
        if response.status_code >= 400:
            raise ImageError(f"HTTP {response.status_code} from {service.base_url}{path}: {response.text[:300]}")
        return response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise ImageError(f"{service.base_url}{path}: {type(exc).__name__}: {exc}") from None


def analyze(service: Service, image_url: str, question: str) -> dict[str, Any]:
    """The vision model's answer to `question` about the image."""
    reply = _post(service, "/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": question}, {"type": "image_url", "image_url": {"url": image_url}}]}]})
    try:
        answer = reply["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ImageError("the vision endpoint's reply has no message content") from None
    return {"answer": answer, "model": reply.get("model") or service.model}


def generate(service: Service, prompt: str, size: str, sources: list[str] | None = None) -> bytes:
    """The generated image's bytes (asked for as base64; a URL answer is downloaded). With `sources`
    (image URLs, the first one to edit, the others references) it is an edit: `/images/edits`,
    the images given by URL in a JSON body."""
    if not re.fullmatch(r"\d{2,5}x\d{2,5}", size):
        raise ImageError(f"size {size!r}: expected WIDTHxHEIGHT, e.g. 1024x1024")
    body: dict[str, Any] = {"prompt": prompt, "size": size, "n": 1, "response_format": "b64_json"}
    if sources:
        reply = _post(service, "/images/edits", {**body, "images": [{"image_url": url} for url in sources]})
    else:
        reply = _post(service, "/images/generations", body)
    try:
        item = reply["data"][0]
    except (KeyError, IndexError, TypeError):
        raise ImageError("the images endpoint's reply has no data") from None
    if item.get("b64_json"):
        data = base64.b64decode(item["b64_json"])
    elif item.get("url"):
        import httpx  # see _post

        try:
            data = httpx.get(item["url"], timeout=TIMEOUT_S).raise_for_status().content
        except httpx.HTTPError as exc:
            raise ImageError(f"downloading the generated image failed: {exc}") from None
    else:
        raise ImageError("the images endpoint returned neither b64_json nor url")
    if mime_of(data) is None:
        raise ImageError("the images endpoint returned something that is not an image")
    return data


def file_name(prompt: str, data: bytes) -> str:
    """images/<words of the prompt>-<content hash>.<ext>: readable and never overwriting another image."""
    slug = "-".join(re.findall(r"[a-z0-9]+", prompt.lower())[:6])[:48] or "image"
    extension = (mime_of(data) or "image/png").split("/")[1].replace("jpeg", "jpg")
    return f"images/{slug}-{hashlib.sha256(data).hexdigest()[:10]}.{extension}"
