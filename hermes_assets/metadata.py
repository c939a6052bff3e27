"""Helpers for Dagster metadata shown in the UI."""


def bar_chart(title: str, counts: dict[str, int]) -> str:
    """A markdown bar chart: renders in the Dagster UI's metadata panel without any plotting library."""
    top = max(counts.values(), default=0) or 1
    rows = [f"| {name} | {'█' * max(1, round(24 * value / top)) if value else ''} {value} |"
            for name, value in counts.items()]
    return f"| {title} | |\n|---|---|\n" + "\n".join(rows)
