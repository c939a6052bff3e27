"""Shared fixtures: a real simulated model endpoint on 127.0.0.1, isolated data/Dagster homes, the
local model's converted tokenizer (once per session)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from code_image import BUILD, SHARED, engine_answers
from hermes_core.endpoints.simulated import SimulatedModelServer


# Started as a background job of a script, the suite inherits SIGINT ignored, and so would every
# program it starts (`dagster dev`, hermes-batch): tests that stop them with Ctrl-C would wait forever.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config: pytest.Config) -> None:
    """With pytest-xdist (`make test` runs a worker per core): the workers, started after this, find the
    controller's code image build (tests/code_image.py) through the environment."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        os.environ[SHARED] = str(BUILD.folder)


def _build_code_image_for(test_ids: list[str], config: pytest.Config) -> None:
    """Start the docker launcher test's code image (tests/code_image.py) once that test is collected,
    so it builds beside the tests before it."""
    if config.option.collectonly or (BUILD.folder / "started").exists():
        return
    if any("test_docker_launcher.py" in test for test in test_ids) and engine_answers():
        BUILD.start()


def pytest_collection_finish(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # an xdist worker leaves it to the controller (below)
        _build_code_image_for([item.nodeid for item in session.items], session.config)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """The controller builds the one image for whichever worker gets the test."""
    _build_code_image_for(ids, node.config)


@pytest.hookimpl(trylast=True)  # after the hooks that add the mark (tests/assets/conftest.py)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`--dist loadgroup` sends tests of one `xdist_group` to one worker by a `@group` suffix of their
    ids. pytest-xdist 3.8 sets it on `item._nodeid`, which pytest 9 no longer reads (it reads `_id`):
    every group was split over the workers, so the doc examples ran every page twice, once per worker,
    and each worker started its own shared `dagster dev`. The suffix is set here instead."""
    if not getattr(config.option, "loadgroup", False):
        return
    from _pytest.nodeid import coerce_node_id

    for item in items:
        groups = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                         for mark in item.iter_markers("xdist_group")})
        if groups and "@" not in item.nodeid:
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(groups)}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    BUILD.stop()  # a build whose test did not run


@pytest.fixture(scope="session")
def sim_server():
    server = SimulatedModelServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture()
def sim_url(sim_server) -> str:
    return sim_server.base_url


@pytest.fixture()
def isolated_homes(tmp_path, monkeypatch):
    """A fresh data root and Dagster home per test; no endpoint settings leak in from the machine."""
    for name in ("HERMES_BASE_URL", "HERMES_API_KEY", "HERMES_MODEL", "OPENAI_BASE_URL", "OPENAI_API_KEY",
                 "HERMES_RUNS_FILE", "HERMES_SENSOR_INTERVAL_S", "HERMES_MAX_NO_REASONING_RATE",
                 "HERMES_MAX_HALLUCINATION_RATE", "HERMES_LEDGER_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HERMES_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("HERMES_DAGSTER_URL", "")  # hermes-batch never asks a UI on port 3000 to reload
    (tmp_path / "dagster_home").mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    return tmp_path


@pytest.fixture(scope="session")
def tokenizer_cache(tmp_path_factory) -> Path:
    """A private cache folder holding the bundled model's converted tokenizer."""
    pytest.importorskip("gguf", reason="the atropos extra (make test installs it)")
    from hermes_core.endpoints.local_model import bundled_gguf
    from hermes_core.environments.tokenizer import tokenizer_dir

    if bundled_gguf() is None:
        pytest.skip("needs the bundled SmolLM2 GGUF (make local)")
    cache = tmp_path_factory.mktemp("cache") / "tokenizers"  # the layout under $HERMES_CACHE_DIR
    tokenizer_dir(None, cache_dir=cache)
    return cache
