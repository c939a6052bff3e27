"""`make dev` in a test: a real `dagster dev` (webserver, daemon and code server) on a free port of
127.0.0.1, driven through the webserver's GraphQL API as the UI drives it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator

import httpx

from dagster_runs import DAGSTER, ROOT
from procs import free_port, wait_until

LOCATION = "hermes_assets.definitions"  # the python_module of workspace.yaml
REPOSITORY = "__repository__"
LAUNCH = """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
  __typename
  ... on LaunchRunSuccess { run { runId } }
  ... on RunConfigValidationInvalid { errors { message reason } }
  ... on PythonError { message }
  ... on Error { message } } }"""
RELOAD = """mutation($name: String!) { reloadRepositoryLocation(repositoryLocationName: $name) {
  __typename ... on WorkspaceLocationEntry { locationOrLoadError { __typename ... on PythonError { message } } }
  ... on PythonError { message } } }"""


def graphql(port: int, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    """The reply's `data` (an error reply fails the test with its message)."""
    reply = httpx.post(f"http://127.0.0.1:{port}/graphql", json={"query": query, "variables": variables or {}},
                       timeout=60)
    reply.raise_for_status()
    body = reply.json()
    assert "errors" not in body, body["errors"]
    return body["data"]


def location(port: int) -> dict[str, Any] | None:
    """The code location's entry as the webserver shows it (None while the webserver is starting)."""
    try:
        data = graphql(port, "{ workspaceOrError { ... on Workspace { locationEntries { name "
                             "locationOrLoadError { __typename ... on PythonError { message } } } } } }")
    except httpx.HTTPError:
        return None
    entries = data["workspaceOrError"].get("locationEntries") or []
    return next((e["locationOrLoadError"] for e in entries if e["name"] == LOCATION), None)


def launch_job(port: int, job: str, tags: dict[str, str] | None = None,
               run_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Launchpad's launch of a job of the code location; returns the `launchRun` result."""
    params = {"selector": {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "jobName": job},
              "runConfigData": run_config or {},
              "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]}}
    return graphql(port, LAUNCH, {"params": params})["launchRun"]


def reload_location(port: int) -> dict[str, Any]:
    """Deployment → Reload, as the UI's button does it."""
    return graphql(port, RELOAD, {"name": LOCATION})["reloadRepositoryLocation"]


@contextmanager
def dagster_dev(home: Path, log: Path, env: dict[str, str] | None = None) -> Iterator[int]:
    """`dagster dev` with the project's instance settings in `home`; yields the webserver's port once the
    code location is loaded, and stops every process it started on exit."""
    if not (home / "dagster.yaml").exists():
        (home / "dagster.yaml").write_text((ROOT / "dagster_home" / "dagster.yaml").read_text())
    port = free_port()
    dev = subprocess.Popen(
        [DAGSTER, "dev", "-w", str(ROOT / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)],
        cwd=ROOT, env={**os.environ, "DAGSTER_HOME": str(home), **(env or {})}, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=log.open("wb"))
    try:
        assert wait_until(lambda: location(port) is not None, 120), f"dagster dev did not start: {log}"
        yield port
    finally:
        os.killpg(dev.pid, signal.SIGTERM)  # dagster dev and the webserver, daemon and code servers it started
        dev.wait(timeout=60)
        time.sleep(1)  # sqlite files settle once every process is gone


class SharedDev:
    """One `dagster dev` (and its instance and data root) for several tests: started by the first test that
    asks for its port, stopped by `stop` (the next ask starts it again). Each test keeps to its own runs."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.home, self.data, self.env = root / "dagster_home", root / "data", env
        self.home.mkdir(parents=True, exist_ok=True)
        self.data.mkdir(parents=True, exist_ok=True)
        self._running: ExitStack | None = None
        self._port = 0
        self._starts = 0

    def port(self) -> int:
        """The webserver's port, starting `dagster dev` if it is not running."""
        if self._running is None:
            self._starts += 1
            with ExitStack() as stack:
                self._port = stack.enter_context(dagster_dev(
                    self.home, self.home.parent / f"dagster_dev{self._starts}.log",
                    {"HERMES_DATA_DIR": str(self.data), **self.env}))
                self._running = stack.pop_all()
        return self._port

    def stop(self) -> None:
        """Stop every process of the `dagster dev`, if it runs."""
        running, self._running = self._running, None
        if running is not None:
            running.close()
