"""Open WebUI 0.12.4 (its own venv, offline) in front of a real `hermes-foundry serve`, driven in
headless Chromium as a user would: the model is listed, a reply streams in with the tool progress
line before the answer, a second turn works. Opt-in (`make test-frontend`): the venv is ~7 GB."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from frontend_stack import (CHROMIUM, MODEL_ID, ROOT, browser_tab, hermes_serve, open_webui,
                            press_enter, screenshot_png, wait_for)
from hermes_core.endpoints.simulated import SimulatedModelServer
from hermes_core.fileio import atomic_write_text
from hermes_core.tools.browser.page import Page

pytestmark = pytest.mark.timeout(1200)  # the venv build on a fresh machine, then Open WebUI's first start
SCREENSHOT = ROOT / "docs" / "screenshots" / "open_webui.png"
# The simulated model runs this command with the terminal tool; one second per model call leaves the
# progress line on the page for about a second before the answer arrives.
PROMPT = "Please run this [sim:command=echo served-by-hermes] [sim:latency=1]"
PROGRESS = '🔧 terminal {"command": "echo served-by-hermes"}'
ANSWER = re.compile(r'Done\. .*"output": "served-by-hermes\\n".*"exit_code": 0\}')
REPLY_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def open_webui_executable() -> str:
    """Open WebUI's `open-webui` from the cached side venv (scripts/frontend_venv.sh builds it once)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    built = subprocess.run([str(ROOT / "scripts" / "frontend_venv.sh")], capture_output=True, text=True)
    if built.returncode != 0:
        pytest.skip(built.stderr.strip().splitlines()[-1] if built.stderr.strip() else "the frontend venv failed")
    return built.stdout.strip().splitlines()[-1]


def find_ref(page: Page, pattern: str, timeout: float = 0.0, after: str | None = None) -> str | None:
    """The ref (`@e7`) of the first snapshot line matching `pattern` (after the text `after`, if
    given), polling the page's accessibility snapshot for up to `timeout` seconds; None if absent."""
    deadline = time.monotonic() + timeout
    while True:
        snapshot = page.snapshot()["snapshot"]
        start = snapshot.find(after) if after else 0
        found = re.search(pattern + r".*?\[(@e\d+)\]", snapshot[start:]) if start >= 0 else None
        if found or time.monotonic() > deadline:
            return found.group(1) if found else None
        time.sleep(0.5)


def replies(page: Page) -> list[str]:
    """The text of each assistant message shown in the chat, in order."""
    texts = page.evaluate("JSON.stringify([...document.querySelectorAll('.chat-assistant')].map(e => e.innerText))")
    return list(texts["result"])


def send(page: Page, text: str) -> None:
    """Type `text` into the message box and press Enter."""
    box = find_ref(page, r'textbox "(?:How can I help you today\?|Send a Message)"', timeout=30)
    assert box, f"no message box on the page: {page.snapshot()['snapshot'][:2000]}"
    page.type(box, text)  # focuses the editor, then types as a keyboard would (CDP Input.insertText)
    press_enter(page)


def watch_reply(page: Page, index: int) -> list[str]:
    """Every distinct text the `index`-th reply shows until its answer is complete."""
    seen: list[str] = []

    def complete() -> bool:
        shown = replies(page)
        if len(shown) > index and (not seen or seen[-1] != shown[index]):
            seen.append(shown[index])
        return bool(seen and ANSWER.search(seen[-1]))

    try:
        wait_for(complete, REPLY_TIMEOUT_S, f"reply {index + 1} to finish", interval=0.1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; it showed {seen!r}; the page: {page.snapshot()['snapshot'][:3000]}") from None
    return seen


def test_open_webui_chat_through_hermes_serve(open_webui_executable: str, tmp_path: Path) -> None:
    with (SimulatedModelServer() as sim, hermes_serve(sim.base_url, tmp_path) as api_url,
          open_webui(open_webui_executable, api_url, tmp_path) as url, browser_tab(url) as page):
        assert find_ref(page, r'textbox "How can I help you today\?"', timeout=60), "Open WebUI's chat page"
        # On a fresh data dir Open WebUI opens its release notes once, shortly after the page.
        close = find_ref(page, r'button "Close"', timeout=10, after="What's New")
        if close:
            page.click(close)

        # The model our server advertises is listed in the model picker (and picked: it is the only one).
        picker = find_ref(page, rf'button "Selected model: {MODEL_ID}"', timeout=30)
        assert picker, "the model picker does not show hermes-agent as the selected model"
        page.click(picker)
        assert find_ref(page, rf'option "Select {MODEL_ID} model"', timeout=10, after='listbox "Available models"')
        page.press("Escape")

        # First turn: the tool's progress line shows while the agent still works, then the answer.
        send(page, PROMPT)
        first = watch_reply(page, 0)
        assert any(PROGRESS in text and not ANSWER.search(text) for text in first), (
            f"the progress line was never on the page before the answer; the reply showed {first!r}")
        assert PROGRESS in first[-1] and first[-1].index(PROGRESS) < ANSWER.search(first[-1]).start()

        # Second turn in the same chat: Open WebUI sends the history, a second reply completes.
        send(page, "Thanks! Once more, please.")
        second = watch_reply(page, 1)
        assert ANSWER.search(second[-1])
        assert len(replies(page)) == 2 and ANSWER.search(replies(page)[0])
        users = page.evaluate("JSON.stringify([...document.querySelectorAll('.chat-user')].map(e => e.innerText))")
        assert [text.split("\n")[0] for text in users["result"]] == [PROMPT, "Thanks! Once more, please."]

        # The picture once Open WebUI's follow-up task is done and the composer is idle again.
        find_ref(page, r'button "Voice mode"', timeout=30)
        time.sleep(1)
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(SCREENSHOT, screenshot_png(page))

    # Kept for whoever reads the run: what Open WebUI asked our server for (one access-log line each).
    posts = [line for line in (tmp_path / "serve.log").read_text().splitlines() if "POST /v1/chat/completions" in line]
    print(f"Open WebUI sent {len(posts)} chat completion requests for 2 messages; logs in {tmp_path}; "
          f"the browser refused: {page.guard.take_blocked() or 'nothing'}")
