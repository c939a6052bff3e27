"""`python -m hermes_core.endpoints.simulated` (or `hermes-foundry sim-model`): run the simulated model
server in the foreground."""

from __future__ import annotations

import argparse

from hermes_core.endpoints.simulated.server import serve


def parser() -> argparse.ArgumentParser:
    """The simulated model's options (docs/reference/cli.md is generated from them)."""
    options = argparse.ArgumentParser(prog="hermes-foundry sim-model", description="Serve the SIMULATED OpenAI-compatible model "
                                     "(hermes-sim: demos and tests, NOT a real model).")
    options.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    options.add_argument("--port", type=int, default=8000, help="port to bind; 0 picks a free port")
    options.add_argument("--latency", type=float, default=0.0, help="seconds of delay per completion")
    options.add_argument("--port-file", "--port_file", dest="port_file", help="write the bound port to this file")
    return options


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    serve(args.host, args.port, args.latency, args.port_file)


if __name__ == "__main__":
    main()
