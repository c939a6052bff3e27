"""The API key is never stored (issue 18, item 6): launched from the UI's GraphQL API with the key in the
code location's environment (`make dev`), typed into the Launchpad's run config, or given to `hermes-batch --api_key`,
a known key never appears in any byte under DAGSTER_HOME (sqlite included, zlib-compressed snapshots
included), while the runs authenticate against an endpoint that checks the key."""

from __future__ import annotations

import json
import sqlite3
import uuid
import zlib
from pathlib import Path
from typing import Iterator

import dagster as dg
import pytest
from starlette.responses import JSONResponse

from hermes_assets.cli import batch_main
from hermes_assets.resources import ModelEndpointResource
from hermes_assets.sensors import raw_job_name
from hermes_core.asgi_thread import ThreadedServer, uvicorn_config
from hermes_core.config import data_root
from hermes_core.endpoints.simulated.server import RequestLog, create_app
from batch_runs import write_dataset
from dagster_runs import story, wait_for
from dagster_ui import SharedDev, launch_job, location, reload_location

class KeyedEndpoint:
    """The simulated model behind a check of `Authorization: Bearer <key>`; refusals are counted apart."""

    def __init__(self, key: str) -> None:
        self.log, self.refused = RequestLog(), []
        inner = create_app(log=self.log)

        async def app(scope, receive, send) -> None:
            if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != f"Bearer {key}".encode():
                self.refused.append(scope["path"])
                reply = JSONResponse({"error": {"message": "Incorrect API key provided", "code": "invalid_api_key",
                                                "type": "invalid_request_error"}}, status_code=401)
                return await reply(scope, receive, send)
            await inner(scope, receive, send)

        self.server = ThreadedServer(uvicorn_config(app), name="keyed-sim").start()
        self.base_url = self.server.url("/v1")


@pytest.fixture()
def secret() -> str:
    return f"sk-hermes-test-{uuid.uuid4().hex}"


@pytest.fixture()
def keyed(secret: str) -> Iterator[KeyedEndpoint]:
    endpoint = KeyedEndpoint(secret)
    yield endpoint
    endpoint.server.stop()


def places_holding(home: Path, secret: str) -> list[str]:
    """Every file under `home` whose bytes contain `secret`, and every sqlite value that does once
    zlib-inflated (Dagster stores job snapshots compressed)."""
    needle, found = secret.encode(), []
    for path in sorted(p for p in home.rglob("*") if p.is_file()):
        if needle in path.read_bytes():
            found.append(str(path))
        if path.suffix != ".db":
            continue
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall():
                for row in db.execute(f'SELECT * FROM "{table}"'):
                    for value in row:
                        if isinstance(value, bytes):
                            try:
                                value = zlib.decompress(value)
                            except zlib.error:
                                pass
                        if needle in (value if isinstance(value, bytes) else str(value).encode()):
                            found.append(f"{path}:{table}")
    return found


class Holder(dg.ConfigurableResource):
    """A resource given a literal value, as ModelEndpointResource(api_key=...) used to be."""

    token: str


@dg.asset
def uses(holder: Holder) -> None:
    pass


def test_the_grep_sees_what_dagster_stores(isolated_homes, secret):
    """The control: a value given to a resource does land in the instance (the snapshot keeps it as a
    config default, compressed), and places_holding finds it; this is why the key is never one."""
    assert dg.materialize([uses], resources={"holder": Holder(token=secret)}, instance=dg.DagsterInstance.get()).success
    assert places_holding(isolated_homes / "dagster_home", secret)


def test_a_literal_key_is_refused_and_an_env_var_is_read_at_run_time(monkeypatch):
    with pytest.raises(ValueError, match="never accepted as config.*set it in the environment"):
        ModelEndpointResource(api_key="sk-typed")
    resource = ModelEndpointResource(api_key=dg.EnvVar("MY_ENDPOINT_KEY"))
    assert resource.api_key_env == "MY_ENDPOINT_KEY"
    monkeypatch.setenv("MY_ENDPOINT_KEY", "sk-from-env")
    assert resource.endpoint("m", "http://127.0.0.1:1/v1").api_key == "sk-from-env"
    with pytest.raises(ValueError, match="must name an environment variable") as refused:
        ModelEndpointResource(api_key_env="sk-not a name").api_key()
    assert "sk-not" not in str(refused.value)  # a key typed in the wrong field is not echoed


def test_a_ui_launch_reads_the_key_from_the_environment_and_stores_it_nowhere(ui_dev: SharedDev):
    # `make dev`: webserver + daemon; the key only in their (the code location's) environment. The shared
    # `dagster dev` has had it there through every UI test before this one, so the grep covers theirs too.
    secret = ui_dev.env["HERMES_API_KEY"]
    keyed = KeyedEndpoint(secret)
    try:
        typed = launch_from_the_ui(ui_dev.port(), keyed)
    finally:
        keyed.server.stop()
        ui_dev.stop()  # every process gone: the grep reads what stays on disk
    assert places_holding(ui_dev.home, secret) == [] and places_holding(ui_dev.home, typed) == []


def launch_from_the_ui(port: int, keyed: KeyedEndpoint) -> str:
    """Run "sec" launched from the UI, reading the key from the environment; then a key typed into the
    Launchpad's run config, refused at launch. Returns the typed key."""
    data_root().mkdir(parents=True, exist_ok=True)
    dataset = write_dataset(data_root() / "sec.jsonl", [{"prompt": f"Run a command that prints {i}"} for i in range(3)])
    assert batch_main([f"--dataset_file={dataset}", "--run_name=sec", f"--base_url={keyed.base_url}",
                       "--distribution=terminal_only", "--batch_size=3", "--plan_only"]) == 0
    [batch] = [b["key"] for b in json.loads((data_root() / "sec" / "batches.json").read_text())["batches"]]

    typed = f"sk-typed-{uuid.uuid4().hex}"
    assert reload_location(port)["locationOrLoadError"]["__typename"] == "RepositoryLocation"  # run "sec" is listed
    assert location(port)["__typename"] == "RepositoryLocation", location(port)
    launched = launch_job(port, raw_job_name("sec"), {"dagster/partition": batch})
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run = wait_for(launched["run"]["runId"], timeout=180)
    assert run.status == dg.DagsterRunStatus.SUCCESS, story(run.run_id)
    assert keyed.log.requests == 6 and keyed.refused == []  # 3 samples x 2 calls, each with the right key

    # A key typed into the Launchpad is invalid config: refused at launch, before any run is stored.
    runs_before = len(dg.DagsterInstance.get().get_runs())
    refused = launch_job(port, raw_job_name("sec"), {"dagster/partition": batch},
                         {"resources": {"model_endpoint": {"config": {"api_key": typed}}}})
    assert refused["__typename"] == "RunConfigValidationInvalid", refused
    [error] = refused["errors"]
    assert error["reason"] == "FIELD_NOT_DEFINED" and 'unexpected config entry "api_key"' in error["message"]
    assert "api_key_env" in error["message"] and typed not in error["message"]
    assert len(dg.DagsterInstance.get().get_runs()) == runs_before and keyed.log.requests == 6
    return typed


def test_hermes_batch_api_key_is_not_written_to_the_instance(isolated_homes, keyed, secret):
    dataset = write_dataset(isolated_homes / "d.jsonl", [{"prompt": f"Run a command that prints {i}"} for i in range(3)])
    assert batch_main([f"--dataset_file={dataset}", "--run_name=cli", f"--base_url={keyed.base_url}",
                       f"--api_key={secret}", "--distribution=terminal_only", "--batch_size=2"]) == 0
    assert keyed.log.requests == 6 and keyed.refused == []
    assert places_holding(isolated_homes / "dagster_home", secret) == []
    assert secret not in "".join(p.read_text(errors="replace") for p in (isolated_homes / "data").rglob("*")
                                 if p.is_file())  # nor in the run's own files (recipe, ledger, outputs)
