"""OpenAI-compatible API server that runs the full Hermes agent per request (SPEC §11).

    hermes-foundry serve [--host --port --base_url --api_key --model --toolsets --env_file]

Library use: `ApiServer(load_settings(...))` runs it in a background thread (tests, notebooks);
`serve(settings)` runs it in the foreground until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys

from hermes_core.api_server.app import create_app
from hermes_core.api_server.settings import (
    ApiServerSettings,
    SettingsError,
    add_serve_arguments,
    export_env_file,
    load_settings,
    settings_from_args,
)
from hermes_core.asgi_thread import ThreadedServer, bind_socket, http_url, serve_on_socket, uvicorn_config


class ApiServer(ThreadedServer):
    """The API server in a daemon thread; `start()` returns once it accepts connections.

    Stopping cancels the agent runs still in progress and waits for their sandboxes to close."""

    def __init__(self, settings: ApiServerSettings, log_level: str = "warning") -> None:
        self.settings = settings
        self.app = create_app(settings)
        super().__init__(uvicorn_config(self.app, log_level, lifespan="on"), settings.host, settings.port,
                         "hermes-api", before_shutdown=self.app.state.runs.shutdown)

    @property
    def base_url(self) -> str:
        """What OpenAI clients take as `base_url`."""
        return self.url("/v1")

    @property
    def active_runs(self) -> int:
        return len(self.app.state.runs.tasks)

    @property
    def busy_threads(self) -> int:
        """Worker threads running a tool call or a sandbox open or close right now."""
        return self.app.state.workers.busy

    def start(self, timeout: float = 10.0) -> ApiServer:
        super().start(timeout)
        return self

    def __enter__(self) -> ApiServer:
        return self.start()


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def serve(settings: ApiServerSettings) -> None:
    """Serve in the foreground until SIGINT/SIGTERM."""
    sock = bind_socket(settings.host, settings.port)
    url = http_url(settings.host, sock.getsockname()[1], "/v1")
    endpoint = settings.endpoint
    print(f"Hermes API server on {url} (model id {settings.model_name!r}; the agent uses {endpoint.model!r} at "
          f"{endpoint.base_url}; toolsets {', '.join(settings.toolsets) if settings.toolsets else 'all available'})",
          flush=True)
    if not _loopback(settings.host):
        print("warning: listening beyond loopback; put a TLS-terminating proxy in front, the bearer key "
              "travels in every request", file=sys.stderr, flush=True)
    app = create_app(settings)
    serve_on_socket(uvicorn_config(app, "info", lifespan="on", access_log=True), sock, app.state.runs.shutdown)


def serve_command(args: argparse.Namespace) -> int:
    """`hermes-foundry serve` after argument parsing: exit code 2 with a message on bad settings."""
    try:
        export_env_file(args.env_file)
        settings = settings_from_args(args)
    except SettingsError as exc:
        print(f"hermes-foundry serve: refusing to start: {exc}", file=sys.stderr)
        return 2
    try:
        serve(settings)
    except OSError as exc:  # e.g. the port is taken
        print(f"hermes-foundry serve: cannot listen on {settings.host}:{settings.port}: {exc}", file=sys.stderr)
        return 1
    return 0


def serve_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hermes-foundry serve",
        description="OpenAI-compatible API server: each chat completion runs the full Hermes agent with its tools.",
    )
    return serve_command(add_serve_arguments(parser).parse_args(argv))


__all__ = [
    "ApiServer",
    "ApiServerSettings",
    "SettingsError",
    "add_serve_arguments",
    "create_app",
    "load_settings",
    "serve",
    "serve_command",
    "serve_main",
]
