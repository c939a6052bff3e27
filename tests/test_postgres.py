"""The Dagster instance on a real PostgreSQL server (Debian's, started by the test on 127.0.0.1):
a batch run and its resume, with deploy/postgres/dagster.yaml as the instance config."""

from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import dagster as dg
import pytest

from hermes_assets.cli import batch_main
from hermes_core.config import data_root

ROOT = Path(__file__).resolve().parents[1]
PG_BIN = next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)), None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    if PG_BIN is None:
        pytest.skip("PostgreSQL is not installed (Debian's postgresql; .ci/run installs it)")
    folder = Path(tempfile.mkdtemp(prefix="hermes-pg-"))
    as_owner: list[str] = []
    if os.getuid() == 0:  # PostgreSQL refuses to run as root: run it as the package's user
        owner = pwd.getpwnam("postgres")
        os.chown(folder, owner.pw_uid, owner.pw_gid)
        as_owner = ["runuser", "-u", "postgres", "--"]
    port, data = _free_port(), folder / "data"
    subprocess.run([*as_owner, f"{PG_BIN}/initdb", "-D", str(data), "-A", "trust", "-U", "hermes"], check=True,
                   capture_output=True)
    subprocess.run([*as_owner, f"{PG_BIN}/pg_ctl", "-D", str(data), "-l", str(folder / "log"), "-w", "-o",
                    f"-c listen_addresses=127.0.0.1 -p {port} -k {folder}", "start"], check=True, capture_output=True)
    try:
        subprocess.run([*as_owner, f"{PG_BIN}/createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "hermes", "dagster"],
                       check=True, capture_output=True)
        yield f"postgresql+psycopg2://hermes@127.0.0.1:{port}/dagster"
    finally:
        subprocess.run([*as_owner, f"{PG_BIN}/pg_ctl", "-D", str(data), "-m", "fast", "stop"], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def test_a_batch_run_and_its_resume_with_the_instance_on_postgres(postgres_url, isolated_homes, sim_url, tmp_path,
                                                                  monkeypatch) -> None:
    shutil.copy(ROOT / "deploy" / "postgres" / "dagster.yaml", isolated_homes / "dagster_home" / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_POSTGRES_URL", postgres_url)
    dataset = tmp_path / "d.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"Run a command that prints {i}"}) + "\n" for i in range(6)))
    argv = [f"--dataset_file={dataset}", "--run_name=pg", f"--base_url={sim_url}", "--api_key=k",
            "--distribution=terminal_only", "--batch_size=2"]
    assert batch_main(argv) == 0
    dataset.write_text(dataset.read_text() + json.dumps({"prompt": "Run a command that prints 6"}) + "\n")
    assert batch_main(argv) == 0  # the resume: only the new row runs
    rows = (data_root() / "pg" / "trajectories.jsonl").read_text().splitlines()
    assert len(rows) == 7
    instance = dg.DagsterInstance.get()
    assert type(instance.run_storage).__name__ == "PostgresRunStorage"
    runs = instance.get_runs()
    assert len(runs) == 6 and all(run.status == dg.DagsterRunStatus.SUCCESS for run in runs)  # plan, samples, outputs x 2
    batches = instance.get_materialized_partitions(dg.AssetKey(["pg", "raw_trajectories"]))
    assert len(batches) == len(json.loads((data_root() / "pg" / "batches.json").read_text())["batches"])
