"""Where each file of a run folder lives (SPEC's run folder layout, `pipeline`'s module docstring)."""

from __future__ import annotations

from pathlib import Path

from hermes_core.config import ledger_location


class RunPaths:
    """Where each file of one run lives."""

    def __init__(self, root: Path):
        self.root = root
        self.recipe = root / "recipe.json"
        self.dataset = root / "dataset.json"
        self.prompts = root / "prompts.jsonl"
        self.assignments = root / "assignments.jsonl"
        self.batches = root / "batches.json"
        self.raw = ledger_location(root)  # a folder, or a URL on object storage
        self.invocations = root / "invocations.jsonl"
        self.trajectories = root / "trajectories.jsonl"
        self.statistics = root / "statistics.json"
        self.checkpoint = root / "checkpoint.json"
        # Written only when the run compresses (the compressed_trajectories asset)
        self.compressed = root / "trajectories.compressed.jsonl"
        self.compression_metrics = root / "compression_metrics.json"

    def step_files(self) -> list[Path]:
        """The run folder's files that steps write (the recipe and the ledger apart)."""
        return [self.dataset, self.prompts, self.assignments, self.batches, self.invocations, self.trajectories,
                self.statistics, self.checkpoint, self.compressed, self.compression_metrics]
