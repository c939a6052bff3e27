"""SPEC §3.2/§3.3: the distribution table, the reproducible draw, user YAML files, the listing."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from hermes_core.tools.distributions import (
    BUILTIN_DISTRIBUTIONS,
    Distribution,
    DistributionError,
    expected_toolsets,
    fallback_probability,
    format_distributions,
    load_distributions,
    sample_toolsets,
)

SPEC_TABLE = {
    "default": [("web", 100), ("vision", 100), ("image_gen", 100), ("terminal", 100), ("file", 100), ("browser", 100)],
    "image_gen": [("image_gen", 90), ("vision", 90), ("web", 55), ("terminal", 45)],
    "research": [("web", 90), ("browser", 70), ("vision", 50), ("terminal", 10)],
    "science": [("web", 94), ("terminal", 94), ("file", 94), ("vision", 65), ("browser", 50), ("image_gen", 15)],
    "development": [("terminal", 80), ("file", 80), ("web", 30), ("vision", 10)],
    "safe": [("web", 80), ("browser", 70), ("vision", 60), ("image_gen", 60)],
    "balanced": [("web", 50), ("vision", 50), ("image_gen", 50), ("terminal", 50), ("file", 50), ("browser", 50)],
    "minimal": [("web", 100)],
    "terminal_only": [("terminal", 100), ("file", 100)],
    "terminal_web": [("terminal", 100), ("file", 100), ("web", 100)],
    "creative": [("image_gen", 90), ("vision", 90), ("web", 30)],
    "reasoning": [("web", 90), ("file", 60), ("terminal", 20)],
    "browser_use": [("browser", 100), ("web", 80), ("vision", 70)],
    "browser_only": [("browser", 100)],
    "browser_tasks": [("browser", 97), ("vision", 12), ("terminal", 15)],
    "terminal_tasks": [("terminal", 97), ("file", 97), ("web", 97), ("browser", 75), ("vision", 50), ("image_gen", 10)],
    "mixed_tasks": [("browser", 92), ("terminal", 92), ("file", 92), ("web", 35), ("vision", 15), ("image_gen", 15)],
}


def test_builtin_table_matches_spec_exactly() -> None:
    assert list(BUILTIN_DISTRIBUTIONS) == list(SPEC_TABLE)
    for name, toolsets in SPEC_TABLE.items():
        dist = BUILTIN_DISTRIBUTIONS[name]
        assert dist.name == name
        assert list(dist.toolsets) == toolsets
        assert dist.description and "\n" not in dist.description


def test_same_seed_and_key_give_same_draw() -> None:
    dist = BUILTIN_DISTRIBUTIONS["balanced"]
    first = sample_toolsets(dist, 7, "sample-a")
    assert sample_toolsets(dist, 7, "sample-a") == first
    assert isinstance(first[1], int) and 0 <= first[1] < 2**64


def test_different_keys_or_seeds_give_different_draws() -> None:
    dist = BUILTIN_DISTRIBUTIONS["balanced"]
    draws = {tuple(sample_toolsets(dist, 7, f"key-{i}")[0]) for i in range(50)}
    assert len(draws) > 10
    seeds = {sample_toolsets(dist, 7, f"key-{i}")[1] for i in range(50)}
    assert len(seeds) == 50
    assert sample_toolsets(dist, 7, "key-0")[1] != sample_toolsets(dist, 8, "key-0")[1]


def test_toolsets_are_returned_in_listed_order() -> None:
    dist = BUILTIN_DISTRIBUTIONS["default"]
    assert sample_toolsets(dist, 1, "x")[0] == [t for t, _ in dist.toolsets]
    for i in range(200):
        chosen, _ = sample_toolsets(BUILTIN_DISTRIBUTIONS["mixed_tasks"], 3, str(i))
        order = [t for t, _ in BUILTIN_DISTRIBUTIONS["mixed_tasks"].toolsets]
        assert chosen == sorted(chosen, key=order.index)


@pytest.mark.parametrize("name", ["research", "science", "browser_tasks", "image_gen"])
def test_frequencies_match_percentages(name: str) -> None:
    dist = BUILTIN_DISTRIBUTIONS[name]
    n = 20_000
    counts: Counter[str] = Counter()
    for i in range(n):
        counts.update(sample_toolsets(dist, 42, f"sample-{i}")[0])
    # The fallback also includes the top toolset when nothing was drawn: add its probability.
    top = max(dist.toolsets, key=lambda item: item[1])[0]
    for toolset, pct in dist.toolsets:
        expected = pct + (fallback_probability(dist) * 100 if toolset == top else 0)
        assert abs(counts[toolset] / n * 100 - expected) <= 1.5, (toolset, counts[toolset] / n * 100, pct)


def test_fallback_picks_highest_pct_and_earliest_on_ties() -> None:
    # pct 0.001 is almost never drawn: every one of these draws ends in the fallback.
    tied = Distribution("tied", "", (("web", 0.001), ("vision", 0.002), ("file", 0.002)))
    single = Distribution("single", "", (("terminal", 0.001), ("browser", 0.003), ("web", 0.002)))
    for i in range(100):
        assert sample_toolsets(tied, 0, f"k{i}")[0] == ["vision"]
        assert sample_toolsets(single, 0, f"k{i}")[0] == ["browser"]


def test_expected_and_fallback_probability() -> None:
    research = BUILTIN_DISTRIBUTIONS["research"]
    assert expected_toolsets(research) == pytest.approx(0.9 + 0.7 + 0.5 + 0.1)
    assert fallback_probability(research) == pytest.approx(0.1 * 0.3 * 0.5 * 0.9)
    assert fallback_probability(BUILTIN_DISTRIBUTIONS["minimal"]) == 0


def test_load_user_yaml(tmp_path: Path) -> None:
    path = tmp_path / "dists.yaml"
    path.write_text(
        "distributions:\n"
        "  data_work:\n"
        "    description: Code and files\n"
        "    toolsets: {code_execution: 70, file: 40.5, memory: 100}\n"
    )
    dists = load_distributions(path)
    assert set(BUILTIN_DISTRIBUTIONS) < set(dists)
    assert dists["data_work"] == Distribution(
        "data_work", "Code and files", (("code_execution", 70), ("file", 40.5), ("memory", 100))
    )
    assert load_distributions(None) == BUILTIN_DISTRIBUTIONS


def test_load_accepts_top_level_mapping(tmp_path: Path) -> None:
    path = tmp_path / "top.yaml"
    path.write_text("todo_heavy:\n  description: Planning\n  toolsets:\n    todo: 90\n    web: 10\n")
    assert load_distributions(path)["todo_heavy"].toolsets == (("todo", 90), ("web", 10))


def test_custom_known_toolsets(tmp_path: Path) -> None:
    path = tmp_path / "custom.yaml"
    path.write_text("mine:\n  toolsets: {my_plugin: 50}\n")
    assert load_distributions(path, known_toolsets=["my_plugin"])["mine"].toolsets == (("my_plugin", 50),)
    with pytest.raises(DistributionError, match="my_plugin"):
        load_distributions(path)


@pytest.mark.parametrize(
    "toolsets, message",
    [
        ("{web: 50, teleport: 20}", "unknown toolset.*teleport"),
        ("{web: 0}", r"\(0, 100\]"),
        ("{web: -5}", r"\(0, 100\]"),
        ("{web: 100.5}", r"\(0, 100\]"),
        ("{web: .nan}", r"\(0, 100\]"),
        ("{web: high}", "must be a number"),
        ("{web: '50'}", "must be a number"),
        ("{web: true}", "must be a number"),
        ("{}", "non-empty"),
        ("[web]", "non-empty mapping"),
    ],
)
def test_load_errors_name_file_and_distribution(tmp_path: Path, toolsets: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(f"distributions:\n  broken_one:\n    description: x\n    toolsets: {toolsets}\n")
    with pytest.raises(DistributionError, match=message) as info:
        load_distributions(path)
    assert str(path) in str(info.value) and "'broken_one'" in str(info.value)


def test_missing_toolsets_key_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("distributions:\n  empty_one:\n    description: nothing\n")
    with pytest.raises(DistributionError, match="empty_one") as info:
        load_distributions(path)
    assert str(path) in str(info.value)


def test_file_level_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(DistributionError, match="nope.yaml"):
        load_distributions(missing)
    broken = tmp_path / "broken.yaml"
    broken.write_text("distributions: [unclosed\n")
    with pytest.raises(DistributionError, match="broken.yaml"):
        load_distributions(broken)
    redefines = tmp_path / "redef.yaml"
    redefines.write_text("default:\n  toolsets: {web: 10}\n")
    with pytest.raises(DistributionError, match="redef.yaml.*'default'.*built-in"):
        load_distributions(redefines)


def test_format_lists_sorted_toolsets_expected_count_and_fallback() -> None:
    text = format_distributions(BUILTIN_DISTRIBUTIONS)
    for name, dist in BUILTIN_DISTRIBUTIONS.items():
        assert f"{name}: {dist.description}" in text
    block = format_distributions({"browser_tasks": BUILTIN_DISTRIBUTIONS["browser_tasks"]})
    lines = block.splitlines()
    assert lines[0] == "browser_tasks: " + BUILTIN_DISTRIBUTIONS["browser_tasks"].description
    assert [line.split()[0] for line in lines[1:4]] == ["browser", "terminal", "vision"]
    assert [line.split()[1] for line in lines[1:4]] == ["97%", "15%", "12%"]
    assert "expected toolsets: 1.24" in block
    assert f"fallback probability: {0.03 * 0.88 * 0.85 * 100:.4g}%" in block


def test_format_keeps_listed_order_on_ties() -> None:
    block = format_distributions([BUILTIN_DISTRIBUTIONS["image_gen"]])
    assert [line.split()[0] for line in block.splitlines()[1:5]] == ["image_gen", "vision", "web", "terminal"]
    assert "fallback probability: 0.2475%" in block


def test_certain_distributions_draw_what_the_seeded_generator_draws() -> None:
    """A distribution of only 100 % and 0 % toolsets skips the generator; the draw is the same."""
    import random

    from hermes_core.tools.distributions import toolset_seed_for

    certain = Distribution("c", "", (("web", 100), ("vision", 0), ("file", 100.0), ("browser", 0.0)))
    assert certain.certain and BUILTIN_DISTRIBUTIONS["default"].certain
    assert not BUILTIN_DISTRIBUTIONS["balanced"].certain
    assert not Distribution("z", "", (("web", 0), ("file", 0))).certain  # the fallback needs the generator path
    for i in range(200):
        rng = random.Random(toolset_seed_for(3, f"k{i}"))
        expected = [t for t, pct in certain.toolsets if rng.random() * 100 < pct]
        assert sample_toolsets(certain, 3, f"k{i}") == (expected, toolset_seed_for(3, f"k{i}"))
