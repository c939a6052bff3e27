"""A hermes-batch run in the Dagster UI (issue 18, item 1): with `make dev` running, a new run's group is
listed without a manual reload, its runs are runs of the code location's own jobs (not
`__ephemeral_asset_job__`): the planning and the batches in one run of the asset job, as "Materialize
selected" makes it, then the finalize job; and "Re-execute" of its batch run works from the UI's GraphQL API."""

from __future__ import annotations

import time

import dagster as dg

from hermes_assets.cli import batch_main
from hermes_assets.sensors import finalize_job_name
from batch_runs import prompts, write_dataset
from dagster_ui import LOCATION, REPOSITORY, SharedDev, graphql
from procs import free_port

RUN = """query($id: ID!) { runOrError(runId: $id) { __typename ... on Run { runId pipelineName status
  repositoryOrigin { repositoryLocationName repositoryName } } } }"""
GROUP = """query($group: AssetGroupSelector!) { assetNodes(group: $group) { assetKey { path } } }"""
ASSET_JOB = "__ASSET_JOB"  # Dagster's job of every asset of a code location: what "Materialize selected" runs
REEXECUTE = """mutation($params: ReexecutionParams!) { launchRunReexecution(reexecutionParams: $params) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } ... on Error { message } } }"""


def ui_run(port: int, run_id: str) -> dict:
    return graphql(port, RUN, {"id": run_id})["runOrError"]


def wait_for_ui_run(port: int, run_id: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while (run := ui_run(port, run_id))["status"] not in ("SUCCESS", "FAILURE", "CANCELED"):
        assert time.monotonic() < deadline, f"run {run_id} still {run['status']} after {timeout:.0f} s"
        time.sleep(1)
    return run


def test_a_cli_run_shows_in_the_ui_as_runs_of_its_jobs_and_re_executes(isolated_homes, ui_dev: SharedDev,
                                                                        sim_server, sim_url, monkeypatch, capsys):
    dataset = write_dataset(isolated_homes / "d.jsonl", prompts(8, "ui"))
    port = ui_dev.port()
    url = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("HERMES_DAGSTER_URL", url)
    requests = sim_server.log.requests
    cli = ["--distribution=terminal_only", "--batch_size=4", f"--base_url={sim_url}", "--run_name=cli"]
    assert batch_main([f"--dataset_file={dataset}", *cli]) == 0
    assert f"the Dagster UI at {url} reloaded: run cli is listed" in capsys.readouterr().err
    assert sim_server.log.requests - requests == 16  # 8 samples x 2 calls
    assert batch_main([f"--dataset_file={dataset}", *cli]) == 0  # a plain resume: nothing to reload
    assert "Dagster UI" not in capsys.readouterr().err

    # No reload_location here: the CLI had the webserver reload the code location.
    group = {"groupName": "cli", "repositoryName": REPOSITORY, "repositoryLocationName": LOCATION}
    listed = {tuple(node["assetKey"]["path"]) for node in graphql(port, GROUP, {"group": group})["assetNodes"]}
    assert {("cli", "prompts"), ("cli", "raw_trajectories"), ("cli", "statistics")} <= listed

    jobs = {ASSET_JOB, finalize_job_name("cli")}
    mine = dg.DagsterInstance.get().get_runs(dg.RunsFilter(tags={"hermes/run": "cli"}))  # newest first
    in_ui = [ui_run(port, run.run_id) for run in mine]
    assert len(in_ui) == 2  # plan and batches, finalize; the resume had nothing to do and started no run (settled.py)
    for run in in_ui:
        assert run["pipelineName"] in jobs and run["status"] == "SUCCESS"
        assert run["repositoryOrigin"] == {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY}
    runs = {run["pipelineName"]: run for run in in_ui}
    assert set(runs) == jobs

    # "Re-execute" on the batch run: a run of the same job from the code location, nothing left to send.
    requests = sim_server.log.requests
    params = {"parentRunId": runs[ASSET_JOB]["runId"], "strategy": "ALL_STEPS"}
    launched = graphql(port, REEXECUTE, {"params": params})["launchRunReexecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    again = wait_for_ui_run(port, launched["run"]["runId"])
    assert (again["status"], again["pipelineName"]) == ("SUCCESS", ASSET_JOB)
    assert sim_server.log.requests == requests


def test_no_ui_is_silent_and_a_failed_reload_is_one_warning(isolated_homes, sim_server, sim_url, monkeypatch, capsys):
    dataset = write_dataset(isolated_homes / "d.jsonl", prompts(1, "no-ui"))
    cli = [f"--dataset_file={dataset}", f"--base_url={sim_url}", "--distribution=terminal_only"]
    monkeypatch.setenv("HERMES_DAGSTER_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    assert batch_main([*cli, "--run_name=a"]) == 0
    assert "Dagster UI" not in capsys.readouterr().err
    not_dagster = sim_url.removesuffix("/v1")  # a web server with no GraphQL API: 404
    monkeypatch.setenv("HERMES_DAGSTER_URL", not_dagster)
    assert batch_main([*cli, "--run_name=b"]) == 0
    err = capsys.readouterr().err.splitlines()
    [warning] = [line for line in err if "Dagster UI" in line]
    assert warning.startswith(f"warning: could not reload the code location in the Dagster UI at {not_dagster}")
    assert "404" in warning and warning == err[-1]  # one line, the last


def test_the_reload_imports_nothing_beside_the_run(sim_url):
    """The reload runs in a thread while the run works; a module it were importing when the run's worker
    processes fork would stay locked in them. So it uses only what the CLI has imported already."""
    import subprocess
    import sys

    code = f"""
import sys, hermes_assets.cli, hermes_assets.phases
from hermes_assets.launch import _reload
before = set(sys.modules)
print(_reload("http://127.0.0.1:{free_port()}", "x"))
print(_reload("{sim_url.removesuffix('/v1')}", "x"))
print(sorted(set(sys.modules) - before))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    nothing, not_found, imported = out.stdout.splitlines()
    assert nothing == "None" and "HTTP 404" in not_found and imported == "[]"
