"""The agent: one conversation between a model and the tools, turn by turn (SPEC §4).

Owns the conversation loop (`loop.AIAgent`) and reading reasoning out of replies (`reasoning`).
Talks to models through `hermes_core.endpoints`, runs tools from `hermes_core.tools` in a sandbox of
`hermes_core.sandbox`. Knows nothing of datasets, ledgers or runs (`hermes_core.batch` drives it),
never imports the simulated endpoint, and never imports Dagster.
"""

from hermes_core.agent.loop import AIAgent

__all__ = ["AIAgent"]
