"""What an environment run's scored groups say: rewards by category, groups without signal for GRPO,
turns, tool errors and tokens; and the best rollout of each group as SFT rows (best-of-N)."""

from __future__ import annotations

import json
from collections import defaultdict
from statistics import mean, pstdev
from typing import Any

from hermes_core.environments.tokens import IGNORE
from hermes_core.formats.sharegpt import to_conversations, tool_stats

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
    """Each group's best rollout (the first of equals) scoring at least `min_reward`, as a trajectory row
    (SPEC §8.1 fields, so `hermes-foundry export` turns the file into HF / Parquet / TRL like a batch run's)
    plus, in the TRL export's form, `messages` and `tools` (a JSON string). The lineage (task, group,
    reward, rollout) is in `extra` and at the top level; run and model in `metadata` and at the top level."""
    from hermes_core.exports.trl import agent_to_messages  # imports datasets (~2 s): only when exporting

    rows = []
    for index, record in enumerate(records):
        best = max(range(len(record["scores"])), key=lambda member: (record["scores"][member], -member))
        if record["scores"][best] < min_reward:
            continue
        facts, messages = record["rollouts"][best], record["messages"][best]
        tools = [tool["function"] for tool in facts["tools"]]
        stats, _ = tool_stats(messages, [])
        lineage = {"task_id": record["task_id"], "task_key": record["task_key"], "category": record["category"],
                   "reward": record["scores"][best], "group": record["group"], "group_key": record["key"],
                   "rollout_key": facts["key"], "member": best}
        rows.append({
            "prompt_index": index, "conversations": to_conversations(messages, tools),
            "metadata": {"run_name": run_name, "model": record["model"], "served_model": facts["served_model"]},
            "completed": True, "partial": False, "api_calls": facts["api_calls"], "toolsets_used": facts["toolsets"],
            "tool_stats": stats, "sample_key": facts["key"], "tools_offered": [tool["name"] for tool in tools],
            "toolset_seed": facts.get("toolset_seed"), "usage": facts["usage"], "id": record["task_id"],
            "extra": lineage,
            "messages": agent_to_messages(messages), "tools": json.dumps(facts["tools"]),
            **lineage, "run_name": run_name, "model": record["model"], "served_model": facts["served_model"],
            "toolsets": facts["toolsets"]})
    return rows
