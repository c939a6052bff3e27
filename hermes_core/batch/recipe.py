"""A run's recipe: one dataset + the settings that decide what its samples mean (SPEC §2, §5).

The recipe is saved as `data/<run_name>/recipe.json` (never with the API key) so the Dagster code
location can rebuild the run's asset group, and so a resume can refuse a changed recipe.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from hermes_core.config import DEFAULT_REQUEST_TIMEOUT_S, DEFAULT_SAMPLE_TIMEOUT_S, Endpoint, ledger_location
from hermes_core.endpoints.constrained import NATIVE, TOOL_CALL_MODES
from hermes_core.endpoints.request_options import OPENROUTER, RequestOptions, options_problem
from hermes_core.tools.distributions import Distribution, load_distributions
from hermes_core.fileio import atomic_write_json, atomic_write_text
from hermes_core.formats.filters import FilterSettings
from hermes_core.formats.hermes_agent_text import (HermesAgentTextError, dump_hermes_agent_text, dump_sha256,
                                                   hermes_text_from_dump)
from hermes_core.formats.hermes_text import OWN_TEXT, HermesText
from hermes_core.batch.ledgers import has_records
from hermes_core.batch.stopping import Budget, Price, PriceError, load_prices, price_of
from hermes_core.tools.backends import BackendError, ToolBackends

HERMES_TEXT_FILE = "hermes_text.json"  # the original's wording of a run with hermes_agent_python, in its folder
RUN_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
# Settings that change what a sample means; changing one under the same run name is refused.
FINGERPRINT_FIELDS = (
    "model", "distribution", "seed", "max_turns", "ephemeral_system_prompt",
    "reasoning_effort", "reasoning_disabled", "max_tokens", "temperature",
)


class RecipeError(ValueError):
    """The recipe is invalid or conflicts with the run's saved one."""


@dataclass(frozen=True)
class Recipe:
    run_name: str
    dataset_file: str
    model: str
    base_url: str | None = None
    distribution: str = "default"
    distributions_file: str | None = None
    seed: int = 0
    max_turns: int = 10
    ephemeral_system_prompt: str | None = None
    reasoning_effort: str | None = None
    reasoning_disabled: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    batch_size: int = 10
    num_workers: int = 4
    max_samples: int | None = None
    skip_invalid: bool = False
    max_attempts: int = 3
    stream: bool = False
    sandbox_backend: str | None = None
    tool_call_mode: str = NATIVE  # constrained: tools through a JSON-schema reply (hermes_core.endpoints.constrained)
    discard_incomplete: bool = False  # the optional filter of SPEC §7: drop trajectories that hit max_turns
    # Networked tool backends for this run (HERMES_WEB_SEARCH_URL, ...: hermes_core.tools.backends),
    # over the environment. Not in the fingerprint: like the environment, they decide what is offered.
    tool_backends: dict[str, str] | None = None
    # Budgets (SPEC §5): the run stops scheduling at max_cost_usd / max_tokens_total (every attempt
    # ever recorded counts); a sample stops calling the model at max_sample_*. Costs need a price
    # for the model in price_table (YAML; hermes_core.batch.stopping).
    max_cost_usd: float | None = None
    max_tokens_total: int | None = None
    max_sample_cost_usd: float | None = None
    max_sample_tokens: int | None = None
    price_table: str | None = None
    # Trajectory compression after filtering: true = defaults, or CompressionConfig fields plus
    # model/base_url/tokenizer of the summariser. Not in the fingerprint: it changes no sample.
    compression: bool | dict[str, Any] | None = field(default=None, metadata={"doc": (
        "compress the kept trajectories to a token budget: true for the defaults, or a mapping of "
        "hermes-compress settings (target_max_tokens, model, base_url, tokenizer, ...)")})
    # How the run talks to its endpoint (`with_timeouts`), saved so that the run's materializations
    # from the Dagster UI do as the command did. Not in the fingerprint: they change no sample's data.
    request_timeout_s: float = field(default=DEFAULT_REQUEST_TIMEOUT_S, metadata={"doc": (
        "seconds a model call waits to connect, and for each part of the answer (--request_timeout)")})
    sample_timeout_s: float | None = field(default=DEFAULT_SAMPLE_TIMEOUT_S, metadata={"doc": (
        "a sample's deadline in seconds; null: none (--sample_timeout)")})
    endpoint_preflight: bool = field(default=True, metadata={"doc": (
        "check key, base URL and model before the first sample (false: --no_preflight)")})
    # Seconds between the dataset sensor's looks at this run (default $HERMES_SENSOR_INTERVAL_S, else 60).
    # Not in the fingerprint: scheduling changes no sample.
    refresh_interval_s: int | None = field(default=None, metadata={"doc": (
        "seconds between the dataset sensor's looks at this run (default $HERMES_SENSOR_INTERVAL_S, else 60)")})
    # Requests as hermes-agent's batch runner sends them (hermes_core.endpoints.request_options): the form
    # reasoning is asked in, OpenRouter provider routing, and messages prepended to every request (not
    # saved in trajectories). Only the prefill is in the fingerprint: the model sees it, routing and
    # wire form pick who serves the same request. log_prefix_chars: preview length of --verbose lines.
    reasoning_format: str = OPENROUTER
    providers_allowed: list[str] | None = None
    providers_ignored: list[str] | None = None
    providers_order: list[str] | None = None
    provider_sort: str | None = None
    prefill_messages: list[dict[str, Any]] | None = field(default=None, metadata={"doc": (
        "{role, content} messages put after the system message of every request; sent, never saved "
        "(--prefill_messages_file)")})
    log_prefix_chars: int = 100
    # The original's wording (hermes_core.formats.hermes_agent_text): a Python with hermes-agent installed,
    # dumped once when the recipe is made (hermes_text_sha256 unset); the dump's hash is in the
    # fingerprint and the dump itself is saved beside recipe.json (HERMES_TEXT_FILE) by save_recipe.
    hermes_agent_python: str | None = None
    hermes_text_sha256: str | None = field(default=None, metadata={"doc": (
        "set by the CLI: the hash of the original's wording dumped through hermes_agent_python")})

    def __post_init__(self) -> None:
        if not RUN_NAME.match(self.run_name):
            raise RecipeError(
                f"run_name {self.run_name!r}: use a letter then letters, digits or '_' (it names a Dagster asset group)"
            )
        if self.tool_call_mode not in TOOL_CALL_MODES:
            raise RecipeError(f"tool_call_mode {self.tool_call_mode!r}: expected one of {', '.join(TOOL_CALL_MODES)}")
        secrets_given = sorted(name for name in self.tool_backends or {} if name.endswith("_API_KEY"))
        if secrets_given:
            raise RecipeError(f"tool_backends {secrets_given}: API keys come from the environment only "
                              "(the recipe is saved to disk)")
        try:
            ToolBackends.resolve(self.tool_backends, {})
        except BackendError as exc:
            raise RecipeError(f"tool_backends: {exc}") from None
        try:
            price = price_of(self.model, load_prices(self.price_table))
        except PriceError as exc:
            raise RecipeError(str(exc)) from None
        if price is None and (self.max_cost_usd is not None or self.max_sample_cost_usd is not None):
            raise RecipeError(f"a cost budget needs a price for model {self.model!r}: add it to a price table "
                              "(--price_table FILE; docs/how-to/real-model.md#budgets)")
        for name in ("max_cost_usd", "max_tokens_total", "max_sample_cost_usd", "max_sample_tokens"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise RecipeError(f"{name} must be positive (got {getattr(self, name)})")
        for name in ("batch_size", "num_workers", "max_turns", "max_attempts"):
            if getattr(self, name) < 1:
                raise RecipeError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if problem := options_problem(self.reasoning_format, self.reasoning_effort, self.provider_sort,
                                      self.prefill_messages):
            raise RecipeError(problem)
        if self.log_prefix_chars < 0:
            raise RecipeError(f"log_prefix_chars must not be negative (got {self.log_prefix_chars})")
        for name in ("request_timeout_s", "sample_timeout_s", "refresh_interval_s"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise RecipeError(f"{name} must be positive (got {getattr(self, name)})")
        dump = None  # made here once; a recipe read back from recipe.json has its hash (and its folder the dump)
        if self.hermes_agent_python and self.hermes_text_sha256 is None:
            try:
                dump = dump_hermes_agent_text(self.hermes_agent_python)
            except HermesAgentTextError as exc:
                raise RecipeError(str(exc)) from None
            object.__setattr__(self, "hermes_text_sha256", dump_sha256(dump))
        object.__setattr__(self, "_hermes_text_dump", dump)
        # Resolved once: these are read per batch and per sample, and their files would be re-parsed each time.
        object.__setattr__(self, "_price", price)
        object.__setattr__(self, "_distribution", self._resolve_distribution())
        object.__setattr__(self, "_fingerprint", self._compute_fingerprint())

    def request_options(self) -> RequestOptions:
        """What every model request of this run carries besides the conversation and the tools."""
        return RequestOptions(
            reasoning_effort=self.reasoning_effort, reasoning_disabled=self.reasoning_disabled,
            reasoning_format=self.reasoning_format, providers_allowed=tuple(self.providers_allowed or ()),
            providers_ignored=tuple(self.providers_ignored or ()), providers_order=tuple(self.providers_order or ()),
            provider_sort=self.provider_sort, prefill_messages=tuple(self.prefill_messages or ()),
        )

    def load_distribution(self) -> Distribution:
        return self._distribution  # type: ignore[attr-defined]

    def fingerprint(self) -> str:
        return self._fingerprint  # type: ignore[attr-defined]

    def _resolve_distribution(self) -> Distribution:
        distributions = load_distributions(self.distributions_file)
        if self.distribution not in distributions:
            raise RecipeError(
                f"unknown distribution {self.distribution!r}; known: {', '.join(sorted(distributions))}"
            )
        return distributions[self.distribution]

    def price(self) -> Price | None:
        """The model's price from the price table (None: unknown, costs are not counted)."""
        return self._price  # type: ignore[attr-defined]

    def with_timeouts(self, endpoint: Endpoint) -> Endpoint:
        """The endpoint with this run's request timeout and per-sample deadline."""
        return dataclasses.replace(endpoint, request_timeout_s=self.request_timeout_s,
                                   sample_timeout_s=self.sample_timeout_s)

    @property
    def budget(self) -> Budget:
        return Budget(self.max_cost_usd, self.max_tokens_total)

    def sample_budget(self) -> Callable[[Mapping[str, int]], str | None]:
        """Why a sample with this usage so far must stop calling the model, or None."""
        price = self.price()

        def exceeded(usage: Mapping[str, int]) -> str | None:
            if self.max_sample_tokens is not None and usage.get("total_tokens", 0) >= self.max_sample_tokens:
                return f"sample budget reached: {usage['total_tokens']} tokens of max_sample_tokens {self.max_sample_tokens}"
            if self.max_sample_cost_usd is not None and price and price.cost(usage) >= self.max_sample_cost_usd:
                return f"sample budget reached: ${price.cost(usage):.4f} of max_sample_cost_usd ${self.max_sample_cost_usd}"
            return None

        return exceeded

    @property
    def filters(self) -> FilterSettings:
        return FilterSettings(require_reasoning=not self.reasoning_disabled, discard_incomplete=self.discard_incomplete)

    def _compute_fingerprint(self) -> str:
        settings: dict[str, Any] = {name: getattr(self, name) for name in FINGERPRINT_FIELDS}
        settings["distribution"] = [self.distribution, list(self.load_distribution().toolsets)]
        # Settings added later count only when set: fingerprints of earlier runs stay as they were.
        for name, default in (("tool_call_mode", NATIVE), ("discard_incomplete", False), ("max_sample_cost_usd", None),
                              ("max_sample_tokens", None), ("prefill_messages", None), ("hermes_text_sha256", None)):
            if getattr(self, name) != default:
                settings[name] = getattr(self, name)
        canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "fingerprint": self.fingerprint()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Recipe":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def run_dir(root: Path, run_name: str) -> Path:
    return root / run_name


def load_recipe(root: Path, run_name: str) -> Recipe:
    path = run_dir(root, run_name) / "recipe.json"
    if not path.is_file():
        raise RecipeError(f"{path}: no such run (start it with hermes-batch)")
    return Recipe.from_json(json.loads(path.read_text()))


def save_recipe(root: Path, recipe: Recipe, *, force_new_fingerprint: bool = False) -> Path:
    """Save the recipe; refuse a changed fingerprint under an existing run name once that run has a
    ledger record, unless forced (before it, e.g. after the endpoint check refused the first command,
    nothing was made under the saved recipe)."""
    path = run_dir(root, recipe.run_name) / "recipe.json"
    if path.is_file() and not force_new_fingerprint:
        old = json.loads(path.read_text())
        if old.get("fingerprint") != recipe.fingerprint() and has_records(ledger_location(path.parent)):
            changed = [n for n in (*FINGERPRINT_FIELDS, "prefill_messages", "hermes_text_sha256")
                       if old.get(n) != getattr(recipe, n)]
            raise RecipeError(
                f"run {recipe.run_name!r} was started with a different recipe (changed: "
                f"{', '.join(changed) or 'distribution probabilities'}); use a new --run_name, "
                "or --force-new-fingerprint to start its samples over under the new recipe"
            )
    if recipe._hermes_text_dump is not None:  # type: ignore[attr-defined]  # first: the recipe names its hash
        atomic_write_text(path.with_name(HERMES_TEXT_FILE), recipe._hermes_text_dump)  # type: ignore[attr-defined]
    return atomic_write_json(path, recipe.to_json())


def load_hermes_text(folder: Path, recipe: Recipe) -> HermesText:
    """The run's prose: this project's, or the original's saved in its folder by save_recipe."""
    if recipe.hermes_text_sha256 is None:
        return OWN_TEXT
    path = folder / HERMES_TEXT_FILE
    text = path.read_text(encoding="utf-8") if path.is_file() else None
    if text is None or dump_sha256(text) != recipe.hermes_text_sha256:
        raise RecipeError(f"{path}: {'missing' if text is None else 'not the text the recipe names'} (hash "
                          f"{recipe.hermes_text_sha256}); run hermes-batch for this run again with the same "
                          "--hermes_agent_python to save it; nothing was sent")
    try:
        return hermes_text_from_dump(text, str(path))
    except HermesAgentTextError as exc:
        raise RecipeError(str(exc)) from None


def list_recipes(root: Path) -> list[Recipe]:
    """Every run under the data root that has a readable recipe (for the Dagster code location)."""
    recipes = []
    for path in sorted(root.glob("*/recipe.json")) if root.is_dir() else []:
        try:
            recipes.append(Recipe.from_json(json.loads(path.read_text())))
        except (ValueError, TypeError) as exc:  # one broken run must not take every other run down
            warnings.warn(f"{path}: skipped, not a usable recipe: {exc}", stacklevel=2)
    return recipes
