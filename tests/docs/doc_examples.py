"""The shell and Python examples of README.md and docs/: found, and run the way a reader would.

Every ```bash, ```sh and ```python block is an example. The runnable blocks of one page run in order
in one bash session (`set -euo pipefail`), in a fresh workspace: the repository's top-level entries
linked in, a `dagster_home/` of its own and no `data/`. A ```python block runs as `.venv/bin/python`
in that same session, so it sees what earlier blocks exported. The ports a reader would type (3000,
8000, 8001, 8080, 8642) are swapped, consistently within a page, for free ones; every process the
page started is killed when it ends.

A block that needs a real service says so on the line before its fence, and is listed, not run:

    <!-- example: needs an OpenRouter API key -->
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from procs import free_port

ROOT = Path(__file__).resolve().parents[2]
LANGUAGES = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python", "py": "python"}
MARKER = re.compile(r"^\s*<!--\s*example:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
PORTS = ("3000", "8000", "8001", "8080", "8642")
PORT = re.compile(r"(?<![\w.])(" + "|".join(PORTS) + r")(?![\w])")
# Installed by `make install` / `make test`: a Makefile target run from the workspace must find them
# up to date, or make would reinstall the package from the workspace's links.
INSTALL_MARKERS = (".installed", ".local-installed", ".atropos-installed")
LEFT_OUT = {"data", "dagster_home", "site", ".git"}


@dataclass(frozen=True)
class Example:
    file: Path
    line: int  # of the opening fence, 1-based
    language: str  # bash | python
    code: str
    needs: str | None  # the real service it needs; None: it runs

    @property
    def where(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """README.md and every page of the docs site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def examples(page: Path) -> list[Example]:
    """The shell and Python blocks of `page`, with their markers. A marker that is not a `needs ...`
    is an error, as is a needs-marker that does not say what it needs."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, number = [], 0
    while number < len(lines):
        opening = FENCE.match(lines[number])
        if not opening:
            number += 1
            continue
        indent, fence, language = opening.groups()
        end = next((i for i in range(number + 1, len(lines))
                    if lines[i].strip().startswith(fence[0] * len(fence)) and not lines[i].strip().strip(fence[0])),
                   len(lines))
        body = "\n".join(line[len(indent):] if line.startswith(indent) else line.lstrip()
                         for line in lines[number + 1:end])
        if language.lower() in LANGUAGES:
            before = next((lines[i] for i in range(number - 1, -1, -1) if lines[i].strip()), "")
            marker = MARKER.match(before)
            needs = None
            if marker:
                words = marker.group(1)
                if not words.startswith("needs ") or len(words) < len("needs ") + 3:
                    raise ValueError(f"{page}:{number + 1}: an example marker says `needs <what>`, not {words!r}")
                needs = words.removeprefix("needs ").strip()
            found.append(Example(page, number + 1, LANGUAGES[language.lower()], body + "\n", needs))
        number = end + 1
    return found


def workspace(folder: Path) -> Path:
    """A reader's checkout: the repository's entries linked in, a Dagster home of its own, no data.
    `docs/` is a copy: `make docs` regenerates the reference pages, which must not change the real
    checkout (tests/docs/test_reference.py checks that they match the code)."""
    folder.mkdir()
    for entry in ROOT.iterdir():
        if entry.name == "docs":
            shutil.copytree(entry, folder / entry.name, symlinks=True)
        elif entry.name not in LEFT_OUT:
            (folder / entry.name).symlink_to(entry)
    (folder / "dagster_home").mkdir()
    shutil.copy(ROOT / "dagster_home" / "dagster.yaml", folder / "dagster_home" / "dagster.yaml")
    (folder / "home").mkdir()
    return folder


def script(runnable: list[Example], ports: dict[str, int]) -> str:
    """One bash script for a page's runnable examples; each announces itself on stderr first."""
    parts = ["set -euo pipefail"]
    for number, example in enumerate(runnable):
        code = PORT.sub(lambda m: str(ports[m.group(1)]), example.code)
        parts.append(f"echo '@@ {example.where}' >&2")
        if example.language == "python":
            delimiter = f"__HERMES_DOCS_PYTHON_{number}__"
            parts.append(f".venv/bin/python - <<'{delimiter}'\n{code}{delimiter}")
        else:
            parts.append(code)
    return "\n".join(parts) + "\n"


def environment(folder: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("HERMES_", "OPENAI_", "API_SERVER_", "DAGSTER_", "PYTEST_"))}
    env.update(DAGSTER_HOME=str(folder / "dagster_home"), HOME=str(folder / "home"),
               PATH=f"{ROOT / '.venv' / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}")
    return env


def stop_group(group: int, grace: float = 5.0) -> None:
    """SIGTERM to a process group, then SIGKILL to what is left of it after `grace` seconds."""
    try:
        os.killpg(group, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            time.sleep(0.1)
            os.killpg(group, 0)
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:  # the group is gone
        pass


@dataclass
class PageRun:
    returncode: int
    failed_at: str | None  # the example running when it failed
    output: str


def run_page(runnable: list[Example], folder: Path, timeout: float = 600) -> PageRun:
    """Run a page's examples in a new workspace under `folder`; stop everything it started after."""
    stale = [name for name in INSTALL_MARKERS
             if (marker := ROOT / ".venv" / name).exists()
             and marker.stat().st_mtime < (ROOT / "pyproject.toml").stat().st_mtime]
    if stale:
        raise RuntimeError(f".venv/{stale[0]} is older than pyproject.toml: run `make install` (or `make test`) first")
    ports = {port: free_port() for port in PORTS}
    path, log = folder / "examples.sh", folder / "examples.log"
    path.write_text(script(runnable, ports))
    checkout = workspace(folder / "checkout")
    # Output to a file, not a pipe: servers started in the background would hold a pipe open.
    with log.open("w") as sink:
        process = subprocess.Popen(["bash", str(path)], cwd=checkout, env=environment(checkout),
                                   stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            sink.write(f"\n(timed out after {timeout:.0f} s)\n")
        finally:
            stop_group(process.pid)  # the servers the page started in the background
    output = log.read_text(errors="replace")
    started = re.findall(r"^@@ (\S+)$", output, flags=re.MULTILINE)
    return PageRun(process.returncode, started[-1] if started else None, output)
