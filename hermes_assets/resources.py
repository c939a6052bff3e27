"""Dagster resources: the model endpoint (the API key comes from the environment, never a file)."""

from __future__ import annotations

import os
import re
from typing import Any

import dagster as dg
from pydantic import Field

from hermes_core.config import Endpoint

# Every asset that drives a model endpoint shares this concurrency pool (dagster_home/dagster.yaml).
MODEL_POOL = "hermes_model_endpoint"

# Where the key is read when `api_key_env` is unset, in this order (SPEC §13).
DEFAULT_KEY_ENVS = ("HERMES_API_KEY", "OPENAI_API_KEY")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
KEY_REFUSED = ("the API key is never accepted as config (Dagster would store it in run storage): set it in the "
               "environment of the code location, HERMES_API_KEY (or OPENAI_API_KEY), or name another variable "
               "with api_key_env / dg.EnvVar")


class ModelEndpointResource(dg.ConfigurableResource):
    """The OpenAI-compatible endpoint a run talks to. Unset fields fall back to the recipe's base URL
    and to HERMES_API_KEY / OPENAI_API_KEY (SPEC §13). The key itself is not a config field: config
    is stored in run storage, so only the *name* of its environment variable is, and the value is
    read when the run needs it. A key typed into the Launchpad is thus invalid config, refused at launch."""

    base_url: str | None = None
    api_key_env: str | None = Field(
        default=None,
        description="Name of the environment variable holding the API key (default: HERMES_API_KEY, then "
                    "OPENAI_API_KEY). Never the key itself: set the key in the code location's environment.")
    max_retries: int = 5
    backoff_base_s: float = 1.0
    # Requests in flight to the endpoint across every run of this machine (None: $HERMES_MAX_CONCURRENT_REQUESTS).
    max_concurrent_requests: int | None = None

    def __init__(self, **data: Any) -> None:
        # `api_key=dg.EnvVar("NAME")` is the Dagster idiom: keep only NAME. A literal key would end up
        # in the job snapshot (a resource's given values become config defaults), so it is refused.
        if "api_key" in data:
            key = data.pop("api_key")
            if not isinstance(key, dg.EnvVar):
                raise ValueError(f"ModelEndpointResource(api_key=...): {KEY_REFUSED}")
            data["api_key_env"] = key.env_var_name
        super().__init__(**data)

    def api_key(self) -> str | None:
        """The key, read from the environment at run time (None: Endpoint.resolve's own fallbacks)."""
        if self.api_key_env is None:
            return None
        if not _ENV_NAME.fullmatch(self.api_key_env):
            # Don't echo the value: it may be a key typed in the wrong field.
            raise ValueError(f"api_key_env must name an environment variable (e.g. HERMES_API_KEY); {KEY_REFUSED}")
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ValueError(f"api_key_env names ${self.api_key_env}, which is not set in this process's environment")
        return key

    def endpoint(self, model: str, recipe_base_url: str | None) -> Endpoint:
        cap = {} if self.max_concurrent_requests is None else {"max_concurrent_requests": self.max_concurrent_requests}
        return Endpoint.resolve(
            self.base_url or recipe_base_url or os.environ.get("HERMES_BASE_URL"),
            self.api_key(),
            model,
            max_retries=self.max_retries,
            backoff_base_s=self.backoff_base_s,
            **cap,
        )
