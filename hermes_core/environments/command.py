"""`hermes-foundry env process|serve|evaluate`: a task file's RL environment in atroposlib's three modes.

- process: scored groups to a JSONL file, no API server (`--groups` groups of `--group_size`)
- serve: groups to a running Atropos API server (`run-api`) until the trainer's `--steps` are reached
- evaluate: one rollout per `split: eval` task; metrics and samples to `--eval_dir`
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

MODES = ("process", "serve", "evaluate")


def add_env_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("mode", choices=MODES, help="process: groups to a file; serve: to run-api; evaluate: eval split")
    parser.add_argument("--tasks", help="JSONL task file (docs/how-to/rl-environments.md), or a built-in environment: "
                        "builtin:coding, builtin:terminal, builtin:task_folders; optional with an --env_class that "
                        "builds its own tasks")
    parser.add_argument("--env_class", help="your environment: module:Class or path/to/file.py:Class, a subclass of "
                        "hermes_core.environments.atropos_env.HermesEnv (default: HermesEnv)")
    parser.add_argument("--base_url", help="OpenAI-compatible endpoint (default $HERMES_BASE_URL / $OPENAI_BASE_URL)")
    parser.add_argument("--model", help="model name (default $HERMES_MODEL)")
    parser.add_argument("--api_key", help="API key (default $HERMES_API_KEY / $OPENAI_API_KEY)")
    parser.add_argument("--group_size", type=int, default=4, help="rollouts per group (GRPO's group)")
    parser.add_argument("--groups", type=int, default=8, help="process: how many groups to write")
    parser.add_argument("--out", default="groups.jsonl", help="process: the groups file (atroposlib's JSONL)")
    parser.add_argument("--api_url", default="http://127.0.0.1:8000", help="serve: the Atropos API server")
    parser.add_argument("--steps", type=int, default=1000, help="serve: stop once the trainer reached this step")
    parser.add_argument("--name", default="hermes", help="serve: the environment's name at the API server")
    parser.add_argument("--eval_dir", default="eval", help="evaluate: where metrics.json and samples.jsonl go")
    parser.add_argument("--distribution", default="terminal_only", help="toolset distribution drawn per rollout")
    parser.add_argument("--sandbox", default="local", help="sandbox backend (local, docker, modal, singularity)")
    parser.add_argument("--max_turns", type=int, default=10, help="model calls per rollout")
    parser.add_argument("--seed", type=int, default=0, help="seed of the toolset draws")
    parser.add_argument("--tokenizer", default="", help="tokenizer folder (default: the local GGUF model's)")
    parser.add_argument("--max_token_length", type=int, default=8192, help="longest sequence sent")
    parser.add_argument("--keep_equal_scores", action="store_true",
                        help="keep groups whose rollouts all scored the same (atroposlib drops them: no GRPO signal)")
    parser.add_argument("--token_level", action="store_true", help="tokens and logprobs as generated, through "
                        "atroposlib's managed server, from llama.cpp (--base_url of hermes-foundry local-model)")
    parser.add_argument("--max_tokens", type=int, default=512, help="--token_level: tokens generated per turn at most")
    parser.add_argument("--temperature", type=float, help="sampling temperature (default: the server's)")
    parser.add_argument("--wandb", action="store_true", help="log to Weights & Biases (off by default)")


def environment_class(spec: str | None) -> Any:
    """HermesEnv, or the subclass `spec` names (module:Class or file.py:Class); ValueError saying what is wrong."""
    from hermes_core.environments.atropos_env import HermesEnv

    if not spec:
        return HermesEnv
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ValueError(f"--env_class {spec!r}: expected module:Class or path/to/file.py:Class")
    if where.endswith(".py"):
        if not Path(where).is_file():
            raise ValueError(f"--env_class {spec!r}: no such file {where}")
        loader = importlib.util.spec_from_file_location(Path(where).stem, where)
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    found = getattr(module, name, None)
    if not (isinstance(found, type) and issubclass(found, HermesEnv)):
        raise ValueError(f"--env_class {spec!r}: {name} is not a subclass of HermesEnv")
    return found


def tokenizer_folder(source: str) -> str:
    """The tokenizer as a folder atroposlib loads offline: the local GGUF's by default; a name must be
    in the local Hugging Face cache (else one ValueError saying so: nothing is fetched)."""
    from hermes_core.environments.tokenizer import load_tokenizer, tokenizer_dir

    if not source:
        return str(tokenizer_dir())
    return str(load_tokenizer(source).name_or_path)


def api_server_problem(url: str) -> None:
    """A ValueError naming `url` unless an Atropos API server answers there (serve would retry forever)."""
    import httpx

    try:
        httpx.get(f"{url.rstrip('/')}/status", timeout=5).raise_for_status()
    except httpx.HTTPError as exc:
        raise ValueError(f"no Atropos API server answers at {url} ({exc}); start one with "
                         f"`run-api --host 127.0.0.1 --port PORT` and pass --api_url") from None


def env_command(args: argparse.Namespace) -> int:
    """Run one mode; a bad task file or a missing extra is one line on stderr, exit 2."""
    from hermes_core.config import Endpoint
    from hermes_core.endpoints.local_model import LocalModelError
    from hermes_core.environments.tasks import TaskFileError, load_tasks

    try:
        if args.tasks:
            load_tasks(args.tasks)  # every line checked before anything starts
        elif not args.env_class:
            raise ValueError("give --tasks (a task file) or --env_class (an environment that builds its tasks)")
        endpoint = Endpoint.resolve(args.base_url, args.api_key, args.model)
        from hermes_core.environments.atropos_env import HermesEnvConfig, server_config

        env_class = environment_class(args.env_class)
        tokenizer = tokenizer_folder(args.tokenizer)
        if args.mode == "serve":
            api_server_problem(args.api_url)
    except (TaskFileError, ValueError, LocalModelError) as exc:
        print(f"hermes-foundry env: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"hermes-foundry env: needs the optional atropos extra (pip install -e '.[atropos]'): {exc}",
              file=sys.stderr)
        return 2
    config = HermesEnvConfig(
        tasks_file=args.tasks or "", group_size=args.group_size, distribution=args.distribution, sandbox=args.sandbox,
        max_turns=args.max_turns, seed=args.seed, tokenizer_name=tokenizer, use_wandb=args.wandb,
        max_token_length=args.max_token_length, total_steps=args.steps if args.mode == "serve" else args.groups,
        rollout_server_url=args.api_url, wandb_name=args.name, ensure_scores_are_not_same=not args.keep_equal_scores,
        token_level=args.token_level, max_tokens=args.max_tokens, temperature=args.temperature,
        data_path_to_save_groups=str(Path(args.out).resolve()) if args.mode == "process" else None,
        data_dir_to_save_evals=str(Path(args.eval_dir).resolve()) if args.mode == "evaluate" else None,
    )
    env = env_class(config, [server_config(endpoint)])
    if args.mode == "process":
        env.process_mode, env.n_groups_to_process, env.group_size_to_process = True, args.groups, args.group_size
        env.max_token_len = args.max_token_length  # a trainer sets it when serving; here the flag does
        asyncio.run(env.process_manager())
        print(f"wrote {env.curr_step} group(s) of {args.group_size} to {env.config.data_path_to_save_groups}")
    elif args.mode == "serve":
        asyncio.run(env.env_manager())
    else:
        metrics = asyncio.run(env.run_evaluation())
        print(json.dumps(metrics, indent=2))
    return 0
