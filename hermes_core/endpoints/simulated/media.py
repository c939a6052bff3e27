"""The simulated model's image side: `/images/generations` paints a solid PNG whose colour comes
from the prompt, and a chat request whose last user message carries an image is answered with
what can be read off the image itself (format, size, colour of its first pixel). Deterministic."""

from __future__ import annotations

import base64
import hashlib
import re
import struct
import time
import zlib
from typing import Any

from hermes_core.endpoints.simulated.policy import Reply, text_of

MAX_SIDE = 2048


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A solid-colour 8-bit RGB PNG."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\x00" + bytes(rgb) * width
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(row * height, 6)) + chunk(b"IEND", b""))


def image_generation(body: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI images response for a generation request (b64_json, whatever was asked)."""
    prompt = str(body.get("prompt") or "")
    match = re.fullmatch(r"(\d{1,5})x(\d{1,5})", str(body.get("size") or "256x256"))
    width, height = (min(int(side), MAX_SIDE) for side in match.groups()) if match else (256, 256)
    rgb = tuple(hashlib.sha256(prompt.encode()).digest()[:3])
    data = png(max(width, 1), max(height, 1), rgb)  # type: ignore[arg-type]
    return {"created": int(time.time()), "data": [{"b64_json": base64.b64encode(data).decode(),
                                                   "revised_prompt": f"{prompt} (simulated: a solid colour)"}]}


def vision_reply(body: dict[str, Any]) -> Reply | None:
    """A description of the image in the last user message, or None when it has none."""
    users = [m for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "user"]
    parts = users[-1].get("content") if users else None
    if not isinstance(parts, list):
        return None
    images = [p["image_url"].get("url", "") for p in parts if isinstance(p, dict) and p.get("type") == "image_url"
              and isinstance(p.get("image_url"), dict)]
    if not images:
        return None
    question = text_of(parts).strip() or "Describe the image."
    content = f"Simulated vision (hermes-sim, not a real model). Asked: {question!r}. I see {_describe(images[0])}."
    usage = {"prompt_tokens": 85 + len(question) // 4, "completion_tokens": len(content) // 4,
             "total_tokens": 85 + len(question) // 4 + len(content) // 4}
    return Reply(content, None, usage=usage)


def _describe(url: str) -> str:
    if not url.startswith("data:"):
        return f"an image at {url} (the simulated model does not download images)"
    try:
        data = base64.b64decode(url.split(",", 1)[1])
    except (IndexError, ValueError):
        return "an image whose data URL does not decode"
    if not data.startswith(b"\x89PNG") or len(data) < 33:
        return f"an image of {len(data)} bytes that is not a PNG"
    width, height, depth, colour = struct.unpack(">IIBB", data[16:26])
    first = _first_pixel(data) if depth == 8 and colour in (2, 6) else None
    return (f"a {width}x{height} PNG image" + (f" whose first pixel is #{first}" if first else "")
            + f" ({len(data)} bytes)")


def _first_pixel(data: bytes) -> str | None:
    """Hex colour of the top-left pixel: every PNG filter leaves the first pixel of the first row as is."""
    idat, offset = b"", 8
    while offset + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[offset:offset + 8])
        if kind == b"IDAT":
            idat += data[offset + 8:offset + 8 + length]
        offset += 12 + length
    try:
        raw = zlib.decompressobj().decompress(idat, 16)
    except zlib.error:
        return None
    return raw[1:4].hex() if len(raw) >= 4 else None
