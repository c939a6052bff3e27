"""Hermes Foundry core: plain Python, no Dagster. One package per part (docs/explanation/architecture.md):

`sandbox` < `tools` < `endpoints` < `formats` < `agent` < `batch` < `exports` < `api_server`; each
imports only parts to its left and the shared plumbing (`config`, `fileio`, `asgi_thread`).
`endpoints.simulated` is reached only over HTTP.
"""

from hermes_core.agent import AIAgent
from hermes_core.config import VERSION as __version__

__all__ = ["AIAgent", "__version__"]
