"""A private PostgreSQL server (Debian's binaries) on 127.0.0.1 for the instance tests."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from procs import free_port

PG_BIN = next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)), None)



@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    if PG_BIN is None:
        pytest.skip("PostgreSQL is not installed (Debian's postgresql: `make test` installs it when run as root)")
    folder = Path(tempfile.mkdtemp(prefix="hermes-pg-"))
    as_owner: list[str] = []
    if os.getuid() == 0:  # PostgreSQL refuses to run as root: run it as the package's user
        owner = pwd.getpwnam("postgres")
        os.chown(folder, owner.pw_uid, owner.pw_gid)
        as_owner = ["runuser", "-u", "postgres", "--"]
    port, data = free_port(), folder / "data"
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
