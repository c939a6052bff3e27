"""A deterministic, OpenAI-compatible simulated model ("hermes-sim") for demos and tests.

`SimulatedModelServer()` (context manager, free port on 127.0.0.1) or
`python -m hermes_core.endpoints.simulated --port 0 --port-file PATH` serves `/v1/models`,
`/v1/chat/completions` (plain and SSE streaming) and `/health`. Replies come from
`policy.respond` and depend only on the request:

* tools offered and fewer completed tool rounds than wanted (default 1): reasoning plus one call
  to an offered tool picked by prompt keywords, with schema-valid arguments;
* tool results present and no more rounds wanted: a final answer quoting the last result;
* no tools: a direct answer; a later user message containing "summar": a summary, no tool calls;
* a JSON-schema `response_format` (tool_call_mode constrained): the same decisions, written as the
  `{"tool", "arguments"}` or `{"final_answer"}` object the schema asks for.

Directives in the first user message script the conversation:
`[sim:tools=N]` `[sim:no-tools]` `[sim:loop]` `[sim:parallel]` `[sim:no-reasoning]`
`[sim:think-inline]` `[sim:reasoning-field=reasoning_content|reasoning|reasoning_details]`
`[sim:hallucinate]` `[sim:hallucinate-always]` `[sim:malformed-args]`
`[sim:rate-limit=N]` `[sim:retry-after=S]` `[sim:error-500=N]` `[sim:always-fail]`
`[sim:error=STATUS]` `[sim:latency=S]`. Rate-limit/error-500 count attempts per identical
message list, so a retried request eventually succeeds.
"""

from hermes_core.endpoints.simulated.constrained_replies import respond
from hermes_core.endpoints.simulated.policy import MODEL_ID, Reply, SimulatedHTTPError
from hermes_core.endpoints.simulated.server import SimulatedModelServer, create_app, serve

__all__ = ["MODEL_ID", "Reply", "SimulatedHTTPError", "SimulatedModelServer", "create_app", "respond", "serve"]
