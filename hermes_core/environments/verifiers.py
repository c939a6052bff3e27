"""Verifiers: a rollout's reward, computed in the rollout's own sandbox before it closes.

Specs (a task line's `verifier` object):
- `{"type": "file_equals", "path": P, "content": S, "strip": false}`: 1 when the file holds exactly S
- `{"type": "file_contains", "path": P, "text": S}`: 1 when the file contains S
- `{"type": "command", "command": C, "timeout": 60}`: 1 when C exits 0 in the sandbox
- `{"type": "pytest", "tests": F, "timeout": 120}`: F (a file or folder beside the task file) is uploaded
  after the rollout, so the model never saw it, and run with `python3 -m pytest` from the working folder:
  1 when every test passes, 0 when one fails or the code under test does not import
- `{"type": "task_folder", "path": D, "timeout": 300}`: a Terminal-Bench-style folder whose `tests/` is
  uploaded after the rollout; `tests/test.sh` runs with `$TESTS_DIR` and `$REWARD_FILE` set and writes
  the reward (a number) to `$REWARD_FILE`

A verifier that cannot give a verdict (timeout, a broken sandbox, pytest missing, no reward written)
raises `VerifierError`: an error of that rollout, recorded and retried, never a silent 0.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes_core.sandbox import Sandbox, SandboxError
from hermes_core.sandbox.base import SandboxFailed

UPLOAD_DIR = "/tmp/hermes-verifier"  # private to each sandbox; written only once the rollout is over
MAX_UPLOAD_BYTES = 4 * 1024 * 1024
DEFAULT_TIMEOUTS = {"command": 60.0, "pytest": 120.0, "task_folder": 300.0}
TYPES = ("file_equals", "file_contains", "command", "pytest", "task_folder")
# pytest's exit codes: 0 all passed, 1 some failed, 2 interrupted (e.g. the solution does not import);
# 3 internal error, 4 usage error, 5 no tests collected are the verifier's fault, not the model's.
PYTEST_VERDICTS = {0: 1.0, 1: 0.0, 2: 0.0}


class VerifierSpecError(ValueError):
    """A verifier spec is malformed (checked when the task file loads)."""


class VerifierError(RuntimeError):
    """The verifier could not give a verdict: the rollout has an error, not a reward."""


@dataclass(frozen=True)
class Verdict:
    reward: float
    detail: str  # why, briefly: what was compared, the tail of the command's output


@dataclass(frozen=True)
class VerifierSpec:
    type: str
    options: dict[str, Any]
    files: tuple[tuple[str, bytes], ...] = ()  # uploaded after the rollout: (relative path, bytes)

    def identity(self) -> dict[str, Any]:
        """What the reward depends on: options and the uploaded files' digests."""
        digests = {name: hashlib.sha256(data).hexdigest() for name, data in self.files}
        return {"type": self.type, "options": self.options, "files": digests}

    @property
    def timeout(self) -> float:
        return float(self.options.get("timeout") or DEFAULT_TIMEOUTS.get(self.type, 60.0))


def _string(spec: dict[str, Any], key: str) -> str:
    value = spec.get(key)
    if not isinstance(value, str) or not value:
        raise VerifierSpecError(f"'{key}' must be a non-empty string")
    return value


def _folder_files(root: Path, base: Path) -> tuple[tuple[str, bytes], ...]:
    """Every regular file under `root` (or `root` itself), named relative to `base`; size-capped."""
    paths = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    files, total = [], 0
    for path in paths:
        data = path.read_bytes()
        total += len(data)
        if total > MAX_UPLOAD_BYTES:
            raise VerifierSpecError(f"{root}: more than {MAX_UPLOAD_BYTES // 2**20} MiB of files to upload")
        files.append((path.relative_to(base).as_posix(), data))
    return tuple(files)


def parse_spec(spec: Any, base: Path) -> VerifierSpec:
    """A checked spec; files it names are read now, relative to `base` (the task file's folder)."""
    if not isinstance(spec, dict):
        raise VerifierSpecError("must be a JSON object with a 'type'")
    kind = spec.get("type")
    if kind not in TYPES:
        raise VerifierSpecError(f"'type' must be one of {', '.join(TYPES)} (got {kind!r})")
    timeout = spec.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise VerifierSpecError("'timeout' must be a positive number of seconds")
    options = {k: v for k, v in spec.items() if k != "type"}
    if kind in ("file_equals", "file_contains"):
        _string(spec, "path")
        key = "content" if kind == "file_equals" else "text"
        if not isinstance(spec.get(key), str):
            raise VerifierSpecError(f"'{key}' must be a string")
        return VerifierSpec(kind, options)
    if kind == "command":
        _string(spec, "command")
        return VerifierSpec(kind, options)
    name = _string(spec, "tests" if kind == "pytest" else "path")
    root = (base / name).resolve()
    if not root.exists():
        raise VerifierSpecError(f"{name!r}: no such file or folder beside the task file")
    if kind == "task_folder":
        if not (root / "tests" / "test.sh").is_file():
            raise VerifierSpecError(f"{name!r}: a task folder needs tests/test.sh")
        return VerifierSpec(kind, options, _folder_files(root / "tests", root))
    return VerifierSpec(kind, options, _folder_files(root, root if root.is_dir() else root.parent))


def _tail(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else "…" + text[-limit:]


def _run(sandbox: Sandbox, command: str, timeout: float) -> tuple[int, str]:
    try:
        result = sandbox.exec(command, timeout=timeout)
    except SandboxError as exc:
        raise VerifierError(f"the sandbox could not run the verifier: {exc}") from exc
    if result.timed_out or result.exit_code is None:
        raise VerifierError(f"the verifier timed out after {timeout:g} s")
    return result.exit_code, result.output


def _upload(sandbox: Sandbox, files: tuple[tuple[str, bytes], ...], folder: str) -> None:
    try:
        for name, data in files:
            sandbox.write_file(f"{folder}/{name}", data)
    except (SandboxError, OSError) as exc:
        raise VerifierError(f"could not upload the verifier's files: {exc}") from exc


def _read(sandbox: Sandbox, path: str) -> bytes | None:
    """The file's bytes; None when the rollout left no readable regular file there (the model's doing)."""
    try:
        return sandbox.read_file(path)
    except SandboxFailed as exc:
        raise VerifierError(f"the sandbox broke before the verifier read {path}: {exc}") from exc
    except (FileNotFoundError, SandboxError, OSError):
        return None


def verify(spec: VerifierSpec, sandbox: Sandbox) -> Verdict:
    """The verdict of `spec` in `sandbox` (blocking: call it in a worker thread)."""
    options = spec.options
    if spec.type in ("file_equals", "file_contains"):
        data = _read(sandbox, options["path"])
        if data is None:
            return Verdict(0.0, f"{options['path']}: no such file")
        text = data.decode("utf-8", errors="replace")
        if spec.type == "file_contains":
            found = options["text"] in text
            return Verdict(float(found), f"{options['path']} {'contains' if found else 'lacks'} the text")
        expected, actual = options["content"], text
        if options.get("strip"):
            expected, actual = expected.strip(), actual.strip()
        return Verdict(float(actual == expected), f"{options['path']}: {json.dumps(actual[:200])}")
    if spec.type == "command":
        code, output = _run(sandbox, options["command"], spec.timeout)
        return Verdict(float(code == 0), f"exit {code}: {_tail(output)}")
    if spec.type == "pytest":
        _upload(sandbox, spec.files, f"{UPLOAD_DIR}/tests")
        command = (f"PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -q -p no:cacheprovider "
                   f"--rootdir={UPLOAD_DIR} {UPLOAD_DIR}/tests")
        code, output = _run(sandbox, command, spec.timeout)
        if "No module named pytest" in output or code == 127:
            raise VerifierError(f"pytest is not installed in the sandbox: {_tail(output, 300)}")
        if code not in PYTEST_VERDICTS:
            raise VerifierError(f"pytest could not run the tests (exit {code}): {_tail(output)}")
        return Verdict(PYTEST_VERDICTS[code], f"pytest exit {code}: {_tail(output)}")
    return _task_folder(spec, sandbox)


def _task_folder(spec: VerifierSpec, sandbox: Sandbox) -> Verdict:
    tests, reward_file = f"{UPLOAD_DIR}/tests", f"{UPLOAD_DIR}/reward.txt"
    _upload(sandbox, tuple((name.removeprefix("tests/"), data) for name, data in spec.files), tests)
    command = (f"TESTS_DIR={shlex.quote(tests)} REWARD_FILE={shlex.quote(reward_file)} "
               f"bash {shlex.quote(tests)}/test.sh")
    code, output = _run(sandbox, command, spec.timeout)
    written = _read(sandbox, reward_file)
    if written is None:
        raise VerifierError(f"tests/test.sh wrote no reward to $REWARD_FILE (exit {code}): {_tail(output, 500)}")
    try:
        reward = float(written.decode("utf-8", errors="replace").strip())
    except ValueError:
        raise VerifierError(f"tests/test.sh wrote {written[:80]!r} to $REWARD_FILE, not a number") from None
    return Verdict(reward, f"test.sh exit {code}: {_tail(output)}")
