"""`python -m hermes_core.simulated`: run the simulated model server in the foreground."""

from __future__ import annotations

import argparse

from hermes_core.simulated.server import serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hermes_core.simulated", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free port")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds of delay per completion")
    parser.add_argument("--port-file", default=None, help="write the bound port to this file")
    args = parser.parse_args(argv)
    serve(args.host, args.port, args.latency, args.port_file)


if __name__ == "__main__":
    main()
