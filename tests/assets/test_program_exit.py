"""hermes-batch exits without the interpreter's teardown, and loses nothing by it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path



def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)


def test_the_exit_runs_exit_handlers_and_flushes_the_output():
    done = _run("""
        import atexit, sys
        from hermes_assets.cli import exit_without_teardown
        atexit.register(lambda: print("handler ran", file=sys.stderr))
        sys.stdout.write("buffered, no newline")
        exit_without_teardown(3)
    """)
    assert (done.returncode, done.stdout, done.stderr) == (3, "buffered, no newline", "handler ran\n")


def test_the_exit_waits_for_a_thread_still_working(tmp_path):
    marker = tmp_path / "written"
    done = _run(f"""
        import threading, time
        from pathlib import Path
        from hermes_assets.cli import exit_without_teardown
        threading.Thread(target=lambda: (time.sleep(0.5), Path({str(marker)!r}).write_text("ok"))).start()
        exit_without_teardown(0)
    """)
    assert done.returncode == 0 and marker.read_text() == "ok"


def test_the_program_exits_with_its_status_and_whole_message(tmp_path):
    program = Path(sys.executable).with_name("hermes-batch")
    done = subprocess.run([str(program), "--run_name=x"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.rstrip().endswith("error: missing --dataset_file")
