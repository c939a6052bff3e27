"""Configuration names shared by every entry point (SPEC §13)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = "hermes-sim"


@dataclass(frozen=True)
class Endpoint:
    """Where the model lives. Flags win over `HERMES_*`, which win over `OPENAI_*`."""

    base_url: str
    api_key: str
    model: str
    request_timeout_s: float = 600.0
    max_retries: int = 5
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    max_concurrent_requests: int = 0  # across every process of this machine; 0: no cap (hermes_core.limiter)

    @classmethod
    def resolve(
        cls, base_url: str | None = None, api_key: str | None = None, model: str | None = None, **options: float
    ) -> "Endpoint":
        env = os.environ
        resolved_url = base_url or env.get("HERMES_BASE_URL") or env.get("OPENAI_BASE_URL")
        if not resolved_url:
            raise ValueError(
                "no model endpoint: pass --base_url or set HERMES_BASE_URL "
                "(e.g. http://127.0.0.1:8000/v1 or the URL `hermes-foundry sim-model` prints)"
            )
        if "max_concurrent_requests" not in options and env.get("HERMES_MAX_CONCURRENT_REQUESTS"):
            try:
                options["max_concurrent_requests"] = int(env["HERMES_MAX_CONCURRENT_REQUESTS"])
            except ValueError:
                raise ValueError(f"HERMES_MAX_CONCURRENT_REQUESTS={env['HERMES_MAX_CONCURRENT_REQUESTS']!r}: "
                                 "expected a whole number (0: no cap)") from None
        return cls(
            base_url=resolved_url.rstrip("/"),
            api_key=api_key or env.get("HERMES_API_KEY") or env.get("OPENAI_API_KEY") or "not-needed",
            model=model or env.get("HERMES_MODEL") or DEFAULT_MODEL,
            **options,
        )


def data_root(output_dir: str | Path | None = None) -> Path:
    """`--output_dir`, else `HERMES_DATA_DIR`, else ./data."""
    return Path(output_dir or os.environ.get("HERMES_DATA_DIR") or "data").resolve()
