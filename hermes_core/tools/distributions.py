"""Toolset distributions (SPEC §3.2) and the reproducible per-sample draw (SPEC §3.3).

A distribution lists toolsets with independent inclusion percentages (not normalised). The draw
for a sample is seeded from (run seed, sample_key), so re-running a sample gives the same toolsets.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

KNOWN_TOOLSETS: tuple[str, ...] = (
    "terminal", "file", "code_execution", "web", "vision", "image_gen", "browser", "memory", "todo",
)


class DistributionError(ValueError):
    """A user distribution file is unreadable or invalid."""


@dataclass(frozen=True)
class Distribution:
    name: str
    description: str
    toolsets: tuple[tuple[str, float], ...]  # (toolset, pct) in listed order; the order drives the draw

    @property
    def probabilities(self) -> dict[str, float]:
        """`{toolset: pct}` in listed order (what the run fingerprint hashes)."""
        return dict(self.toolsets)

    @cached_property
    def certain(self) -> bool:
        """Whether every toolset is always (≥ 100 %) or never (≤ 0 %) drawn, with at least one always:
        then each sample's draw is known without seeding a generator (~10 µs a sample)."""
        return all(pct >= 100 or pct <= 0 for _, pct in self.toolsets) and any(pct >= 100 for _, pct in self.toolsets)


def _builtin(name: str, description: str, *toolsets: tuple[str, float]) -> Distribution:
    return Distribution(name, description, tuple(toolsets))


BUILTIN_DISTRIBUTIONS: dict[str, Distribution] = {
    d.name: d
    for d in (
        _builtin("default", "Every main toolset, always",
                 ("web", 100), ("vision", 100), ("image_gen", 100), ("terminal", 100), ("file", 100),
                 ("browser", 100)),
        _builtin("image_gen", "Image generation and vision, with some web and terminal",
                 ("image_gen", 90), ("vision", 90), ("web", 55), ("terminal", 45)),
        _builtin("research", "Web research with browsing and vision, rarely a terminal",
                 ("web", 90), ("browser", 70), ("vision", 50), ("terminal", 10)),
        _builtin("science", "Scientific work: web, terminal and files, often vision and browsing",
                 ("web", 94), ("terminal", 94), ("file", 94), ("vision", 65), ("browser", 50),
                 ("image_gen", 15)),
        _builtin("development", "Software development: terminal and files, some web",
                 ("terminal", 80), ("file", 80), ("web", 30), ("vision", 10)),
        _builtin("safe", "No terminal or file access: web, browser, vision, image generation",
                 ("web", 80), ("browser", 70), ("vision", 60), ("image_gen", 60)),
        _builtin("balanced", "Every main toolset at even odds",
                 ("web", 50), ("vision", 50), ("image_gen", 50), ("terminal", 50), ("file", 50),
                 ("browser", 50)),
        _builtin("minimal", "Web search only", ("web", 100)),
        _builtin("terminal_only", "Terminal and files only", ("terminal", 100), ("file", 100)),
        _builtin("terminal_web", "Terminal, files and web", ("terminal", 100), ("file", 100), ("web", 100)),
        _builtin("creative", "Image generation and vision, some web",
                 ("image_gen", 90), ("vision", 90), ("web", 30)),
        _builtin("reasoning", "Mostly web, with files and a little terminal",
                 ("web", 90), ("file", 60), ("terminal", 20)),
        _builtin("browser_use", "Browser automation with web search and vision",
                 ("browser", 100), ("web", 80), ("vision", 70)),
        _builtin("browser_only", "Browser automation only", ("browser", 100)),
        _builtin("browser_tasks", "Browser tasks, occasionally vision or terminal",
                 ("browser", 97), ("vision", 12), ("terminal", 15)),
        _builtin("terminal_tasks", "Terminal tasks with files and web, often browsing",
                 ("terminal", 97), ("file", 97), ("web", 97), ("browser", 75), ("vision", 50),
                 ("image_gen", 10)),
        _builtin("mixed_tasks", "Browser, terminal and files, some web, vision, image generation",
                 ("browser", 92), ("terminal", 92), ("file", 92), ("web", 35), ("vision", 15),
                 ("image_gen", 15)),
    )
}


def _parse_one(name: Any, body: Any, where: str, known: set[str]) -> Distribution:
    if not isinstance(name, str) or not name.strip():
        raise DistributionError(f"{where}: distribution name {name!r} must be a non-empty string")
    here = f"{where}: distribution {name!r}"
    if not isinstance(body, Mapping):
        raise DistributionError(f"{here} must be a mapping with 'description' and 'toolsets'")
    unexpected = sorted(set(body) - {"description", "toolsets"})
    if unexpected:
        raise DistributionError(f"{here}: unexpected key(s) {unexpected} (allowed: description, toolsets)")
    description = body.get("description", "")
    if not isinstance(description, str):
        raise DistributionError(f"{here}: description must be a string")
    toolsets = body.get("toolsets")
    if not isinstance(toolsets, Mapping) or not toolsets:
        raise DistributionError(f"{here}: toolsets must be a non-empty mapping of toolset -> pct")
    unknown = [str(t) for t in toolsets if t not in known]
    if unknown:
        raise DistributionError(f"{here}: unknown toolset(s) {unknown}; known: {sorted(known)}")
    pairs: list[tuple[str, float]] = []
    for toolset, pct in toolsets.items():
        # bool is an int subclass; `true` in YAML is not a percentage.
        if isinstance(pct, bool) or not isinstance(pct, (int, float)):
            raise DistributionError(f"{here}: pct of {toolset!r} must be a number, got {pct!r}")
        if not 0 < pct <= 100:  # also rejects NaN and infinities
            raise DistributionError(f"{here}: pct of {toolset!r} must be in (0, 100], got {pct!r}")
        pairs.append((toolset, pct))
    return Distribution(name, description, tuple(pairs))


def load_distributions(
    path: str | Path | None = None, known_toolsets: Iterable[str] = KNOWN_TOOLSETS
) -> dict[str, Distribution]:
    """Built-in distributions plus those of a user YAML file.

    The file holds `distributions: {name: {description, toolsets: {toolset: pct}}}`, or that mapping
    at top level. A user file may not redefine a built-in name: the built-ins are a published recipe
    and a silent override would make `--distribution=default` mean two things.
    """
    result = dict(BUILTIN_DISTRIBUTIONS)
    if path is None:
        return result
    where = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise DistributionError(f"{where}: cannot read distribution file: {exc}") from exc
    except yaml.YAMLError as exc:
        raise DistributionError(f"{where}: invalid YAML: {exc}") from exc
    if data is None:
        return result
    if isinstance(data, Mapping) and "distributions" in data:
        data = data["distributions"]
    if not isinstance(data, Mapping):
        raise DistributionError(f"{where}: expected a mapping of distribution name -> definition")
    known = set(known_toolsets)
    for name, body in data.items():
        if name in BUILTIN_DISTRIBUTIONS:
            raise DistributionError(f"{where}: distribution {name!r} redefines a built-in; use another name")
        result[name] = _parse_one(name, body, where, known)
    return result


def toolset_seed_for(seed: int, sample_key: str) -> int:
    """The per-sample RNG seed: first 8 bytes of sha256("{seed}:{sample_key}"), big-endian, top bit
    cleared so it fits int64 (JSON readers such as HF datasets turn larger integers into floats)."""
    digest = hashlib.sha256(f"{seed}:{sample_key}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") & 0x7FFF_FFFF_FFFF_FFFF


def sample_toolsets(distribution: Distribution, seed: int, sample_key: str) -> tuple[list[str], int]:
    """Draw the toolsets of one sample; returns (toolsets in listed order, toolset_seed)."""
    toolset_seed = toolset_seed_for(seed, sample_key)
    if distribution.certain:  # every draw is decided (random() * 100 < 100 always): no RNG to seed
        return [toolset for toolset, pct in distribution.toolsets if pct >= 100], toolset_seed
    rng = random.Random(toolset_seed)
    # One draw per toolset, always, so a toolset's outcome does not depend on earlier outcomes.
    chosen = [toolset for toolset, pct in distribution.toolsets if rng.random() * 100 < pct]
    if not chosen:
        chosen = [max(distribution.toolsets, key=lambda item: item[1])[0]]  # max keeps the first of ties
    return chosen, toolset_seed


def expected_toolsets(distribution: Distribution) -> float:
    """Expected number of sampled toolsets, ignoring the fallback."""
    return sum(pct / 100 for _, pct in distribution.toolsets)


def fallback_probability(distribution: Distribution) -> float:
    """Probability that no toolset is drawn and the forced fallback is used."""
    return math.prod(1 - pct / 100 for _, pct in distribution.toolsets)


def format_distributions(distributions: Mapping[str, Distribution] | Iterable[Distribution]) -> str:
    """The `--list_distributions` text."""
    items = distributions.values() if isinstance(distributions, Mapping) else distributions
    blocks: list[str] = []
    for d in items:
        lines = [f"{d.name}: {d.description}" if d.description else d.name]
        width = max(len(toolset) for toolset, _ in d.toolsets)
        for toolset, pct in sorted(d.toolsets, key=lambda item: -item[1]):  # stable: ties keep order
            lines.append(f"  {toolset:<{width}}  {pct:g}%")
        lines.append(f"  expected toolsets: {expected_toolsets(d):.2f} (before fallback)")
        lines.append(f"  fallback probability: {fallback_probability(d) * 100:.4g}%")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"
