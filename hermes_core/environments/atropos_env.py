"""The Atropos adapter: Hermes Foundry's rollouts as an `atroposlib` environment. The only module
that imports atroposlib (the optional `atropos` extra: `pip install -e '.[atropos]'`).

`HermesEnv` rolls out a task file's tasks through AIAgent, scores them with their verifiers and
hands atroposlib scored groups (tokens, masks, scores, messages). Its defaults never reach the
network: W&B off, no health-check polling, the local GGUF's tokenizer, the API server on 127.0.0.1.
Subclass it to bring your own tasks and verifiers (docs/how-to/rl-environments.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import defaultdict
from statistics import mean, pstdev
from pathlib import Path
from typing import Any

# Set before atroposlib imports huggingface_hub, which otherwise looks up huggingface.co even for a
# tokenizer loaded from a folder; a user who wants the hub sets HF_HUB_OFFLINE=0.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import aiohttp
from atroposlib.api.server import ScoredData
from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.server_handling.server_baseline import APIServer
from pydantic import Field, ValidationError

from hermes_core.config import Endpoint
from hermes_core.environments.groups import (GroupFailed, group_record, rollout_with_retries, scored_data,
                                             settings_fingerprint)
from hermes_core.environments.raw_turns import RawTranscript
from hermes_core.environments.rollout import Rollout, RolloutSettings, run_rollout, spec_verdict
from hermes_core.environments.tasks import Task, load_tasks
from hermes_core.environments.verifiers import Verdict
from hermes_core.environments.tokenizer import tokenizer_dir
from hermes_core.fileio import append_record
from hermes_core.formats.sharegpt import to_conversations
from hermes_core.sandbox import Sandbox, SandboxBackend, get_backend
from hermes_core.tools.distributions import BUILTIN_DISTRIBUTIONS

logger = logging.getLogger(__name__)
LOCAL_API = "http://127.0.0.1:8000"


class HermesEnvConfig(BaseEnvConfig):
    tasks_file: str = Field(default="", description="JSONL task file (docs/how-to/rl-environments.md)")
    distribution: str = Field(default="terminal_only", description="toolset distribution drawn per rollout")
    sandbox: str = Field(default="local", description="sandbox backend: local, docker, modal, singularity")
    max_turns: int = Field(default=10, description="model calls per rollout")
    seed: int = Field(default=0, description="seed of the toolset draws")
    rollout_retries: int = Field(default=2, description="retries of a rollout whose model, sandbox or verifier failed")
    use_wandb: bool = Field(default=False, description="log to Weights & Biases (off: nothing leaves the machine)")
    tokenizer_name: str = Field(default="", description="tokenizer folder or cached name; empty: the local GGUF's")
    rollout_server_url: str = Field(default=LOCAL_API, description="the Atropos API server (run-api)")
    token_level: bool = Field(default=False, description="tokens and logprobs as the server generated them "
                              "(llama.cpp's /completion through atroposlib's managed server), not rendered")
    max_tokens: int = Field(default=512, description="token-level mode: tokens generated per turn at most")
    temperature: float | None = Field(default=None, description="sampling temperature (default: the server's)")


def schema_problem(record: dict[str, Any]) -> str | None:
    """Why atroposlib's API server would refuse the group (its own ScoredData model), or None."""
    try:
        ScoredData(**scored_data(record))
    except ValidationError as exc:
        return f"{exc.error_count()} error(s) against atroposlib's ScoredData: {exc.errors()[0]['msg']} at " + \
            ".".join(map(str, exc.errors()[0]["loc"]))
    return None


def server_config(endpoint: Endpoint) -> APIServerConfig:
    """atroposlib's description of the endpoint, without its once-a-second health-check requests."""
    return APIServerConfig(model_name=endpoint.model, base_url=endpoint.base_url, api_key=endpoint.api_key,
                           health_check=False)


class LlamaCppServer(APIServer):
    """atroposlib's server interface over llama.cpp's native `/completion`: token ids in, the generated
    ids and each one's logprob out, exact on CPU (`hermes-foundry local-model`). Token-level mode only."""

    async def check_server_status_task(self, chat_completion: bool = True) -> None:
        self.server_healthy = True  # nothing polls: the first request says whether it is up

    async def _chat_completion_wrapper(self, **kwargs: Any) -> Any:
        raise NotImplementedError("token-level mode asks for tokens and logprobs only")

    async def _completion_wrapper(self, **kwargs: Any) -> Any:
        raise NotImplementedError("token-level mode asks for tokens and logprobs only")

    async def _tokens_and_logprobs_completion_wrapper(self, **kwargs: Any) -> tuple[list, list, list, list]:
        root = (self.config.base_url or "").removesuffix("/").removesuffix("/v1")
        body = {"prompt": kwargs["input_ids"], "n_predict": kwargs.get("max_tokens") or 512, "n_probs": 1,
                "return_tokens": True, "cache_prompt": True, "temperature": kwargs.get("temperature", 1.0)}
        outputs, logprobs, reasons = [], [], []
        async with aiohttp.ClientSession() as session:
            for _ in range(kwargs.get("n") or 1):
                async with session.post(f"{root}/completion", json=body) as response:
                    response.raise_for_status()
                    answer = await response.json()
                probabilities = answer.get("completion_probabilities") or []
                tokens = [p["id"] for p in probabilities]  # the ids sampled, each with its logprob
                if tokens != answer["tokens"][: len(tokens)]:
                    raise RuntimeError("llama.cpp's tokens and their probabilities disagree")
                outputs.append(tokens)
                logprobs.append([p["logprob"] for p in probabilities])
                reasons.append("length" if answer.get("stop_type") == "limit" else "stop")
        return kwargs["input_ids"], outputs, logprobs, reasons


class KeepSpecialTokens:
    """The tokenizer as the managed server must see it: it decodes a completion with its special tokens.
    Decoded without them (its default when no vLLM tool parser is installed), a turn's text lacks the
    end-of-turn token the server generated, so the next prompt re-encodes that token and the sequence
    holds it twice."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def decode(self, ids: list[int], **_options: Any) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False)


class HermesEnv(BaseEnv):
    name = "hermes"
    env_config_cls = HermesEnvConfig
    server_cls = LlamaCppServer  # used by token-level mode only; rendered mode calls the endpoint itself

    def __init__(self, config: HermesEnvConfig, server_configs: list[APIServerConfig], slurm: bool = False,
                 testing: bool = False) -> None:
        if not config.tokenizer_name:
            config = config.model_copy(update={"tokenizer_name": str(tokenizer_dir())})
        super().__init__(config, server_configs, slurm, testing)
        self.endpoint_config = server_configs[0]
        self.tasks: list[Task] = []
        self.eval_tasks: list[Task] = []
        self.backend: SandboxBackend | None = None
        self.next_index = 0

    @classmethod
    def config_init(cls) -> tuple[HermesEnvConfig, list[APIServerConfig]]:
        return HermesEnvConfig(), [server_config(Endpoint("http://127.0.0.1:8000/v1", "none", "hermes-sim"))]

    def load(self) -> list[Task]:
        """The task file's tasks; a subclass may build them any other way."""
        return load_tasks(self.config.tasks_file).tasks

    def verify(self, task: Task, sandbox: Sandbox) -> Verdict:
        """The rollout's verdict, in its sandbox before it closes (a worker thread: blocking is fine).
        Default: the task's verifier spec. Raise VerifierError when no verdict can be given."""
        return spec_verdict(task, sandbox)

    def settings(self) -> RolloutSettings:
        server = self.endpoint_config
        endpoint = Endpoint.resolve(server.base_url, server.api_key or "none", server.model_name)
        return RolloutSettings(endpoint=endpoint, distribution=BUILTIN_DISTRIBUTIONS[self.config.distribution],
                               seed=self.config.seed, max_turns=self.config.max_turns, verify=self.verify,
                               temperature=self.config.temperature)

    async def setup(self) -> None:
        tasks = self.load()
        self.tasks = [task for task in tasks if task.split == "train"]
        self.eval_tasks = [task for task in tasks if task.split == "eval"]
        self.backend = get_backend(self.config.sandbox)

    async def get_next_item(self) -> tuple[Task, int] | None:
        """Train tasks in file order, again and again; the group number counts the passes."""
        if not self.tasks:
            return None
        index, self.next_index = self.next_index, self.next_index + 1
        return self.tasks[index % len(self.tasks)], index // len(self.tasks)

    def sharegpt_path(self) -> Path | None:
        """Beside the groups file: one ShareGPT row per scored rollout (for reward-filtered SFT)."""
        groups = self.config.data_path_to_save_groups
        return Path(groups).with_suffix(".sharegpt.jsonl") if groups else None

    def write_rows(self, task: Task, rollouts: list[Rollout]) -> None:
        if (path := self.sharegpt_path()) is None:
            return
        for rollout in rollouts:
            append_record(path, {
                "conversations": to_conversations(rollout.messages, [tool["function"] for tool in rollout.tools]),
                "task_id": task.id, "category": task.category, "reward": rollout.reward, "detail": rollout.detail,
                "group": rollout.group, "member": rollout.member, "rollout_key": rollout.key,
                "toolsets": rollout.toolsets, "model": self.endpoint_config.model_name,
                "served_model": rollout.served_model})

    async def token_rollout(self, task: Task, group: int, member: int) -> tuple[Rollout, Any]:
        """A rollout whose model calls go through atroposlib's managed server; its one sequence node
        (tokens, masks, logprobs as generated). GroupFailed when a member keeps failing, or when its
        turns do not extend one sequence (a trainer would get turns that were never generated together)."""
        settings = self.settings()
        for _attempt in range(self.config.rollout_retries + 1):
            async with self.server.managed_server(tokenizer=KeepSpecialTokens(self.tokenizer)) as managed:
                transcript = RawTranscript(self.tokenizer, self.endpoint_config.model_name)

                async def model_call(body: dict[str, Any]) -> Any:
                    answer = await managed.chat_completion(messages=transcript.prompt_messages(body),
                                                           max_tokens=self.config.max_tokens,
                                                           temperature=body.get("temperature", 1.0))
                    choice = answer.choices[0]
                    return transcript.completion(choice.message.content or "", choice.finish_reason, {})

                done = await run_rollout(task, group, member, settings, self.backend, model_call=model_call)
                nodes = managed.get_state()["nodes"]
            if done.error is None:
                if len(nodes) != 1:
                    raise GroupFailed(f"task {task.id}, member {member}: its {len(transcript.raw)} turns make "
                                      f"{len(nodes)} token sequences, not one")
                return done, nodes[0]
        raise GroupFailed(f"task {task.id}, group {group}, member {member}: {done.error}")

    async def token_group(self, task: Task, group: int) -> ScoredDataGroup:
        """A group with the tokens, masks and logprobs the server generated (`token_source: generated`)."""
        members = await asyncio.gather(*(self.token_rollout(task, group, m) for m in range(self.config.group_size)))
        rollouts = [rollout for rollout, _ in members]
        self.write_rows(task, rollouts)
        return ScoredDataGroup(
            tokens=[node.tokens for _, node in members], masks=[node.masked_tokens for _, node in members],
            inference_logprobs=[node.logprobs for _, node in members], scores=[r.reward for r in rollouts],
            messages=[[{**m, "content": m.get("content") or ""} for m in r.messages] for r in rollouts],
            advantages=None, ref_logprobs=None, images=None, overrides=None, generation_params=None,
            distill_token_ids=None, distill_logprobs=None,
            group_overrides={"token_source": "generated", "task_id": task.id, "task_key": task.key, "group": group})

    async def collect_trajectories(self, item: tuple[Task, int]) -> tuple[ScoredDataGroup | None, list[Any]]:
        task, group = item
        settings, size = self.settings(), self.config.group_size
        if self.config.token_level:
            try:
                return await self.token_group(task, group), []
            except GroupFailed as exc:
                logger.error("group not scored: %s", exc)
                return None, []
        try:
            rollouts = list(await asyncio.gather(*(
                rollout_with_retries(task, group, member, settings, self.backend, self.config.rollout_retries)
                for member in range(size))))
            record = group_record(task, group, rollouts, self.tokenizer, settings_fingerprint(settings, size),
                                  settings.endpoint.model)
        except GroupFailed as exc:
            logger.error("group not scored: %s", exc)
            return None, []
        self.write_rows(task, rollouts)
        return ScoredDataGroup(**scored_data(record)), []

    async def run_evaluation(self) -> dict[str, float]:
        await self.setup()
        return await self.evaluate()

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """One rollout per eval task: pass rate, mean and spread of rewards per category, errors."""
        started = time.time()
        done = await asyncio.gather(*(run_rollout(task, 0, 0, self.settings(), self.backend)
                                      for task in self.eval_tasks))
        by_category: dict[str, list[float]] = defaultdict(list)
        for task, rollout in zip(self.eval_tasks, done):
            if rollout.error is None:
                by_category[task.category].append(rollout.reward)
        scored = [reward for rewards in by_category.values() for reward in rewards]
        metrics = {"eval/tasks": float(len(done)), "eval/errors": float(sum(r.error is not None for r in done)),
                   "eval/pass_rate": mean(float(r >= 1.0) for r in scored) if scored else 0.0,
                   "eval/mean_reward": mean(scored) if scored else 0.0}
        for category, rewards in sorted(by_category.items()):
            metrics[f"eval/{category}/mean_reward"] = mean(rewards)
            metrics[f"eval/{category}/std_reward"] = pstdev(rewards)
        samples = [{"task_id": t.id, "category": t.category, "reward": r.reward, "error": r.error,
                    "messages": r.messages} for t, r in zip(self.eval_tasks, done)]
        await self.evaluate_log(metrics, model_name=self.endpoint_config.model_name, start_time=started,
                                end_time=time.time(), samples=samples, verbose=False)
        return metrics

