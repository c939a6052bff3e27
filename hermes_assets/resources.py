"""Dagster resources: the model endpoint (the API key comes from the environment, never a file)."""

from __future__ import annotations

import os

import dagster as dg

from hermes_core.config import Endpoint

# Every asset that drives a model endpoint shares this concurrency pool (dagster_home/dagster.yaml).
MODEL_POOL = "hermes_model_endpoint"


class ModelEndpointResource(dg.ConfigurableResource):
    """The OpenAI-compatible endpoint a run talks to. Unset fields fall back to the recipe's
    base URL and to HERMES_API_KEY / OPENAI_API_KEY (SPEC §13)."""

    base_url: str | None = None
    api_key: str | None = None
    max_retries: int = 5
    backoff_base_s: float = 1.0
    # Requests in flight to the endpoint across every run of this machine (None: $HERMES_MAX_CONCURRENT_REQUESTS).
    max_concurrent_requests: int | None = None

    def endpoint(self, model: str, recipe_base_url: str | None) -> Endpoint:
        cap = {} if self.max_concurrent_requests is None else {"max_concurrent_requests": self.max_concurrent_requests}
        return Endpoint.resolve(
            self.base_url or recipe_base_url or os.environ.get("HERMES_BASE_URL"),
            self.api_key,
            model,
            max_retries=self.max_retries,
            backoff_base_s=self.backoff_base_s,
            **cap,
        )
