"""Loading a JSONL file the way HF `datasets` users will: what the `loads_with_hf_datasets` check runs.

Importing `datasets` costs about a second of CPU. A command line run can start a loader process
with the run (`start_loader`): it imports `datasets` on the other core while the run works. The
step that writes the file hands it the path (`prefetch`), so the load overlaps the steps between,
and the check only waits for what is left.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

_LOADER = """
import gc, json, sys
gc.disable()  # one import and one load, then exit: collections freed nothing (0.1 + 0.2 s at 2,000 rows)
import datasets  # the point of this process: imported before the path is asked for
from hermes_core.formats.hf_loading import describe_error, load_in_process
path = sys.stdin.readline().strip()
try:
    rows, columns = load_in_process(path)
    print(json.dumps({"rows": rows, "columns": columns}))
except Exception as exc:
    print(json.dumps({"error": describe_error(exc)}))
"""
_started: subprocess.Popen | None = None
_asked: str | None = None  # the path the started loader is already loading
_lock = threading.Lock()


class LoadError(RuntimeError):
    """`datasets` could not load the file (the message is the loader's own error)."""


def describe_error(exc: BaseException) -> str:
    """What a check reports about a load that failed: the error, its type and its cause."""
    if isinstance(exc, LoadError):
        return str(exc)  # described already, in the loader process
    return f"{type(exc).__name__}: {exc}" + (f" ({exc.__cause__})" if exc.__cause__ else "")


def load_in_process(path: str | Path) -> tuple[int, dict[str, str]]:
    """Rows and column types as HF `datasets` loads the file: offline, with a throwaway cache so
    nothing lands in the user's HF cache, and without progress bars in the CLI's output."""
    import datasets  # slow import: only paid when a check runs

    saved = (datasets.config.HF_DATASETS_OFFLINE, datasets.config.HF_HUB_OFFLINE)
    bars = datasets.is_progress_bar_enabled()
    datasets.config.HF_DATASETS_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    datasets.disable_progress_bars()
    try:
        with tempfile.TemporaryDirectory(prefix="hermes-hf-check-") as cache:
            loaded = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=cache)
            return loaded.num_rows, {name: repr(feature) for name, feature in loaded.features.items()}
    finally:
        datasets.config.HF_DATASETS_OFFLINE, datasets.config.HF_HUB_OFFLINE = saved
        if bars:
            datasets.enable_progress_bars()


def start_loader() -> None:
    """Start the loader process now, for the next `load_with_datasets` of this process."""
    global _started
    with _lock:
        if _started is None:
            _started = subprocess.Popen([sys.executable, "-c", _LOADER], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def prefetch(path: str | Path) -> None:
    """Have the started loader (if any) begin loading `path` now; `load_with_datasets(path)` collects it."""
    global _asked
    with _lock:
        if _started is None or _asked is not None:
            return
        try:
            _started.stdin.write(f"{path}\n")
            _started.stdin.flush()
            _asked = str(path)
        except OSError:
            pass  # a broken loader: load_with_datasets falls back to loading in this process


def stop_loader() -> None:
    """Stop a loader nobody used (e.g. the run failed before its checks)."""
    global _started, _asked
    with _lock:
        loader, _started, _asked = _started, None, None
    if loader is not None:
        loader.kill()
        loader.wait()


def load_with_datasets(path: str | Path) -> tuple[int, dict[str, str]]:
    """`load_in_process` through the started loader when there is one, else in this process.
    Raises LoadError (or the loader's exception) when `datasets` refuses the file."""
    global _started, _asked
    with _lock:
        loader, asked, _started, _asked = _started, _asked, None, None
    if loader is None or asked not in (None, str(path)):
        if loader is not None:
            loader.kill()
            loader.wait()
        return load_in_process(path)
    try:
        answer, _ = loader.communicate(None if asked else f"{path}\n", timeout=600)
        result = json.loads(answer)
    except (subprocess.TimeoutExpired, OSError, ValueError):
        loader.kill()
        loader.wait()
        return load_in_process(path)  # the loader itself broke: not a finding about the file
    if "error" in result:
        raise LoadError(result["error"])
    return result["rows"], result["columns"]
