"""One `dagster dev` for the UI tests (`ui_dev`): starting and stopping it costs half a minute, so the tests
that drive it run one after another against the same webserver, daemon and instance, each with its own
run names, and it stops after the last of them."""

from __future__ import annotations

import uuid
from typing import Iterator

import pytest

from dagster_ui import SharedDev

SHARED = "ui_dev"
DEV_KEY = pytest.StashKey[SharedDev]()


@pytest.fixture(scope="session")
def _shared_dev(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[SharedDev]:
    # The key is in the environment of the code location, as `HERMES_API_KEY=… make dev` puts it there:
    # test_secrets greps the shared home for it after every UI test ran.
    dev = SharedDev(tmp_path_factory.mktemp("ui"), {"HERMES_SENSOR_INTERVAL_S": "5",
                                                    "HERMES_API_KEY": f"sk-hermes-test-{uuid.uuid4().hex}"})
    request.config.stash[DEV_KEY] = dev
    yield dev
    dev.stop()


@pytest.fixture()
def ui_dev(isolated_homes, _shared_dev: SharedDev, monkeypatch: pytest.MonkeyPatch) -> SharedDev:
    """The shared `dagster dev`; this test's DAGSTER_HOME and HERMES_DATA_DIR are its home and data root
    (the test's own files stay under `isolated_homes`). Call `.port()` for the webserver's port."""
    monkeypatch.setenv("DAGSTER_HOME", str(_shared_dev.home))
    monkeypatch.setenv("HERMES_DATA_DIR", str(_shared_dev.data))
    return _shared_dev


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The UI tests one after another, where the first of them was: one start of `dagster dev` for all."""
    users = [item for item in items if SHARED in getattr(item, "fixturenames", ())]
    for item in users:  # with pytest-xdist (`--dist loadgroup`): all on one worker, in this order
        item.add_marker(pytest.mark.xdist_group(SHARED))
    if len(users) < 2:
        return
    first = items.index(users[0])
    rest = [item for item in items if item not in users]
    items[:] = rest[:first] + users + rest[first:]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the shared `dagster dev` once no next test needs it (it never idles through the rest of the suite)."""
    if SHARED in getattr(item, "fixturenames", ()) and SHARED not in getattr(nextitem, "fixturenames", ()):
        if (dev := item.config.stash.get(DEV_KEY, None)) is not None:
            dev.stop()
