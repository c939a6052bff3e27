"""Bad endpoints fail fast and say why (issue 17, item 5), against real HTTP servers on 127.0.0.1: a
wrong key is one request, never retried; an unreachable or malformed URL is refused at once; a hung
upstream costs the request timeout per attempt, and never more than the sample's deadline; the
pre-flight checks key, URL and model before a run spends anything."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hermes_core.asgi_thread import ThreadedServer, uvicorn_config
from hermes_core.config import Endpoint
from hermes_core.endpoints.errors import EndpointConfigError, EndpointUnreachable, ModelError, is_config_error
from hermes_core.endpoints.model_client import ModelClient, preflight
from procs import free_port
from upstreams import Upstream, hung_upstream, wrong_key_upstream  # noqa: F401  (fixtures)

PING = {"messages": [{"role": "user", "content": "hi"}]}


def complete(endpoint: Endpoint, body: dict[str, Any] = PING) -> None:
    async def call() -> None:
        client = ModelClient(endpoint)
        try:
            await client.complete(body)
        finally:
            await client.aclose()

    asyncio.run(call())


def fails_with(error: type[ModelError], endpoint: Endpoint, body: dict[str, Any] = PING) -> tuple[str, float]:
    """The error text of one model call that must fail, and the seconds it took."""
    started = time.monotonic()
    with pytest.raises(error) as caught:
        complete(endpoint, body)
    return str(caught.value), time.monotonic() - started


def test_a_wrong_key_is_one_request_and_names_what_to_check(wrong_key_upstream: Upstream) -> None:
    endpoint = Endpoint(wrong_key_upstream.base_url, "wrong-key", "gpt-x", max_retries=5, backoff_base_s=5)
    message, seconds = fails_with(EndpointConfigError, endpoint)
    assert wrong_key_upstream.hits == ["/v1/chat/completions"] and seconds < 3  # no retry, no backoff
    assert "HTTP 401" in message and "Incorrect API key" in message and "$HERMES_API_KEY" in message
    assert is_config_error(message)


def test_nothing_listening_is_refused_at_once_not_retried() -> None:
    endpoint = Endpoint(f"http://127.0.0.1:{free_port()}/v1", "k", "m", max_retries=5, backoff_base_s=5)
    message, seconds = fails_with(EndpointUnreachable, endpoint)
    assert seconds < 3 and "cannot connect to" in message and "--base_url" in message
    assert message.startswith("model endpoint unreachable: ") and is_config_error(message)  # it stops a run


@pytest.mark.parametrize("url", ["htp://x", "http://127.0.0.1:0/v1", "http:///v1", "127.0.0.1:8000/v1",
                                 "http://127.0.0.1:99999/v1"])
def test_a_malformed_base_url_is_refused_before_any_request(url: str) -> None:
    with pytest.raises(ValueError, match="base URL .*check --base_url"):
        Endpoint.resolve(url, "k", "m")


def test_a_hung_upstream_costs_the_request_timeout_per_attempt(hung_upstream: Upstream) -> None:
    endpoint = Endpoint(hung_upstream.base_url, "k", "stuck-model", request_timeout_s=1, max_retries=1,
                        backoff_base_s=0.1)
    message, seconds = fails_with(ModelError, endpoint)
    assert hung_upstream.hits == ["/v1/chat/completions"] * 2
    assert 2 <= seconds < 2 + 5 and "no answer from" in message and "within 1 s (--request_timeout)" in message
    assert not is_config_error(message)  # a slow server is no configuration error: the sample stays retryable


def test_the_sample_deadline_cuts_a_hung_call(hung_upstream: Upstream) -> None:
    endpoint = Endpoint(hung_upstream.base_url, "k", "stuck-model", request_timeout_s=60, sample_timeout_s=1.5)
    message, seconds = fails_with(ModelError, endpoint)
    assert 1.5 <= seconds < 1.5 + 3 and "deadline passed (1.5 s, --sample_timeout)" in message


def test_the_sample_deadline_cuts_the_backoff(sim_url: str) -> None:
    endpoint = Endpoint(sim_url, "k", "hermes-sim", max_retries=5, backoff_base_s=30, sample_timeout_s=1)
    message, seconds = fails_with(ModelError, endpoint, {"messages": [{"role": "user", "content": "hi [sim:always-fail]"}]})
    assert seconds < 1 + 3 and "deadline passed" in message and "HTTP 500" in message  # the last error, kept


def test_preflight_refuses_a_wrong_key_with_one_free_request(wrong_key_upstream: Upstream) -> None:
    with pytest.raises(EndpointConfigError, match="HTTP 401 .*check the API key"):
        preflight(Endpoint(wrong_key_upstream.base_url, "wrong-key", "gpt-x"))
    assert wrong_key_upstream.hits == ["/v1/models"]


def test_preflight_passes_a_listed_model_for_free_and_once(sim_server) -> None:
    before = sim_server.log.requests  # chat completions the simulator answered
    endpoint = Endpoint(sim_server.base_url, "preflight-listed", "hermes-sim")
    preflight(endpoint)
    preflight(endpoint)
    assert sim_server.log.requests == before
    preflight(Endpoint(sim_server.base_url, "preflight-listed", "an-alias-it-does-not-list"))
    assert sim_server.log.requests == before + 1  # one 1-token completion decided


def models_app(served: str) -> Starlette:
    """An endpoint without /models that serves one model and answers 404 for any other."""
    async def chat(request: Request) -> Response:
        model = (await request.json())["model"]
        if model != served:
            return JSONResponse({"error": {"message": f"The model `{model}` does not exist."}}, status_code=404)
        return JSONResponse({"choices": [{"message": {"role": "assistant", "content": "p"}, "finish_reason": "length"}]})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@pytest.fixture()
def no_models_endpoint() -> Iterator[str]:
    server = ThreadedServer(uvicorn_config(models_app("served-model")), name="no-models").start()
    yield server.url("/v1")
    server.stop()


def test_preflight_names_a_model_the_endpoint_does_not_serve(no_models_endpoint: str) -> None:
    preflight(Endpoint(no_models_endpoint, "k", "served-model"))  # no /models: the completion decides
    with pytest.raises(EndpointConfigError, match="HTTP 404 .*`missing-model` does not exist.*check the model name"):
        preflight(Endpoint(no_models_endpoint, "k", "missing-model"))


def test_preflight_gives_up_on_an_upstream_that_never_answers(hung_upstream: Upstream) -> None:
    started = time.monotonic()
    with pytest.raises(EndpointConfigError, match="no answer from .*/chat/completions within 1 s"):
        preflight(Endpoint(hung_upstream.base_url, "k", "not-listed", request_timeout_s=1))
    assert time.monotonic() - started < 1 + 3
