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


def _start(as_owner: list[str], data: Path, folder: Path, attempts: int = 5) -> int:
    """Start the server on a free port, and return it. Between the pick and the server's bind another
    process may take the port (the suite's own connections draw from the same range): then another."""
    log = folder / "log"
    for _ in range(attempts):
        port, seen = free_port(), log.stat().st_size if log.exists() else 0
        started = subprocess.run([*as_owner, f"{PG_BIN}/pg_ctl", "-D", str(data), "-l", str(log), "-w", "-o",
                                  f"-c listen_addresses=127.0.0.1 -p {port} -k {folder}", "start"],
                                 capture_output=True)
        if started.returncode == 0:
            return port
        if "Address already in use" not in log.read_bytes()[seen:].decode(errors="replace"):
            started.check_returncode()
    raise RuntimeError(f"PostgreSQL found no free port in {attempts} attempts (see {log})")


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
    data = folder / "data"
    subprocess.run([*as_owner, f"{PG_BIN}/initdb", "-D", str(data), "-A", "trust", "-U", "hermes"], check=True,
                   capture_output=True)
    port = _start(as_owner, data, folder)
    try:
        subprocess.run([*as_owner, f"{PG_BIN}/createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "hermes", "dagster"],
                       check=True, capture_output=True)
        yield f"postgresql+psycopg2://hermes@127.0.0.1:{port}/dagster"
    finally:
        subprocess.run([*as_owner, f"{PG_BIN}/pg_ctl", "-D", str(data), "-m", "fast", "stop"], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)
