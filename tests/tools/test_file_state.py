"""The file tools' per-sample memory (Hermes Agent 0.19.0's): "unchanged" re-reads, the repeat
guard of read_file and search_files, staleness warnings of write_file and patch, and patch's
escalating hint. Real bubblewrap (and plain) sandboxes; files changed from outside through `terminal`."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from hermes_core.sandbox import SandboxSettings
from hermes_core.sandbox.bubblewrap import BubblewrapBackend
from hermes_core.sandbox.local import PlainBackend
from hermes_core.tools import ToolContext, file_state, registry, result_failed


@pytest.fixture(params=["bubblewrap", "plain"])
def ctx(request: pytest.FixtureRequest, tmp_path: Path):
    """The checks go through the sandbox interface only, so they hold on every backend."""
    backend = {"bubblewrap": BubblewrapBackend, "plain": PlainBackend}[request.param]
    with backend(SandboxSettings(state_root=tmp_path / "sandboxes")).open("state", cwd="/app") as sandbox:
        yield ToolContext(sandbox=sandbox, task_id="task-state")


def call(ctx: ToolContext, name: str, **arguments: Any) -> dict[str, Any]:
    return json.loads(registry.call(name, arguments, ctx))


def shell(ctx: ToolContext, command: str) -> None:
    """A change made by the model's own terminal call (which also counts as another tool call)."""
    assert call(ctx, "terminal", command=command)["exit_code"] == 0


def outside(ctx: ToolContext, command: str) -> None:
    """A change made by something else in the sandbox (a background job): no tool call."""
    assert ctx.sandbox.exec(command).exit_code == 0


def test_unchanged_reread_is_short_then_blocked_and_a_change_brings_the_content_back(ctx: ToolContext) -> None:
    call(ctx, "write_file", path="notes.txt", content="one\ntwo\n")
    assert call(ctx, "read_file", path="notes.txt")["content"] == "1|one\n2|two"
    again = call(ctx, "read_file", path="notes.txt")
    assert again == {"status": "unchanged", "message": file_state.UNCHANGED_MESSAGE, "path": "notes.txt",
                     "dedup": True, "content_returned": False}
    assert not result_failed(json.dumps(again))
    blocked = call(ctx, "read_file", path="notes.txt")
    assert blocked["error"].startswith("BLOCKED") and blocked["already_read"] == 3
    # Another range of the same file is another read.
    assert call(ctx, "read_file", path="notes.txt", limit=1)["content"] == "1|one"
    shell(ctx, "cat notes.txt")  # another tool: the block ends, the file is still unchanged
    absolute = f"{ctx.sandbox.cwd}/notes.txt"  # the same file and range, named otherwise
    assert call(ctx, "read_file", path=absolute)["status"] == "unchanged"
    shell(ctx, "echo three >> notes.txt")
    assert call(ctx, "read_file", path="notes.txt")["content"] == "1|one\n2|two\n3|three"
    # The session's own write: the next read returns the content, not "unchanged".
    call(ctx, "write_file", path="notes.txt", content="four\n")
    assert call(ctx, "read_file", path="notes.txt")["content"] == "1|four"


def test_the_same_read_warns_at_3_and_is_blocked_from_4(ctx: ToolContext) -> None:
    call(ctx, "write_file", path="log.txt", content="start\n")
    for n in range(1, 6):
        outside(ctx, f"echo line{n} >> log.txt")  # it changes every time: never "unchanged"
        result = call(ctx, "read_file", path="log.txt")
        if n < 3:
            assert "content" in result and "_warning" not in result
        elif n == 3:
            assert result["content"].endswith("4|line3") and "3 times in a row" in result["_warning"]
        else:
            assert set(result) == {"error", "path", "already_read"} and result["already_read"] == n
            assert result["error"].startswith("BLOCKED")
    # Failed reads count too (Hermes Agent's do); the 3rd error carries the warning.
    errors = [call(ctx, "read_file", path="missing.txt") for _ in range(4)]
    assert [set(e) for e in errors[:2]] == [{"error"}] * 2 and "not found" in errors[0]["error"]
    assert "not found" in errors[2]["error"] and "_warning" in errors[2]
    assert errors[3]["already_read"] == 4


def test_other_calls_reset_the_count_but_memory_and_todo_do_not(ctx: ToolContext) -> None:
    def read() -> dict[str, Any]:
        return call(ctx, "read_file", path="missing.txt")

    read(), read()
    shell(ctx, "true")
    assert "_warning" not in read()  # 1st again
    read()
    call(ctx, "todo", todos=[{"id": "1", "content": "look", "status": "pending"}])
    call(ctx, "memory", action="add", target="memory", content="a note")
    assert "_warning" in read()  # todo and memory are no other work: this is the 3rd in a row
    call(ctx, "read_file", path="missing.txt", offset=2)  # a different read is a different call
    assert "_warning" not in read()


def test_the_same_search_warns_at_3_and_is_blocked_from_4(ctx: ToolContext) -> None:
    call(ctx, "write_file", path="src/a.py", content="needle = 1\n")
    first = call(ctx, "search_files", pattern="needle")
    assert first["total_count"] == 1 and "_warning" not in first
    assert "_warning" not in call(ctx, "search_files", pattern="needle", output_mode="count")  # same key
    third = call(ctx, "search_files", pattern="needle")
    assert third["total_count"] == 1 and "3 times in a row" in third["_warning"]
    blocked = call(ctx, "search_files", pattern="needle")
    assert set(blocked) == {"error", "pattern", "already_searched"} and blocked["already_searched"] == 4
    assert call(ctx, "search_files", pattern="needle", offset=1)["total_count"] == 1  # another page: fresh
    call(ctx, "search_files", pattern="needle")
    call(ctx, "read_file", path="src/a.py")  # a read in between is a different call
    assert "_warning" not in call(ctx, "search_files", pattern="needle")


def test_write_and_patch_warn_when_the_file_changed_since_the_read(ctx: ToolContext) -> None:
    call(ctx, "write_file", path="cfg/app.ini", content="a=1\n")
    call(ctx, "write_file", path="top.txt", content="x\n")
    call(ctx, "read_file", path="cfg/app.ini")
    call(ctx, "read_file", path="top.txt")
    shell(ctx, "echo b=2 >> cfg/app.ini && echo y >> top.txt")
    written = call(ctx, "write_file", path="cfg/app.ini", content="a=3\n")
    assert "cfg/app.ini has changed since you last read it" in written["_warning"]
    assert written["bytes_written"] == 4 and written["dirs_created"] is False
    assert "_warning" not in call(ctx, "write_file", path="cfg/app.ini", content="a=4\n")  # own write
    assert "_warning" in call(ctx, "write_file", path="top.txt", content="z\n")  # no folder part
    shell(ctx, "echo c=5 >> cfg/app.ini")
    patched = call(ctx, "patch", mode="replace", path="cfg/app.ini", old_string="a=4", new_string="a=6")
    assert patched["success"] is True and "has changed" in patched["_warning"]
    assert "_warning" not in call(ctx, "patch", mode="replace", path="cfg/app.ini", old_string="a=6",
                                  new_string="a=7")
    shell(ctx, "echo d=8 >> cfg/app.ini")
    v4a = "*** Begin Patch\n*** Update File: cfg/app.ini\n@@\n-a=7\n+a=9\n*** End Patch"
    assert "has changed" in call(ctx, "patch", mode="patch", patch=v4a)["_warning"]
    assert ctx.sandbox.read_file("cfg/app.ini") == b"a=9\nc=5\nd=8\n"
    # A file never read gets no warning; nor does one merely rewritten with the same bytes.
    assert "_warning" not in call(ctx, "write_file", path="fresh.txt", content="new\n")
    shell(ctx, "printf 'z\\n' > top.txt")
    assert "_warning" not in call(ctx, "write_file", path="top.txt", content="w\n")


def test_repeated_patch_failures_escalate_the_hint_until_a_success(ctx: ToolContext) -> None:
    call(ctx, "write_file", path="app.py", content="x = 1\n")
    hints = []
    for _ in range(4):
        failed = call(ctx, "patch", mode="replace", path="app.py", old_string="y = 2", new_string="y = 3")
        assert "Could not find old_string" in failed["error"]
        hints.append(failed["_hint"])
    assert "read_file" in hints[0] and hints[0] == hints[1]
    assert "Failure number 3 patching 'app.py'" in hints[2] and "Failure number 4" in hints[3]
    assert "write_file" in hints[2]
    # Another kind of failure is not counted; a success starts over.
    missing = registry.call("patch", {"mode": "replace", "path": "nope.py", "old_string": "a",
                                        "new_string": "b"}, ctx)
    assert "_hint" not in json.loads(missing)
    call(ctx, "patch", mode="replace", path="app.py", old_string="x = 1", new_string="y = 2")
    again = call(ctx, "patch", mode="replace", path="app.py", old_string="q", new_string="r")
    assert again["_hint"] == hints[0]


def test_bounds_concurrency_and_the_unchanged_message_as_content(ctx: ToolContext,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_state, "DEDUP_CAP", 2)
    for name in "abc":
        call(ctx, "write_file", path=f"{name}.txt", content=f"{name}\n")
        call(ctx, "read_file", path=f"{name}.txt")
    assert "content" in call(ctx, "read_file", path="a.txt")  # the oldest read was forgotten
    assert call(ctx, "read_file", path="c.txt")["status"] == "unchanged"
    state = ctx.state["files.tracker"]
    assert len(state.dedup) <= 2 and len(state.stub_hits) <= 2
    # The same read twice at once (one message, run concurrently): one reads, one is "unchanged".
    shell(ctx, "echo more >> b.txt")
    results: list[dict[str, Any]] = []
    threads = [threading.Thread(target=lambda: results.append(call(ctx, "read_file", path="b.txt")))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted("content" in r for r in results) == [False, True]
    refused = registry.call("write_file", {"path": "b.txt", "content": file_state.UNCHANGED_MESSAGE + "\n"}, ctx)
    assert "unchanged" in json.loads(refused)["error"] and ctx.sandbox.read_file("b.txt") == b"b\nmore\n"


def test_the_checks_cost_no_extra_sandbox_command(ctx: ToolContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """A re-read is the one file read any read costs; a write to a watched file with a folder part
    checks folder and content in the one command an unwatched write spends on the folder."""
    call(ctx, "write_file", path="dir/f.txt", content="1\n")
    call(ctx, "read_file", path="dir/f.txt")
    used: list[str] = []

    def counted(method: str) -> Any:
        original = getattr(ctx.sandbox, method)

        def run(*args: Any, **kwargs: Any) -> Any:
            used.append(method)
            return original(*args, **kwargs)
        return run

    for method in ("exec", "read_file", "write_file"):
        monkeypatch.setattr(ctx.sandbox, method, counted(method))
    call(ctx, "read_file", path="dir/f.txt")
    assert used == ["read_file"]
    used.clear()
    call(ctx, "write_file", path="dir/f.txt", content="2\n")
    assert used == ["exec", "write_file"]
    used.clear()
    call(ctx, "patch", mode="replace", path="dir/f.txt", old_string="2", new_string="3")
    assert used == ["read_file", "write_file"]
