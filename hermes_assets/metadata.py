"""Helpers for Dagster metadata shown in the UI, and the catalog kwargs (owners, kinds, stage tag)."""

import os
from typing import Any


def bar_chart(title: str, counts: dict[str, int]) -> str:
    """A markdown bar chart: renders in the Dagster UI's metadata panel without any plotting library."""
    top = max(counts.values(), default=0) or 1
    rows = [f"| {name} | {'█' * max(1, round(24 * value / top)) if value else ''} {value} |"
            for name, value in counts.items()]
    return f"| {title} | |\n|---|---|\n" + "\n".join(rows)


# Catalog hygiene: every asset of a run's group carries the same owners and a stage tag, so the
# catalog can be filtered by team, stage and kind (Dagster shows kinds as icons on the graph).
OWNERS_ENV = "HERMES_ASSET_OWNERS"
DEFAULT_OWNERS = "team:hermes-foundry"
STAGE_TAG = "hermes/stage"
STAGES = ("input", "generation", "output", "export")


def asset_owners() -> list[str]:
    """Owners from $HERMES_ASSET_OWNERS (comma-separated, e.g. `team:data,me@example.com`), read when the
    definitions load; `team:hermes-foundry` when unset."""
    raw = os.environ.get(OWNERS_ENV) or DEFAULT_OWNERS
    return [owner.strip() for owner in raw.split(",") if owner.strip()]


def catalog(stage: str, *kinds: str) -> dict[str, Any]:
    """The `@dg.asset` kwargs shared by a run's assets: owners, kinds (`python` plus up to two more;
    Dagster allows three) and the `hermes/stage` tag."""
    assert stage in STAGES and len(kinds) <= 2, (stage, kinds)
    return {"owners": asset_owners(), "kinds": {"python", *kinds}, "tags": {STAGE_TAG: stage}}


def source_catalog(stage: str, *kinds: str) -> dict[str, Any]:
    """The same for an observable source asset, whose decorator takes neither owners nor kinds: kinds
    go in as Dagster's `dagster/kind/<kind>` tags (what `kinds=` writes)."""
    assert stage in STAGES and len(kinds) <= 3, (stage, kinds)
    return {"tags": {STAGE_TAG: stage, **{f"dagster/kind/{kind}": "" for kind in kinds}}}


def check_catalog(stage: str) -> dict[str, Any]:
    """Asset checks take no owners, kinds or tags (dagster 1.13): their spec's metadata names the stage
    and the owners instead, shown on the check's page."""
    return {STAGE_TAG: stage, "owners": ", ".join(asset_owners())}
