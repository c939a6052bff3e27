"""A model that leaves a wide tree of shells in a session's sandbox, through the API server, on every
sandbox backend: the end to end case of the kill order (sandbox/tagged.py). Each shell waits on a
sleep and writes a file the moment it dies; a turn that ends, or a client that hangs up mid-command,
must stop every shell before any sleep dies. No file is written, no process is left, and the session
goes on in the same sandbox."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

import hermes_core.api_server.app as api_app
from hermes_core.api_server import ApiServer
from contract_backends import BACKENDS
from procs import marker, processes_with, wait_until
from api_servers import answer, hang_up_during, post, session, settings

SHELLS = 12


@pytest.fixture(params=BACKENDS)
def server(request: pytest.FixtureRequest, sim_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """An API server whose sessions open their sandboxes on the contract's backend and image."""
    contract = importlib.import_module(f"contract_backends.{request.param}")
    backend = contract.make_backend(tmp_path, default_image=contract.IMAGE)  # skips where it cannot exist
    monkeypatch.setattr(api_app, "get_backend", lambda name: backend)
    with ApiServer(settings(sim_server)) as srv:
        yield srv
    backend.close()


def tree(tag: str, then: str) -> str:
    return " ".join(f"(sleep {tag}; echo {n} > after-{n}) &" for n in range(SHELLS)) + f" {then}"


def test_a_tree_left_by_a_turn_or_cut_off_by_a_hang_up_runs_no_further_step(server: ApiServer) -> None:
    who = session("tree", "tree-key")
    left = marker()  # the turn's command returns at once, its shells still waiting
    assert "left" in answer(post(server, f"Please run this [sim:each-turn] [sim:command={tree(left, 'echo left')}]", who))
    assert wait_until(lambda: not processes_with(f"sleep {left}"), 10), processes_with(f"sleep {left}")

    cut = marker()  # the client hangs up while the command's own sleep runs
    hang_up_during(server, f"Please run this [sim:each-turn] [sim:command={tree(cut, f'sleep {cut}; echo x > after-x')}]",
                   who, cut)
    assert wait_until(lambda: not processes_with(f"sleep {cut}"), 10), processes_with(f"sleep {cut}")
    assert wait_until(lambda: server.active_runs == 0 and server.busy_threads == 0, 10)

    after = answer(post(server, "Please run this [sim:command=echo files: $(ls after-* 2>/dev/null | wc -l)]", who))
    assert "files: 0" in after, after
