"""Where the networked toolsets (web, vision, image_gen, browser) send their work, from the
environment and, per run, the recipe's `tool_backends` (same names; they win).

A toolset whose backend is not configured is not offered to the model (SPEC §3.4): its tools stay
in the tool universe, and a sample that drew it counts it in `toolsets_lost`.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
from dataclasses import dataclass
from typing import Mapping
from urllib.parse import urlsplit

KNOWN = {
    "HERMES_WEB_SEARCH_URL": "SearXNG instance for web_search (its /search?format=json API)",
    "HERMES_WEB_ALLOW_PRIVATE": "1: web tools may reach private, loopback and link-local addresses (default 0)",
    "HERMES_WEB_TIMEOUT_S": "seconds per web request (default 20)",
    "HERMES_WEB_MAX_CHARS": "characters of text per page or result list given to the model (default 8000)",
    "HERMES_VISION_BASE_URL": "OpenAI-compatible endpoint with a vision model, for vision_analyze",
    "HERMES_VISION_API_KEY": "its API key",
    "HERMES_VISION_MODEL": "its model name",
    "HERMES_IMAGE_BASE_URL": "OpenAI-compatible images endpoint (/images/generations), for image_generate",
    "HERMES_IMAGE_API_KEY": "its API key",
    "HERMES_IMAGE_MODEL": "its model name",
    "HERMES_BROWSER_EXECUTABLE": "Chromium to drive for the browser tools (e.g. /usr/bin/chromium)",
}


class BackendError(ValueError):
    """A tool backend setting is invalid (the message names it)."""


@dataclass(frozen=True)
class Service:
    """An OpenAI-compatible service: vision chat completions or image generations."""

    base_url: str
    api_key: str
    model: str


@dataclass(frozen=True)
class ToolBackends:
    web_search_url: str | None = None
    web_allow_private: bool = False
    web_timeout_s: float = 20.0
    web_max_chars: int = 8000
    vision: Service | None = None
    image: Service | None = None
    browser_executable: str | None = None

    @classmethod
    def resolve(cls, overrides: Mapping[str, str] | None = None,
                environ: Mapping[str, str] | None = None) -> "ToolBackends":
        """From `environ` (default os.environ) with `overrides` (a recipe's tool_backends) on top."""
        unknown = sorted(set(overrides or {}) - set(KNOWN))
        if unknown:
            raise BackendError(f"unknown tool backend setting(s) {unknown}; known: {', '.join(sorted(KNOWN))}")
        env = {**(os.environ if environ is None else environ), **(overrides or {})}

        def service(prefix: str) -> Service | None:
            base_url = (env.get(f"HERMES_{prefix}_BASE_URL") or "").rstrip("/")
            if not base_url:
                return None
            _check_url(f"HERMES_{prefix}_BASE_URL", base_url)
            return Service(base_url, env.get(f"HERMES_{prefix}_API_KEY") or "none",
                           env.get(f"HERMES_{prefix}_MODEL") or "default")

        search = (env.get("HERMES_WEB_SEARCH_URL") or "").rstrip("/") or None
        if search:
            _check_url("HERMES_WEB_SEARCH_URL", search)
        browser = env.get("HERMES_BROWSER_EXECUTABLE") or None
        if browser and not shutil.which(browser):
            raise BackendError(f"HERMES_BROWSER_EXECUTABLE={browser!r}: no such executable")
        return cls(
            web_search_url=search,
            web_allow_private=env.get("HERMES_WEB_ALLOW_PRIVATE", "0").strip().lower() in ("1", "true", "yes"),
            web_timeout_s=_number(env, "HERMES_WEB_TIMEOUT_S", 20.0),
            web_max_chars=int(_number(env, "HERMES_WEB_MAX_CHARS", 8000)),
            vision=service("VISION"), image=service("IMAGE"),
            browser_executable=shutil.which(browser) if browser else None,
        )

    def unavailable(self, toolset: str) -> str | None:
        """Why `toolset` cannot be offered with these backends, or None."""
        missing = {
            "web": self.web_search_url is None and "no web search backend configured (HERMES_WEB_SEARCH_URL)",
            "vision": self.vision is None and "no vision backend configured (HERMES_VISION_BASE_URL)",
            "image_gen": self.image is None and "no image generation backend configured (HERMES_IMAGE_BASE_URL)",
            "browser": self.browser_executable is None and "no browser configured (HERMES_BROWSER_EXECUTABLE)",
        }.get(toolset)
        return missing or None

    def check_reachable(self, url: str) -> None:
        """Refuse URLs the web tools must not fetch: only http(s), and (unless allowed) no private,
        loopback or link-local address, such as a cloud metadata service."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BackendError(f"{url!r}: only http and https URLs can be fetched")
        if self.web_allow_private:
            return
        try:
            addresses = {info[4][0] for info in socket.getaddrinfo(parts.hostname, parts.port or 80)}
        except OSError as exc:
            raise BackendError(f"{parts.hostname}: cannot resolve ({exc})") from None
        for address in addresses:
            ip = ipaddress.ip_address(address.split("%")[0])
            if ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_reserved or ip.is_unspecified:
                raise BackendError(f"{parts.hostname} resolves to {ip}, a private address: refused "
                                   "(HERMES_WEB_ALLOW_PRIVATE=1 allows it)")


def _check_url(name: str, url: str) -> None:
    if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
        raise BackendError(f"{name}={url!r}: expected an http(s) URL")


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise BackendError(f"{name}={raw!r}: expected a number") from None
    if value <= 0:
        raise BackendError(f"{name}={raw!r}: must be positive")
    return value
