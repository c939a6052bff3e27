"""The docs site builds offline in strict mode (a broken link, anchor or nav entry fails it), loads
nothing from another host, and renders in headless Chromium: the home page, a tutorial, the CLI reference."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Chromium with every background service off, and a proxy that refuses everything: file:// pages only.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--no-first-run", "--disable-sync", "--disable-dev-shm-usage", "--proxy-server=127.0.0.1:9",
         "--window-size=1280,900", "--virtual-time-budget=5000", "--hide-scrollbars"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    result = subprocess.run([str(ROOT / ".venv" / "bin" / "mkdocs"), "build", "--strict", "-d", str(folder)],
                            cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    assert "WARNING" not in result.stderr, result.stderr[-4000:]
    return folder


def test_the_site_loads_nothing_from_another_host(site) -> None:
    """No CDN fonts, scripts or styles: it reads the same offline."""
    for page in site.rglob("*.html"):
        html = page.read_text(encoding="utf-8")
        remote = re.findall(r"<(?:script|link|img|iframe)\b[^>]*(?:src|href)=\"(?:https?:)?//[^\"]*\"", html)
        assert not [tag for tag in remote if 'rel="canonical"' not in tag], f"{page.relative_to(site)}: {remote}"
        assert "fonts.googleapis" not in html and "fonts.gstatic" not in html, page


def test_the_runs_file_schema_is_published_with_the_site(site) -> None:
    assert (site / "schema" / "runs-file.schema.json").read_bytes() == \
        (ROOT / "docs" / "schema" / "runs-file.schema.json").read_bytes()


def _render(page: Path, folder: Path, name: str) -> tuple[str, Path]:
    """The page's DOM after its scripts ran, and a screenshot of it."""
    profile, shot = folder / f"profile-{name}", folder / f"{name}.png"
    common = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}"]
    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    subprocess.run([*common, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120, check=True)
    return dom.stdout, shot


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (make test installs Debian's chromium)")
@pytest.mark.parametrize("page, expected", [
    ("index.html", ["Hermes Foundry", "Tutorials", "Reference"]),
    ("tutorials/first-run.html", ["simulated model", "hermes-batch"]),
    ("reference/cli.html", ["CLI reference", "--dataset_file", "hermes-foundry serve", "hermes-compress"]),
])
def test_pages_render_in_a_browser(site, tmp_path, page, expected) -> None:
    dom, shot = _render(site / page, tmp_path, Path(page).stem)
    for text in expected:
        assert text in dom, f"{page}: {text!r} not on the rendered page"
    assert 'class="md-nav' in dom and 'class="md-search' in dom  # the theme's navigation and search rendered
    assert shot.stat().st_size > 20_000  # a page of text and navigation, not a blank one
    if os.environ.get("HERMES_SAVE_SCREENSHOTS"):  # refresh the committed ones (docs/development.md)
        shutil.copy(shot, ROOT / "docs" / "screenshots" / f"site-{Path(page).stem}.png")
