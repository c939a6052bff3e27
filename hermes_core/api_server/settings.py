"""Configuration of the API server (SPEC §11): flags > process environment > env file > defaults.

The env file is `$HERMES_ENV_FILE`, else `~/.hermes/.env`; a missing default file is fine, a missing
file that was asked for explicitly is an error. The upstream model is resolved as everywhere (§13).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping
from urllib.parse import urlsplit

from dotenv import dotenv_values

from hermes_core.endpoints.constrained import NATIVE, TOOL_CALL_MODES
from hermes_core.config import Endpoint

ENV_FILE_VAR = "HERMES_ENV_FILE"
MIN_KEY_LENGTH = 16
DEFAULT_PORT = 8642
DEFAULT_MODEL_NAME = "hermes-agent"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")
AUTO = "auto"  # inline progress for plain chat clients, named events only for Hermes-aware ones

ENVIRONMENT_HELP = """
environment (or the env file; flags win, then the process environment, then the file):
  API_SERVER_KEY                 required bearer key, at least 16 characters (never pass it on the command line)
  API_SERVER_ENABLED             false refuses to start (default true)
  API_SERVER_HOST, _PORT         listen address (default 127.0.0.1:8642)
  API_SERVER_CORS_ORIGINS        comma list of browser origins allowed to call the API (default none)
  API_SERVER_MODEL_NAME          model id the server advertises (default hermes-agent)
  API_SERVER_MAX_CONCURRENT_RUNS agent runs at once; more get 429 (default 4)
  API_SERVER_MAX_BODY_BYTES      request body limit; more get 413 (default 1048576)
  API_SERVER_TOOLSETS            comma list of toolsets offered to the agent (default all available)
  API_SERVER_INLINE_PROGRESS     auto (default): tool progress also as content lines in streams unless the
                                 client is Hermes-aware (docs/reference/api-server.md); true: always; false: never
  API_SERVER_MAX_SESSIONS        X-Hermes-Session-Id sessions kept at once; a new one closes an idle one
                                 of the same client, else of a client holding more (default 32)
  API_SERVER_SESSION_IDLE_SECONDS  a session unused this long is closed with its sandbox; a closed session's
                                 id answers 410 session_expired for as long again (default 1800)
  API_SERVER_MAX_SESSION_HISTORY_BYTES  a session whose history (JSON) grew past this answers 413
                                 session_history_too_large (default 4194304)
  API_SERVER_MAX_ITERATIONS      model calls per request before the summary call (default 90)
  API_SERVER_KEEPALIVE_SECONDS   SSE ": ping" comment interval while tools run (default 15)
  API_SERVER_TOOL_CALL_MODE      native (default) or constrained, for upstream models without tool calling
  HERMES_BASE_URL, HERMES_API_KEY, HERMES_MODEL   upstream model (fallbacks OPENAI_BASE_URL, OPENAI_API_KEY)
  HERMES_TERMINAL_BACKEND, HERMES_SANDBOX_*       where and how tools run (docs/explanation/sandboxes.md)
  HERMES_ENV_FILE                env file to read (default ~/.hermes/.env)
"""


class SettingsError(ValueError):
    """The server must not start with this configuration; the message says what to change."""


@dataclass(frozen=True)
class ApiServerSettings:
    key: str = field(repr=False)
    endpoint: Endpoint = field(repr=False)  # its api_key must not end up in logs either
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    cors_origins: tuple[str, ...] = ()
    model_name: str = DEFAULT_MODEL_NAME
    max_concurrent_runs: int = 4
    max_body_bytes: int = 1024 * 1024
    toolsets: tuple[str, ...] | None = None  # None: every toolset whose tools are available
    inline_progress: bool | str = AUTO  # True, False or AUTO
    max_sessions: int = 32
    session_idle_s: float = 1800.0
    max_session_history_bytes: int = 4 * 1024 * 1024
    max_iterations: int = 90
    keepalive_s: float = 15.0
    sandbox_backend: str | None = None  # None: $HERMES_TERMINAL_BACKEND or "local"
    tool_call_mode: str = NATIVE  # constrained: tools through a JSON-schema reply (hermes_core.endpoints.constrained)

    def __post_init__(self) -> None:
        if len(self.key or "") < MIN_KEY_LENGTH:
            raise SettingsError(
                f"API_SERVER_KEY must be set to a secret of at least {MIN_KEY_LENGTH} characters "
                f"(got {len(self.key or '')}); e.g. API_SERVER_KEY=$(openssl rand -hex 24)"
            )
        for name in ("max_concurrent_runs", "max_body_bytes", "max_iterations", "max_sessions",
                     "max_session_history_bytes"):
            if getattr(self, name) < 1:
                raise SettingsError(f"{name} must be at least 1")
        if self.keepalive_s <= 0 or self.session_idle_s <= 0:
            raise SettingsError("keepalive_s and session_idle_s must be positive")
        if self.inline_progress not in (True, False, AUTO):
            raise SettingsError(f"inline_progress={self.inline_progress!r}: expected true, false or auto")
        if self.tool_call_mode not in TOOL_CALL_MODES:
            raise SettingsError(f"API_SERVER_TOOL_CALL_MODE={self.tool_call_mode!r}: expected one of "
                                f"{', '.join(TOOL_CALL_MODES)}")
        for origin in self.cors_origins:
            _check_origin(origin)
        if self.toolsets is not None:
            from hermes_core.agent.loop import resolve_toolsets  # the agent's own check: same names, same error

            try:
                resolve_toolsets(list(self.toolsets), None)
            except ValueError as exc:
                raise SettingsError(f"API_SERVER_TOOLSETS: {exc}") from exc


def _check_origin(origin: str) -> None:
    # Explicit origins only: a wildcard would let any web page drive a tool-running agent.
    parts = urlsplit(origin)
    if origin in ("*", "null") or parts.scheme not in ("http", "https") or not parts.netloc or parts.path:
        raise SettingsError(
            f"API_SERVER_CORS_ORIGINS: {origin!r} is not an explicit origin like https://chat.example.com "
            "(no wildcards, no paths)"
        )


def read_env_file(path: str | Path) -> dict[str, str]:
    # No interpolation: a key containing "$" must arrive exactly as written.
    return {k: v for k, v in dotenv_values(path, interpolate=False).items() if v is not None}


def default_env_file(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    return Path(environ.get(ENV_FILE_VAR) or Path.home() / ".hermes" / ".env").expanduser()


def merged_environment(env_file: str | Path | None = None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The env file's values under the process environment's (the process wins)."""
    environ = dict(os.environ if environ is None else environ)
    path = Path(env_file).expanduser() if env_file else default_env_file(environ)
    if env_file and not path.is_file():
        raise SettingsError(f"env file {path} " + ("is not a regular file" if path.exists() else "does not exist"))
    return {**(read_env_file(path) if path.is_file() else {}), **environ}


def export_env_file(env_file: str | Path | None = None) -> None:
    """Copy the env file's values into os.environ where unset, for the CLI process: the agent reads
    sandbox settings (HERMES_SANDBOX_*) from the environment, so a file-only setting must land there."""
    for name, value in merged_environment(env_file).items():
        os.environ.setdefault(name, value)


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None:
        return default
    if raw.strip().lower() in _TRUE:
        return True
    if raw.strip().lower() in _FALSE:
        return False
    raise SettingsError(f"{name}={raw!r}: expected true or false")


def _inline_progress(env: Mapping[str, str]) -> bool | str:
    raw = (env.get("API_SERVER_INLINE_PROGRESS") or AUTO).strip().lower()
    if raw == AUTO:
        return AUTO
    if raw in _TRUE or raw in _FALSE:
        return raw in _TRUE
    raise SettingsError(f"API_SERVER_INLINE_PROGRESS={raw!r}: expected auto, true or false")


def _number(env: Mapping[str, str], name: str, default: float, kind: type = int) -> float:
    raw = (env.get(name) or "").strip()
    try:
        return kind(raw) if raw else default
    except ValueError:
        raise SettingsError(f"{name}={raw!r}: expected {'an integer' if kind is int else 'a number'}") from None


def _list(raw: str | None) -> tuple[str, ...]:
    return tuple(item.strip().rstrip("/") for item in (raw or "").split(",") if item.strip())


def load_settings(
    env_file: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    host: str | None = None,
    port: int | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    model: str | None = None,
    toolsets: str | None = None,
) -> ApiServerSettings:
    """Settings from flags (the keyword arguments), the environment and the env file."""
    env = merged_environment(env_file, environ)
    if not _bool(env, "API_SERVER_ENABLED", True):
        raise SettingsError("the API server is disabled (API_SERVER_ENABLED=false); set it to true to serve")

    def pick(*names: str) -> str | None:
        return next((env[name] for name in names if env.get(name)), None)

    try:
        endpoint = Endpoint.resolve(base_url or pick("HERMES_BASE_URL", "OPENAI_BASE_URL"),
                                    api_key or pick("HERMES_API_KEY", "OPENAI_API_KEY"),
                                    model or pick("HERMES_MODEL"))
    except ValueError as exc:
        raise SettingsError(str(exc)) from exc
    toolset_list = _list(toolsets if toolsets is not None else env.get("API_SERVER_TOOLSETS"))
    return ApiServerSettings(
        key=env.get("API_SERVER_KEY", ""),
        endpoint=endpoint,
        host=host or env.get("API_SERVER_HOST") or "127.0.0.1",
        port=int(port if port is not None else _number(env, "API_SERVER_PORT", DEFAULT_PORT)),
        cors_origins=_list(env.get("API_SERVER_CORS_ORIGINS")),
        model_name=env.get("API_SERVER_MODEL_NAME") or DEFAULT_MODEL_NAME,
        max_concurrent_runs=int(_number(env, "API_SERVER_MAX_CONCURRENT_RUNS", 4)),
        max_body_bytes=int(_number(env, "API_SERVER_MAX_BODY_BYTES", 1024 * 1024)),
        toolsets=toolset_list or None,
        inline_progress=_inline_progress(env),
        max_sessions=int(_number(env, "API_SERVER_MAX_SESSIONS", 32)),
        session_idle_s=float(_number(env, "API_SERVER_SESSION_IDLE_SECONDS", 1800.0, float)),
        max_session_history_bytes=int(_number(env, "API_SERVER_MAX_SESSION_HISTORY_BYTES", 4 * 1024 * 1024)),
        max_iterations=int(_number(env, "API_SERVER_MAX_ITERATIONS", 90)),
        keepalive_s=float(_number(env, "API_SERVER_KEEPALIVE_SECONDS", 15.0, float)),
        sandbox_backend=env.get("HERMES_TERMINAL_BACKEND") or None,
        tool_call_mode=env.get("API_SERVER_TOOL_CALL_MODE") or NATIVE,
    )


def add_serve_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags of `hermes-foundry serve`; shared by the CLI subcommand and `serve_main`."""
    parser.add_argument("--host", help="interface to bind (default $API_SERVER_HOST or 127.0.0.1)")
    parser.add_argument("--port", type=int, help=f"port to bind, 0 = any free port (default {DEFAULT_PORT})")
    parser.add_argument("--base_url", help="upstream OpenAI-compatible endpoint (default $HERMES_BASE_URL)")
    parser.add_argument("--api_key", help="upstream endpoint's API key (default $HERMES_API_KEY); "
                        "not the server's own key, which only comes from API_SERVER_KEY")
    parser.add_argument("--model", help="upstream model name (default $HERMES_MODEL)")
    parser.add_argument("--toolsets", help="comma list of toolsets offered (default $API_SERVER_TOOLSETS or all)")
    parser.add_argument("--env_file", "--env-file", dest="env_file",
                        help=f"env file to read (default ${ENV_FILE_VAR} or ~/.hermes/.env)")
    parser.epilog = ENVIRONMENT_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def settings_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> ApiServerSettings:
    return load_settings(args.env_file, environ, host=args.host, port=args.port, base_url=args.base_url,
                         api_key=args.api_key, model=args.model, toolsets=args.toolsets)
