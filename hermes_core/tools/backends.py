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
    "HERMES_WEB_ALLOW_HOSTS": "comma-separated HOST:PORT the web tools may reach although private (a local site)",
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


class AddressRefused(BackendError):
    """The address policy refuses a URL or a host: not http(s), or a private address."""


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
    web_allow_hosts: frozenset[str] = frozenset()  # "host:port" ("[v6]:port"), lower case
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
            web_allow_hosts=_host_ports(env.get("HERMES_WEB_ALLOW_HOSTS") or ""),
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

    def check_reachable(self, url: str) -> list[str]:
        """Refuse URLs the web tools must not fetch: only http(s), and (unless allowed) no private,
        loopback or link-local address, such as a cloud metadata service. The addresses checked, to
        connect to (see `resolve_allowed`)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise AddressRefused(f"{url!r}: only http and https URLs can be fetched")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise BackendError(f"{url!r}: invalid port") from None
        return self.resolve_allowed(parts.hostname, port)

    def resolve_allowed(self, host: str, port: int) -> list[str]:
        """The addresses of `host` the web tools may connect to on `port`, from one DNS lookup: the
        caller connects to one of these, never looking the name up again, so a DNS answer that
        changes after the check (rebinding) cannot lead elsewhere. AddressRefused if any address is
        not global (private, loopback, link-local, reserved...) or is multicast, unless
        HERMES_WEB_ALLOW_PRIVATE is set or the (host, port) is in HERMES_WEB_ALLOW_HOSTS;
        BackendError if the name does not resolve."""
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise BackendError(f"{host}: cannot resolve ({exc})") from None
        addresses = list(dict.fromkeys(info[4][0] for info in found))
        for address in addresses:
            ip = ipaddress.ip_address(address.split("%")[0])
            ip = getattr(ip, "ipv4_mapped", None) or ip  # ::ffff:127.0.0.1 is loopback too
            public = ip.is_global and not ip.is_multicast  # not private, shared, loopback, link-local, reserved
            listed = {_host_port(host, port), _host_port(str(ip), port)} & self.web_allow_hosts
            if public or listed or self.web_allow_private:
                continue
            raise AddressRefused(f"{host} resolves to {ip}, a private address: refused "
                                 "(HERMES_WEB_ALLOW_PRIVATE=1 allows it)")
        return addresses


def _host_port(host: str, port: int) -> str:
    host = host.lower().strip("[]")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _host_ports(raw: str) -> frozenset[str]:
    """HERMES_WEB_ALLOW_HOSTS, normalised; each entry must name a port, so a whole host is never opened."""
    entries = set()
    for entry in filter(None, (part.strip() for part in raw.split(","))):
        host, _, port = entry.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise BackendError(f"HERMES_WEB_ALLOW_HOSTS: {entry!r} is not HOST:PORT")
        entries.add(_host_port(host, int(port)))
    return frozenset(entries)


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
