"""`make test` checks the free space of the folders the suite writes to before it runs
(scripts/disk_check.sh): a full disk otherwise fails whichever fixtures come next."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts/disk_check.sh"


def check(*folders: Path, need_gb: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *map(str, folders)], env={**os.environ, "HERMES_TEST_DISK_GB": need_gb},
                          capture_output=True, text=True, timeout=30)


def test_too_little_space_is_one_error_naming_the_folder_and_the_need(tmp_path: Path) -> None:
    free_gb = shutil.disk_usage(tmp_path).free // 2**30
    short = check(tmp_path, need_gb=str(free_gb + 2))
    assert short.returncode == 1 and short.stdout == ""
    assert f"GB free for {tmp_path};" in short.stderr and f"needs about {free_gb + 2} GB" in short.stderr
    assert short.stderr.count("\n") == 2  # the shortage and where to look, no more
    assert check(tmp_path, tmp_path / "not-made", need_gb="0").returncode == 0  # a folder not made yet is skipped


def test_a_need_that_is_not_a_number_is_said() -> None:
    bad = check(Path("/"), need_gb="5GB")
    assert bad.returncode == 2 and "must be a whole number of GB, not '5GB'" in bad.stderr
