"""Every shell and Python example of README.md and the docs site runs, in order, page by page, as a
reader would run it (tests/docs/doc_examples.py); an example that needs a real service says which."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from doc_examples import ROOT, PageRun, examples, pages, run_page

PAGES = [page for page in pages() if examples(page)]
AT_ONCE = 2  # pages run side by side: most of a page is waiting for servers and Dagster runs


def _runnable(page: Path) -> list:
    return [example for example in examples(page) if example.needs is None]


@pytest.fixture(scope="module")
def page_runs(request, tmp_path_factory) -> dict[Path, PageRun]:
    """The selected pages' examples, run AT_ONCE pages at a time, each in its own workspace."""
    selected = [item.callspec.params["page"] for item in request.session.items
                if item.originalname == "test_the_examples_of_a_page_run" and _runnable(item.callspec.params["page"])]
    with ThreadPoolExecutor(AT_ONCE) as pool:
        futures = {page: pool.submit(run_page, _runnable(page), tmp_path_factory.mktemp(page.stem), 840)
                   for page in selected}
        return {page: future.result() for page, future in futures.items()}


@pytest.mark.timeout(1800)
@pytest.mark.xdist_group("doc_examples")  # one worker runs the pages (the fixture runs them all at its first test)
@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT).with_suffix("")) for page in PAGES])
def test_the_examples_of_a_page_run(page, page_runs) -> None:
    if not _runnable(page):
        pytest.skip(f"every example of {page.name} needs a real service (each says which)")
    result = page_runs[page]
    assert result.returncode == 0, (f"the example at {result.failed_at} failed (exit {result.returncode}); "
                                    f"output:\n{result.output[-6000:]}")


def test_examples_that_do_not_run_say_what_they_need() -> None:
    """A marker says `needs <a real service>`; the list is what a reader cannot try offline."""
    left_out = [example for page in pages() for example in examples(page) if example.needs]
    for example in left_out:
        assert len(example.needs.split()) >= 2, f"{example.where}: say what it needs, e.g. 'needs an OpenAI API key'"
