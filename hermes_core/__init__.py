"""Hermes Foundry core: the agent, tools, sandboxes, samples, ledger and formats (no Dagster here)."""

__version__ = "0.1.0"

from hermes_core.agent import AIAgent  # noqa: E402

__all__ = ["AIAgent", "__version__"]
