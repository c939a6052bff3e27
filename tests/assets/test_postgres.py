"""The Dagster instance on a real PostgreSQL server (Debian's, started by the test on 127.0.0.1):
a batch run and its resume, with deploy/postgres/dagster.yaml as the instance config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import dagster as dg

from hermes_assets.cli import batch_main
from hermes_core.config import data_root
from hermes_core.batch.object_ledger import ObjectLedger
from postgres_server import postgres_url  # noqa: F401  (fixture)
from s3_server import s3_endpoint, s3_ledger  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[2]


def test_a_batch_run_and_its_resume_with_the_instance_on_postgres_and_the_ledger_in_a_bucket(
        postgres_url, s3_ledger, isolated_homes, sim_url, tmp_path, monkeypatch) -> None:
    """The shape that spans hosts: nothing a second host needs is on this one's disk but the run folder."""
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
    assert len(runs) == 4 and all(run.status == dg.DagsterRunStatus.SUCCESS for run in runs)  # plan and samples, outputs x 2
    ledger = ObjectLedger(f"{s3_ledger}/pg")
    assert len(ledger.latest) == 7 and sum(ledger.records_per_partition.values()) == 7  # nothing ran twice
    assert not (data_root() / "pg" / "raw").exists()
    batches = instance.get_materialized_partitions(dg.AssetKey(["pg", "raw_trajectories"]))
    assert len(batches) == len(json.loads((data_root() / "pg" / "batches.json").read_text())["batches"])
