"""What a model endpoint's failures are, apart from the client (model_client.py) so that the modules
which only recognise them (the batch run, the Dagster assets) import no HTTP library."""

from __future__ import annotations

# Every EndpointConfigError's message starts with one of these: a sample's record keeps only the text of
# its error, and the batch run recognises one by it (`is_config_error`).
CONFIG_ERROR = "model endpoint misconfigured: "
UNREACHABLE = "model endpoint unreachable: "
KEY_HINT = "check the API key (--api_key, else $HERMES_API_KEY or $OPENAI_API_KEY)"
URL_HINT = "check the base URL (--base_url, else $HERMES_BASE_URL or $OPENAI_BASE_URL) and that the server is running"


class ModelError(RuntimeError):
    """The endpoint failed for good (after retries, or a non-retryable error)."""

    def __init__(self, message: str, status: int | None = None, retryable: bool = False):
        super().__init__(message)
        self.status = status
        self.retryable = retryable


class EndpointConfigError(ModelError):
    """The endpoint refuses every request as configured (key, URL, model, credits) or cannot be
    reached: no retry and no other sample can succeed, so it is never retried and stops a batch run."""

    prefix = CONFIG_ERROR

    def __init__(self, problem: str, hint: str, status: int | None = None):
        super().__init__(f"{self.prefix}{problem.rstrip('. ')}; {hint}", status=status, retryable=False)


class EndpointUnreachable(EndpointConfigError):
    """Nothing answers at the endpoint's address (the server is down, or the host or port is wrong):
    until it is back, every sample would fail the same way. Not a configuration error as such."""

    prefix = UNREACHABLE


def is_config_error(error: str | None) -> bool:
    """Whether a recorded error text is an EndpointConfigError's (misconfigured or unreachable)."""
    return bool(error) and error.startswith((CONFIG_ERROR, UNREACHABLE))  # type: ignore[union-attr]
