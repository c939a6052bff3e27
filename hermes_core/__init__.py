"""Hermes Foundry core: plain Python, no Dagster. One package per part (docs/explanation/architecture.md):

`sandbox` < `tools` < `endpoints` < `formats` < `agent` < `batch` < `exports` < `api_server`; each
imports only parts to its left and the shared plumbing (`config`, `fileio`, `asgi_thread`).
`endpoints.simulated` is reached only over HTTP.
"""

from typing import TYPE_CHECKING

from hermes_core.config import VERSION as __version__

if TYPE_CHECKING:
    from hermes_core.agent import AIAgent

__all__ = ["AIAgent", "__version__"]


def __getattr__(name: str):  # `hermes_core.AIAgent` on first use: commands that only plan never import aiohttp
    if name == "AIAgent":
        from hermes_core.agent import AIAgent
        return AIAgent
    raise AttributeError(f"module 'hermes_core' has no attribute {name!r}")
