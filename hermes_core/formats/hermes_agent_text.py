"""The original's wording, taken from an installed Hermes Agent (`--hermes_agent_python`, issue 19).

A run given a Python that has hermes-agent installed asks it, once, for its prose: the tool
descriptions (with their parameters' wording) and the system turn's sentences. The dumper
(hermes_agent_dump.py, beside this file) runs as a subprocess in that Python, offline (`unshare -n`,
`unshare -rn` when not root, when available) and with HERMES_HOME in a temporary folder; the product
never imports hermes-agent. The dump is checked against this project's tools (every tool exists
there, with the same parameter structure: only wording may differ) and turned into a `HermesText`,
whose rows are then byte-identical to what the original's converter writes for the same messages.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from hermes_core.fileio import atomic_write_text
from hermes_core.formats.hermes_text import OWN_TEXT, HermesText
from hermes_core.tools import registry

HERMES_AGENT_PYTHON_ENV = "HERMES_AGENT_PYTHON"
DUMPER = Path(__file__).with_name("hermes_agent_dump.py")
DUMP_TIMEOUT_S = 300
FIX = ("point --hermes_agent_python (or $HERMES_AGENT_PYTHON) at the python of a virtual environment with "
       "hermes-agent==0.19.0 installed, e.g. .oracle-venv/bin/python built by scripts/hermes_oracle.sh")


class HermesAgentTextError(ValueError):
    """The Python given cannot supply the original's wording; the message says why and what to do."""


def _offline(command: list[str]) -> list[str]:
    """`command` without network when this machine allows it (root: `unshare -n`, else a user namespace)."""
    unshare = shutil.which("unshare")
    if not unshare:
        return command
    prefix = [unshare, "-n"] if os.geteuid() == 0 else [unshare, "-rn"]
    probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
    return [*prefix, *command] if probe.returncode == 0 else command


def _run(python: str, args: list[str], home: str, offline: bool) -> subprocess.CompletedProcess[str]:
    # A clean environment: keys, HERMES_* or PYTHONPATH of the caller would change what it offers.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": home,
           "HERMES_HOME": home, "TMPDIR": home, "PYTHONDONTWRITEBYTECODE": "1"}
    command = [python, *args]
    return subprocess.run(_offline(command) if offline else command, capture_output=True, text=True, env=env,
                          timeout=DUMP_TIMEOUT_S, stdin=subprocess.DEVNULL)


def _last_line(text: str) -> str:
    return (text.strip().splitlines() or ["no output"])[-1]


def dump_hermes_agent_text(python: str) -> str:
    """The original's wording from the hermes-agent installed in `python`, as the JSON text a run
    saves (the dumper's key order kept, since a schema's key order is part of a record's bytes; it
    is deterministic, so the same wording is the same text and the same hash)."""
    where = f"--hermes_agent_python {python}"
    if not os.path.isfile(python) or not os.access(python, os.X_OK):
        raise HermesAgentTextError(f"{where}: not an executable file; {FIX}")
    with tempfile.TemporaryDirectory(prefix="hermes-agent-home-") as home:
        try:
            probe = _run(python, ["-c", "from importlib.metadata import version; print(version('hermes-agent'))"],
                         home, offline=False)
            if probe.returncode != 0 or not probe.stdout.strip():
                raise HermesAgentTextError(f"{where}: hermes-agent is not importable there "
                                           f"({_last_line(probe.stderr or probe.stdout)}); {FIX}")
            cached = _cache_path(python, probe.stdout.strip())
            try:  # a cached dump is checked as a fresh one is
                text = cached.read_text(encoding="utf-8")
                hermes_text_from_dump(text, where)
                return text
            except (OSError, ValueError, HermesAgentTextError):
                pass
            done = _run(python, [str(DUMPER), *registry.universe], home, offline=True)
        except (OSError, subprocess.SubprocessError) as exc:
            raise HermesAgentTextError(f"{where}: cannot run it ({exc}); {FIX}") from None
    if done.returncode != 0:
        raise HermesAgentTextError(f"{where}: the dump of hermes-agent {probe.stdout.strip()}'s text failed "
                                   f"({_last_line(done.stderr)}); {FIX}")
    try:
        dump = json.loads(done.stdout)
    except ValueError:
        raise HermesAgentTextError(f"{where}: the dump is not JSON ({_last_line(done.stdout)})") from None
    text = json.dumps(dump, ensure_ascii=False, indent=1) + "\n"
    hermes_text_from_dump(text, where)  # refused here, before a run uses it
    with contextlib.suppress(OSError):  # a cache: without it the next load dumps again
        atomic_write_text(cached, text)
    return text


def _cache_path(python: str, version: str) -> Path:
    """Where the dump of this installation is kept, so that loading the runs file again (each code
    location load) costs a version probe, not a 7 s dump. Keyed by the interpreter, the hermes-agent
    version and this project's dumper and tool names: the things the dump depends on."""
    key = hashlib.sha256(json.dumps([os.path.realpath(python), os.path.abspath(python), version,
                                     DUMPER.read_text(encoding="utf-8"), registry.universe]).encode()).hexdigest()
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "hermes-foundry" / "hermes-agent-text" / f"{key[:24]}.json"


def dump_sha256(text: str) -> str:
    """The dump's content hash (a recipe fingerprint input)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def without_descriptions(schema: Any) -> Any:
    """A JSON schema minus its `description` annotations (property *names* are kept)."""
    if isinstance(schema, list):
        return [without_descriptions(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    return {key: ({name: without_descriptions(sub) for name, sub in value.items()} if key == "properties"
                  and isinstance(value, dict) else without_descriptions(value))
            for key, value in schema.items() if not (key == "description" and isinstance(value, str))}


def hermes_text_from_dump(text: str, where: str) -> HermesText:
    """The `HermesText` of a dump; refused when it lacks one of our tools, or gives one another
    parameter structure (other names, types, enums, defaults, key order: not only other words)."""
    try:
        dump = json.loads(text)
        version, tools = dump["version"], dump["tools"]
        missing = [name for name in registry.universe if name not in tools or name in dump["missing"]]
        if missing:
            raise HermesAgentTextError(f"{where}: no text of hermes-agent {version} for tool(s) {', '.join(missing)}; {FIX}")
        for name in registry.universe:
            ours = without_descriptions(registry.get(name).parameters)
            entry = tools[name]
            for variant in [entry, *entry.get("variants", {}).values()]:
                if without_descriptions(variant["parameters"]) != ours:
                    raise HermesAgentTextError(f"{where}: hermes-agent {version} defines tool {name}'s parameters "
                                               f"differently from this project (not only in wording); {FIX}")
        return HermesText.from_system_turn(dump["system_turn"], dump["untrusted_notice"] or OWN_TEXT.untrusted_notice,
                                           tools)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, HermesAgentTextError):
            raise
        raise HermesAgentTextError(f"{where}: not a usable hermes-agent text dump ({exc}); {FIX}") from None
