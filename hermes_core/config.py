"""Configuration names shared by every entry point (SPEC §13)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

VERSION = "0.1.0"  # the code version written into every record (hermes_core.__version__)
DEFAULT_MODEL = "hermes-sim"
# A model call waits this long to connect, and for each part of its answer, before it counts as
# failed (and is retried); a batch sample makes no model call past its deadline.
DEFAULT_REQUEST_TIMEOUT_S = 120.0
DEFAULT_SAMPLE_TIMEOUT_S = 1800.0


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, which taskset and containers narrow."""
    return len(os.sched_getaffinity(0))


def check_base_url(url: str) -> None:
    """A ValueError saying what to fix unless a model endpoint can be requested at `url`."""
    try:
        parts = urlsplit(url)
        port = parts.port  # a ValueError when not a number from 0 to 65535
    except ValueError as exc:
        problem = str(exc)
    else:
        problem = ("expected http:// or https://" if parts.scheme not in ("http", "https") else
                   "no host" if not parts.hostname else "port 0 cannot be connected to" if port == 0 else "")
    if problem:
        raise ValueError(f"base URL {url!r}: {problem}; check --base_url (else $HERMES_BASE_URL or $OPENAI_BASE_URL), "
                         "e.g. http://127.0.0.1:8000/v1")


@dataclass(frozen=True)
class Endpoint:
    """Where the model lives. Flags win over `HERMES_*`, which win over `OPENAI_*`."""

    base_url: str
    api_key: str
    model: str
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    max_retries: int = 5
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    max_concurrent_requests: int = 0  # across every process of this machine; 0: no cap (hermes_core.endpoints.limiter)
    sample_timeout_s: float | None = None  # a ModelClient then serves one conversation and stops calling after it

    def __post_init__(self) -> None:
        check_base_url(self.base_url)  # refused at once: a request to it could only fail, after retries

    @classmethod
    def resolve(
        cls, base_url: str | None = None, api_key: str | None = None, model: str | None = None, **options: float | None
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


def ledger_location(run_root: Path) -> Path | str:
    """Where a run's ledger lives: `<run folder>/raw`, or `$HERMES_LEDGER_URL/<run name>` when that
    names object storage (`s3://bucket/prefix`, `gs://…`, any fsspec URL). The ledger is the only
    part of a run that cost money: the rest of the run folder is rebuilt from the dataset."""
    url = os.environ.get("HERMES_LEDGER_URL", "").strip().rstrip("/")
    if not url:
        return run_root / "raw"
    if url.startswith("file://"):
        return Path(url.removeprefix("file://")) / run_root.name
    if "://" not in url:
        raise ValueError(f"HERMES_LEDGER_URL={url!r}: expected a URL such as s3://bucket/prefix "
                         "(or leave it unset for the ledger in the run folder)")
    return f"{url}/{run_root.name}"
