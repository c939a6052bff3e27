"""Your own RL environment: tasks built in code and a verifier of your own; HermesEnv does the rest
(rollouts through AIAgent in sandboxes, tokens and masks, atroposlib's three modes).

    .venv/bin/hermes-foundry env process --env_class examples/rl_environment.py:CountingEnv \\
        --base_url http://127.0.0.1:8000/v1 --groups 3 --group_size 2 --out counting.jsonl
"""

from __future__ import annotations

from hermes_core.environments.atropos_env import HermesEnv
from hermes_core.environments.tasks import Task
from hermes_core.environments.verifiers import Verdict
from hermes_core.sandbox import Sandbox


class CountingEnv(HermesEnv):
    name = "counting"

    def load(self) -> list[Task]:
        # [sim:command=...] scripts the simulated model; a real model reads only the instruction.
        return [Task(id=f"count-{n}", category="counting",
                     prompt=f"Run a command that writes the numbers 1 to {n}, one per line, to count.txt. "
                            f"[sim:command=seq {n - (n == 8)} > count.txt]")
                for n in (3, 5, 8)]

    def verify(self, task: Task, sandbox: Sandbox) -> Verdict:
        """Partial credit: the share of lines that are right. Runs in the rollout's own sandbox."""
        n = int(task.id.removeprefix("count-"))
        try:
            lines = sandbox.read_file("count.txt").decode("utf-8", errors="replace").split()
        except FileNotFoundError:
            return Verdict(0.0, "no count.txt")
        right = sum(line == str(i) for i, line in zip(range(1, n + 1), lines))
        return Verdict(right / n, f"{right} of {n} lines right")
