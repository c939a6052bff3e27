"""What an environment run's scored groups say: rewards by category, groups without signal for GRPO,
turns, tool errors and tokens; and the best rollout of each group as SFT rows (best-of-N)."""

from __future__ import annotations

import json
from collections import defaultdict
from statistics import mean, pstdev
from typing import Any

from hermes_core.environments.tokens import IGNORE
from hermes_core.formats.sharegpt import to_conversations

PASS_REWARD = 1.0


def _rewards(records: list[dict[str, Any]]) -> list[float]:
    return [score for record in records for score in record["scores"]]


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures over the groups: overall and per category (pass rate = share of rollouts scoring 1)."""
    by_category: dict[str, list[dict[str, Any]]] = defaultdict(list)
    by_split: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_category[record["category"]].append(record)
        by_split[record["split"]].append(record)
    rewards = _rewards(records)
    rollouts = [facts for record in records for facts in record["rollouts"]]
    figures: dict[str, Any] = {
        "groups": len(records), "rollouts": len(rewards),
        "pass_rate": round(mean(float(r >= PASS_REWARD) for r in rewards), 4) if rewards else 0.0,
        "mean_reward": round(mean(rewards), 4) if rewards else 0.0,
        "std_reward": round(pstdev(rewards), 4) if rewards else 0.0,
        "zero_variance_groups": sum(len(set(record["scores"])) == 1 for record in records),
        "mean_turns": round(mean(f["turns"] for f in rollouts), 2) if rollouts else 0.0,
        "tool_errors": sum(f["tool_errors"] for f in rollouts),
        "tokens": sum(len(tokens) for record in records for tokens in record["tokens"]),
        "trained_tokens": sum(m != IGNORE for record in records for masks in record["masks"] for m in masks),
        "categories": {category: _part(group) for category, group in sorted(by_category.items())},
        "splits": {split: _part(group) for split, group in sorted(by_split.items())},  # eval: the held-out tasks
    }
    return figures


def _part(records: list[dict[str, Any]]) -> dict[str, Any]:
    scores = _rewards(records)
    return {"groups": len(records), "pass_rate": round(mean(float(r >= PASS_REWARD) for r in scores), 4),
            "mean_reward": round(mean(scores), 4), "std_reward": round(pstdev(scores), 4)}


def best_of_n_rows(records: list[dict[str, Any]], min_reward: float, run_name: str) -> list[dict[str, Any]]:
    """Each group's best rollout (the first of equals) scoring at least `min_reward`: its ShareGPT
    `conversations` and, in the TRL export's form, `messages` and `tools` (a JSON string), with fields
    that lead back to its task, group, reward, run and model."""
    from hermes_core.exports.trl import agent_to_messages  # imports datasets (~2 s): only when exporting

    rows = []
    for record in records:
        best = max(range(len(record["scores"])), key=lambda member: (record["scores"][member], -member))
        if record["scores"][best] < min_reward:
            continue
        facts = record["rollouts"][best]
        tools = [tool["function"] for tool in facts["tools"]]
        rows.append({"conversations": to_conversations(record["messages"][best], tools),
                     "messages": agent_to_messages(record["messages"][best]), "tools": json.dumps(facts["tools"]),
                     "task_id": record["task_id"], "task_key": record["task_key"], "category": record["category"],
                     "reward": record["scores"][best], "group": record["group"], "group_key": record["key"],
                     "rollout_key": facts["key"], "member": best, "run_name": run_name, "model": record["model"],
                     "served_model": facts["served_model"], "toolsets": facts["toolsets"]})
    return rows
