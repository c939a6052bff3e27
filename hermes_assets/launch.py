"""hermes-batch's runs as runs of the code location's own jobs, and the Dagster UI told about new runs.

`dg.materialize` would record each phase as a run of `__ephemeral_asset_job__` with no origin: the UI
cannot link it to the code location, so "Re-execute" cannot work. Here the CLI builds the run's
definitions in process (as the code location does), creates the run as the Launchpad would (the job's
name and snapshot, and an origin naming the code location of workspace.yaml), and executes it in this
process, where the console, the progress bar and Ctrl-C stay. Once a run is new or its recipe changed,
the webserver at $HERMES_DAGSTER_URL is asked to reload the code location, so its group shows at once.
"""

from __future__ import annotations

import encodings.idna  # noqa: F401 - socket's host name codec, loaded at first use: here, not in the reload's thread
import http.client
import json
import os
import re
import signal
import sys
import threading
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import dagster as dg
from dagster import DagsterEvent, DagsterEventType
from dagster._core.definitions.job_base import InMemoryJob
from dagster._core.execution.api import ExecuteRunWithPlanIterable, create_execution_plan, job_execution_iterator
from dagster._core.execution.context_creation_job import (PlanOrchestrationContextManager,
                                                          orchestration_context_event_generator)
from dagster._core.remote_origin import RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._core.workspace.load import location_origin_from_module_name

from hermes_assets.slots import process_tags
from hermes_core.fileio import FULL

LOCATION = "hermes_assets.definitions"  # the python_module of workspace.yaml: the location's name in the UI
REPOSITORY = "__repository__"  # the one repository a dg.Definitions makes
PROJECT = Path(__file__).resolve().parent.parent  # workspace.yaml's working_directory
UI_ENV = "HERMES_DAGSTER_URL"
DEFAULT_UI = "http://127.0.0.1:3000"  # what `make dev` serves
RELOAD_TIMEOUT_S = 30.0  # loading the code location takes seconds; the reload runs beside the CLI's work
CONNECT_TIMEOUT_S = 2.0  # an address where nothing answers is no UI
RELOAD = """mutation($name: String!) { reloadRepositoryLocation(repositoryLocationName: $name) {
  __typename ... on WorkspaceLocationEntry { locationOrLoadError { __typename ... on PythonError { message } } }
  ... on Error { message } } }"""
# Asked apart: the reload's own reply resolves the groups against the workspace as it was before it.
GROUPS = """query($repo: RepositorySelector!) { repositoryOrError(repositorySelector: $repo) {
  ... on Repository { assetGroups { groupName } } } }"""


def job_origin(job_name: str) -> RemoteJobOrigin:
    """The origin a Launchpad run of `job_name` carries: it links the run to the code location in the UI."""
    location = location_origin_from_module_name(LOCATION, None, str(PROJECT))
    return RemoteJobOrigin(RemoteRepositoryOrigin(location, REPOSITORY), job_name)


def execute_job(instance: dg.DagsterInstance, job: dg.JobDefinition, run_config: Mapping[str, Any],
                tags: Mapping[str, str], assets: set[dg.AssetKey] | None = None) -> dg.ExecuteInProcessResult:
    """One run of `job` (a job of the code location, e.g. `defs.resolve_job_def(name)`), or of its `assets`
    and their checks as the UI's "Materialize selected" does it, stored with the job's real name and the
    code location's origin, executed in this process; failures are in the result. The run names this
    process, so that if it dies the next run can fail it and free its slot."""
    in_memory = InMemoryJob(job.get_subset(asset_selection=assets) if assets else job)
    run_tags = {**job.run_tags, **tags, **process_tags()}
    plan = create_execution_plan(in_memory, run_config=run_config, instance_ref=instance.get_ref(), tags=run_tags)
    run = instance.create_run_for_job(job_def=job, execution_plan=plan, run_config=run_config, tags=run_tags,
                                      asset_selection=assets, remote_job_origin=job_origin(job.name))
    # What JobDefinition.execute_in_process does with its ephemeral job, here with the job itself.
    # Dagster leaves SIGTERM set to SIGINT's handler afterwards; when SIGINT is ignored (a script's
    # background job), SIGTERM would be ignored from then on, by this command and all it starts.
    main = threading.current_thread() is threading.main_thread()  # signals are the main thread's
    term = signal.getsignal(signal.SIGTERM) if main else None
    try:
        events = _events(ExecuteRunWithPlanIterable(
            execution_plan=plan,
            iterator=job_execution_iterator,
            execution_context_manager=PlanOrchestrationContextManager(
                context_event_generator=orchestration_context_event_generator, job=in_memory, execution_plan=plan,
                dagster_run=run, instance=instance, run_config=run_config, executor_defs=None, output_capture=None,
                raise_on_error=False),
        ), main)
    finally:
        if main and term is not None:  # None: not set from Python, nothing to put back
            signal.signal(signal.SIGTERM, term)
    return dg.ExecuteInProcessResult(event_list=events, dagster_run=instance.get_run_by_id(run.run_id) or run,
                                     output_capture=None, job_def=in_memory.get_definition())


def _events(run: Iterable[DagsterEvent], main: bool) -> list[DagsterEvent]:
    """The run's events. Until its log capture has started, SIGINT is blocked in this thread: the
    capture's mirroring processes (`tail -F` of the log file to the console, and its watcher) inherit
    it blocked, so a terminal's Ctrl-C, which reaches the whole process group, neither kills them (the
    rest of the run's output would then go to the log file only) nor makes the watcher print a
    traceback. A Ctrl-C meanwhile is delivered once SIGINT is unblocked."""
    blocked = main and signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    events = []
    try:
        for event in run:
            events.append(event)
            if blocked and (event.event_type == DagsterEventType.LOGS_CAPTURED or event.step_key is not None):
                blocked = False  # a step's events: capture started (or failed to), before any step ran
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    finally:
        if blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    return events


# Where hermes-batch puts a key given with --api_key for its own runs: run config names this variable, never the key.
CLI_KEY_ENV = "HERMES_BATCH_API_KEY"


def run_config(verbose: bool, base_url: str, api_key: str | None, max_retries: int,
               max_concurrent_requests: int | None) -> dict[str, Any]:
    """hermes-batch's run config: the console's log level (CRITICAL: Dagster prints nothing) and the
    model_endpoint resource. Run config is stored with the run, so the key never goes in: a key given
    on the command line reaches the resource through this process's environment (CLI_KEY_ENV, named in
    the config); without one the resource reads $HERMES_API_KEY / $OPENAI_API_KEY as the CLI did, and
    so does a re-execution from the UI, in the code location's environment."""
    if api_key:
        os.environ[CLI_KEY_ENV] = api_key
    resource = {"base_url": base_url, "api_key_env": CLI_KEY_ENV if api_key else None, "max_retries": max_retries,
                "max_concurrent_requests": max_concurrent_requests}
    return {"loggers": {"console": {"config": {"log_level": "INFO" if verbose else "CRITICAL"}}},
            "resources": {"model_endpoint": {"config": {k: v for k, v in resource.items() if v is not None}}}}


def step_ran(result: dg.ExecuteInProcessResult, step_key: str) -> bool:
    """Whether the run started the step (a failure upstream, e.g. a blocking check's, skips it)."""
    return any(event.is_step_start and event.step_key == step_key for event in result.all_events)


def first_error(result: dg.ExecuteInProcessResult) -> str:
    """The first failed step's error in one line, without Dagster's wrapping exception classes; a
    file that did not fit reads "FILE: No space left on device" (`full_disk`)."""
    for event in result.all_events:
        if event.is_step_failure and event.step_failure_data and event.step_failure_data.error:
            error = event.step_failure_data.error
            while error.cause and error.message.startswith("dagster."):
                error = error.cause
            # "dagster._core.definitions.events.Failure: 3 sample(s) failed ..." -> what follows the class
            message = re.sub(r"^dagster\.[\w.]+: ", "", error.message.strip())
            full = _FULL.search(message)
            return f"{full[2]}: {full[1]}" if full else message
    return "the Dagster run failed"


# "OSError: [Errno 28] No space left on device: '/data/run/raw/b00001-….jsonl'": Dagster keeps a
# step's exception as text only, in Python's own form for an OSError with a file name.
_FULL = re.compile(rf"\[Errno (?:{'|'.join(map(str, FULL))})\] ([^:\n]+): '([^'\n]+)'")


def full_disk(result: dg.ExecuteInProcessResult) -> bool:
    """The run failed because a file of it did not fit (the disk or a quota is full)."""
    return first_error(result).endswith(tuple(f": {os.strerror(code)}" for code in FULL))


class _NoServer(OSError):
    """Nothing accepted a connection at the UI's address."""


def _graphql(url: str, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    """The `data` of a GraphQL query to the webserver at `url`. Over http.client, which Dagster has
    imported already: this runs in a thread beside the run, and a module that thread was importing
    when the run's worker processes fork would stay locked in them."""
    target = urllib.parse.urlsplit(f"{url.rstrip('/')}/graphql")
    if target.scheme not in ("http", "https") or not target.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    kind = http.client.HTTPSConnection if target.scheme == "https" else http.client.HTTPConnection
    connection = kind(target.hostname, target.port, timeout=CONNECT_TIMEOUT_S)
    try:
        try:
            connection.connect()
        except OSError as exc:  # refused, no such host, no answer in time
            raise _NoServer(str(exc)) from exc
        connection.sock.settimeout(RELOAD_TIMEOUT_S)
        connection.request("POST", target.path, body=json.dumps({"query": query, "variables": variables}),
                           headers={"Content-Type": "application/json"})
        reply = connection.getresponse()
        body = reply.read()
    finally:
        connection.close()
    if reply.status >= 400:
        raise ValueError(f"HTTP {reply.status} {reply.reason} from {target.geturl()}")
    return json.loads(body)["data"]


def _reload(url: str, run_name: str) -> str | None:
    """Reload the code location at `url`; the line to print (None: no UI listening there)."""
    try:
        entry = _graphql(url, RELOAD, {"name": LOCATION})["reloadRepositoryLocation"]
        loaded = entry.get("locationOrLoadError") or {}
        if entry["__typename"] != "WorkspaceLocationEntry" or loaded.get("__typename") != "RepositoryLocation":
            error = (loaded.get("message") or entry.get("message") or entry["__typename"]).strip().splitlines()[-1]
            return f"warning: the Dagster UI at {url} could not reload the code location {LOCATION}: {error}"
        repo = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY}
        groups = {group["groupName"] for group in
                  _graphql(url, GROUPS, {"repo": repo})["repositoryOrError"].get("assetGroups") or []}
    except _NoServer:
        return None  # nothing serves there: no UI to tell
    except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError, AttributeError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return (f"warning: could not reload the code location in the Dagster UI at {url}: {reason} (set {UI_ENV} "
                "to the UI's address, or empty)")
    if run_name not in groups:
        return (f"warning: the Dagster UI at {url} reloaded, but run {run_name} is not listed: does it use the "
                "same data root (HERMES_DATA_DIR / --output_dir)?")
    return f"the Dagster UI at {url} reloaded: run {run_name} is listed"


class UiReload:
    """Asks the Dagster webserver at $HERMES_DAGSTER_URL (default DEFAULT_UI; empty: never) to reload the
    code location, in the background while the run works; `report` prints its one line (if any)."""

    def __init__(self, run_name: str) -> None:
        self.url = os.environ.get(UI_ENV, DEFAULT_UI).strip()
        self.line: str | None = None
        self.thread = threading.Thread(target=self._run, args=(run_name,), name="hermes-ui-reload", daemon=True)
        if self.url:
            self.thread.start()

    def _run(self, run_name: str) -> None:
        self.line = _reload(self.url, run_name)

    def report(self) -> None:
        if self.url:
            self.thread.join(RELOAD_TIMEOUT_S)
        if self.line:
            print(self.line, file=sys.stderr)
