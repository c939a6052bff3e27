"""Model endpoints: the client for any OpenAI-compatible endpoint, and the two endpoints we serve.

- `model_client`, `limiter`: requests to an endpoint (retries, timeouts, the per-endpoint request cap).
- `constrained`: the tool-call protocol for models without a tool-calling template (JSON-schema replies).
- `local_model`: a real local model (llama.cpp in process), offline.
- `simulated/`: a deterministic simulated model for demos and tests. Nothing else in the product
  imports it (a test enforces this); it is reached over HTTP like any other endpoint.

Imports only shared plumbing (`config`, `fileio`, `asgi_thread`); never the agent, batch or Dagster.
"""

# The id the simulated endpoint answers as. Kept here, not in `simulated/`, so that the product can
# label data that came from it without importing it.
SIMULATED_MODEL_ID = "hermes-sim"
