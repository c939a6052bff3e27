"""`python -m hermes_core.endpoints.simulated` (or `hermes-foundry sim-model`): run the simulated model
server in the foreground."""

from __future__ import annotations

import argparse

from hermes_core.endpoints.simulated.server import serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="hermes-foundry sim-model", description="Serve the SIMULATED OpenAI-compatible model "
                                     "(hermes-sim: demos and tests, NOT a real model).")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind; 0 picks a free port")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds of delay per completion")
    parser.add_argument("--port-file", "--port_file", dest="port_file", help="write the bound port to this file")
    args = parser.parse_args(argv)
    serve(args.host, args.port, args.latency, args.port_file)


if __name__ == "__main__":
    main()
