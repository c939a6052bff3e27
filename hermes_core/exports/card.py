"""The dataset card (README.md in `hf/` and on the Hub, DATASET_CARD.md beside the Parquet file),
generated from the run: recipe, counts by disposition, provenance, schema and loading snippets."""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, Any

import yaml

from hermes_core.config import VERSION
from hermes_core.tools.distributions import DistributionError
from hermes_core.endpoints import SIMULATED_MODEL_ID
from hermes_core.exports.rows import SFT_ROWS, ExportPaths, ExportRow, environment_rows
from hermes_core.formats.filters import Disposition
from hermes_core.batch.pipeline import served_by_simulator
from hermes_core.batch.recipe import Recipe

if TYPE_CHECKING:
    import datasets

SIZE_CATEGORIES = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
                   (10_000_000, "1M<n<10M"))


def _read_json(path: Any) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _size_category(rows: int) -> str:
    return next((label for limit, label in SIZE_CATEGORIES if rows < limit), "n>10M")


def _front_matter(run: str, rows: int, simulated: bool) -> str:
    tags = ["tool-calling", "function-calling", "agent", "trajectories", "synthetic", "hermes-foundry"]
    meta = {
        "license": "other",
        "pretty_name": f"Hermes Foundry run {run}",
        "task_categories": ["text-generation"],
        "tags": tags + (["simulated"] if simulated else []),
        "size_categories": [_size_category(rows)],
        # The Hub layout push_to_hub writes: the ShareGPT rows, and the same samples as OpenAI messages.
        "configs": [
            {"config_name": "default", "data_files": [{"split": "train", "path": "data/train-*.parquet"}]},
            {"config_name": "messages", "data_files": [{"split": "train", "path": "messages/train-*.parquet"}]},
        ],
    }
    body = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True)
    return "---\n# license: a placeholder; set the license of this data before publishing it.\n" + body + "---\n"


def _recipe_section(recipe: Recipe | None) -> list[str]:
    if recipe is None:
        return ["_recipe.json is missing: the recipe of this run is unknown._"]
    try:
        toolsets = ", ".join(f"{name} {pct:g}%" for name, pct in recipe.load_distribution().toolsets)
    except (DistributionError, ValueError, OSError) as exc:  # a user distributions file no longer readable
        toolsets = f"(probabilities unavailable: {exc})"
    filters = recipe.filters
    rows = [
        ("model", f"`{recipe.model}`"),
        ("distribution", f"`{recipe.distribution}`: {toolsets} (independent inclusion probabilities)"),
        ("seed policy", f"run seed {recipe.seed}; each sample's toolsets are drawn with an RNG seeded by "
                        f"sha256(\"{recipe.seed}:<sample_key>\") (column `toolset_seed`), so draws are reproducible"),
        ("max_turns", str(recipe.max_turns)),
        ("reasoning", "disabled (not requested, not required)" if recipe.reasoning_disabled
         else f"requested, effort {recipe.reasoning_effort or 'medium'} ({recipe.reasoning_format} form)"),
        ("temperature / max_tokens", f"{recipe.temperature if recipe.temperature is not None else 'default'} / "
                                     f"{recipe.max_tokens if recipe.max_tokens is not None else 'default'}"),
        ("ephemeral system prompt", "set (sent to the model, not in the data)" if recipe.ephemeral_system_prompt
         else "none"),
        ("filters", f"require reasoning: {filters.require_reasoning}; reject hallucinated tools: "
                    f"{filters.reject_hallucinated_tools} (strict offered-tools mode: {filters.strict_offered_tools}); "
                    f"discard incomplete: {filters.discard_incomplete}"),
        ("recipe fingerprint", f"`{recipe.fingerprint()}`"),
    ]
    return ["| setting | value |", "|---|---|"] + [f"| {name} | {value} |" for name, value in rows]


def _environment_section(items: list[ExportRow]) -> list[str]:
    """An environment run has no recipe: say what its rows are and where their rewards came from."""
    extras = [item.row.get("extra") or {} for item in items]
    rewards = [extra["reward"] for extra in extras if "reward" in extra]
    tasks = {extra.get("task_id") for extra in extras}
    return [f"Reward-filtered best-of-N rollouts of an environment run (`{SFT_ROWS}`): for each scored group, "
            "its best rollout when it reached the run's `min_reward`, verified in its own sandbox.",
            "", f"- rows: {len(items)} from {len(tasks)} task(s); rewards {min(rewards, default=0):g} to "
            f"{max(rewards, default=0):g}",
            "- `extra` names each row's task, group, reward and rollout; `metadata` its run and model"]


def _environment_counts(evaluation: dict[str, Any], rows: int) -> list[str]:
    return ["| groups scored | rollouts | pass rate | mean reward | rows in this export |", "|---|---|---|---|---|",
            f"| {evaluation.get('groups', '—')} | {evaluation.get('rollouts', '—')} | {evaluation.get('pass_rate', '—')} "
            f"| {evaluation.get('mean_reward', '—')} | {rows} |"]


def _counts_section(statistics: dict[str, Any], exported: Counter) -> list[str]:
    lines = ["| outcome | samples in the run | rows in this export |", "|---|---|---|"]
    counts = statistics.get("counts") or {}
    for name in dict.fromkeys([*counts, *exported]):
        # invalid_input_lines and pending are run counts, not dispositions a row can have
        in_export = exported.get(name, 0) if name in Disposition.ALL else "—"
        lines.append(f"| {name} | {counts.get(name, '—')} | {in_export} |")
    if not counts:
        lines.append("\n_statistics.json was not written yet: run counts are unavailable._")
    return lines


def feature_type(feature: Any) -> str:
    """A short type name of a `datasets` feature, for the card and the Dagster column schema."""
    if isinstance(feature, dict):
        fields = list(feature)
        return f"struct<{', '.join(fields)}>" if len(fields) <= 6 else f"struct of {len(fields)} fields"
    inner = getattr(feature, "feature", None)  # datasets.List
    return f"list<{feature_type(inner)}>" if inner is not None else str(getattr(feature, "dtype", feature))


def _schema_section(features: "datasets.Features") -> list[str]:
    return ["| column | type |", "|---|---|"] + [f"| `{name}` | {feature_type(f)} |" for name, f in features.items()]


def render_card(paths: ExportPaths, items: list[ExportRow], *, features: "datasets.Features", sha256: str,
                repo_id: str | None = None) -> str:
    run = paths.run.root.name
    recipe_data = _read_json(paths.run.recipe)
    recipe = Recipe.from_json(recipe_data) if recipe_data else None
    metadata = [item.row.get("metadata") or {} for item in items]
    served = sorted({m.get("served_model") for m in metadata if m.get("served_model")})
    environment = environment_rows(paths.run) is not None
    simulated = any(SIMULATED_MODEL_ID in s for s in served) if environment else served_by_simulator(paths.run)
    versions = sorted({m.get("code_version") for m in metadata if m.get("code_version")})
    dataset_sha = _read_json(paths.run.dataset).get("sha256", "unknown")
    where = repo_id or "<user>/<repo>"
    lines = [
        _front_matter(run, len(items), simulated),
        f"# Hermes Foundry trajectories: run `{run}`",
        "",
        "Multi-turn tool-calling agent trajectories generated by Hermes Foundry: every prompt ran a full agent "
        "session with real tools in its own sandbox.",
    ]
    if simulated:
        lines += ["", "> **SIMULATED.** Samples of this run were answered by the embedded simulated endpoint "
                      "(`hermes-sim`), a deterministic policy and **not a real model**. Do not train on it."]
    if paths.include_discarded:
        lines += ["", "> This export **includes discarded samples** (see the `disposition` column). Keep only "
                      "`disposition == \"kept\"` for training."]
    recipe_lines = _environment_section(items) if environment else _recipe_section(recipe)
    lines += ["", "## Recipe", "", *recipe_lines, "",
              f"Models that served the samples: {', '.join(f'`{s}`' for s in served) or 'unknown'}.", "",
              "## Counts", "", *(_environment_counts(_read_json(paths.run.root / "evaluation.json"), len(items))
                                 if environment else
                                 _counts_section(_read_json(paths.run.statistics), Counter(i.disposition for i in items))),
              "", "## Provenance", "",
              f"- rows: {len(items)}",
              f"- content sha256 (exported rows as canonical JSON lines): `{sha256}`",
              f"- input dataset sha256: `{dataset_sha}`",
              f"- code version: `{VERSION}` (export); rows shaped by code version(s) "
              f"{', '.join(f'`{v}`' for v in versions) or 'unknown'} (a sha256 of the code that wrote them)",
              "- every row's `metadata` names its Dagster run, partition, recipe fingerprint and dataset sha256",
              "", "## Schema", "",
              "One fixed schema on every row. JSON strings where types vary between rows: `id`, `extra`, "
              "`metadata.input_metadata`, `metadata.other` and `tools` (offered tool definitions). `tool_stats` "
              "covers the whole tool universe; calls of names outside it (hallucinated tools) are in "
              "`tool_stats_other`. The `messages` config holds the same samples as OpenAI messages "
              "(`tool_calls` with JSON-string `arguments`, `reasoning_content`, `role: tool` turns) plus a "
              "`tools` column (JSON string of OpenAI tool schemas).", "", *_schema_section(features), "",
              "## Loading", "", "```python", "from datasets import load_dataset, load_from_disk",
              f'ds = load_from_disk("data/{run}/hf")  # on the machine that ran it',
              f'ds = load_dataset("parquet", data_files="data/{run}/trajectories.parquet", split="train")',
              f'ds = load_dataset("{where}", split="train")  # from the Hub (ShareGPT rows)',
              f'messages = load_dataset("{where}", "messages", split="train")  # OpenAI messages + tools',
              "```", "", "Supervised fine-tuning with TRL (it decodes the JSON-string `tools` column itself):", "",
              "```python", "from trl import SFTConfig, SFTTrainer",
              'trainer = SFTTrainer(model="<model id>", train_dataset=messages, args=SFTConfig(output_dir="out"))',
              "trainer.train()", "```", ""]
    return "\n".join(lines)
