"""The built-in tools, called through the registry against a real local sandbox."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from hermes_core.sandbox import DEFAULT_COMMAND_TIMEOUT_S, SandboxSettings
from hermes_core.sandbox.bubblewrap import BubblewrapBackend
from hermes_core.sandbox.local import PlainBackend
from hermes_core.tools import TOOLSET_ORDER, ToolContext, registry, result_failed
from hermes_core.tools.backends import BackendError, Service, ToolBackends

NETWORKED = {
    "web": ["web_search", "web_extract"],
    "vision": ["vision_analyze"],
    "image_gen": ["image_generate"],
    "browser": ["browser_navigate", "browser_snapshot", "browser_click", "browser_type", "browser_scroll",
                "browser_back", "browser_press", "browser_get_images", "browser_vision", "browser_console"],
}


@pytest.fixture
def ctx(tmp_path: Path):
    with BubblewrapBackend(SandboxSettings(state_root=tmp_path / "sandboxes")).open("tools", cwd="/app") as sandbox:
        yield ToolContext(sandbox=sandbox, task_id="task-1")


@pytest.fixture
def plain_ctx(tmp_path: Path):
    """On the explicit `plain` backend file tools are confined to the workdir; on `local` the whole
    filesystem the tools see is the sandbox's own, so there is no "outside" to refuse."""
    with PlainBackend(SandboxSettings(state_root=tmp_path / "plain")).open("tools", cwd="/app") as sandbox:
        yield ToolContext(sandbox=sandbox, task_id="task-1")


def call(ctx: ToolContext, name: str, **arguments: Any) -> Any:
    text = registry.call(name, arguments, ctx)
    return json.loads(text)


def error_of(ctx: ToolContext, name: str, **arguments: Any) -> str:
    text = registry.call(name, arguments, ctx)
    assert result_failed(text), text
    return json.loads(text)["error"]


# --- terminal -------------------------------------------------------------------------------------


def test_terminal_runs_in_cwd_and_reports_exit_codes(ctx: ToolContext) -> None:
    result = call(ctx, "terminal", command="pwd")
    assert result == {"output": ctx.sandbox.cwd + "\n", "exit_code": 0}
    failed = call(ctx, "terminal", command="echo oops >&2; exit 2")
    assert failed == {"output": "oops\n", "exit_code": 2}  # a failing command is not a tool error
    assert not result_failed(json.dumps(failed))


def test_terminal_timeout(ctx: ToolContext) -> None:
    started = time.monotonic()
    result = call(ctx, "terminal", command="echo begin; sleep 100", timeout=1)
    assert time.monotonic() - started < 3.5
    assert result == {"output": "begin\n", "exit_code": None, "timed_out": True}
    assert call(ctx, "terminal", command="echo again")["exit_code"] == 0
    assert "timeout" in error_of(ctx, "terminal", command="true", timeout=0)


def test_terminal_truncates_long_output(ctx: ToolContext) -> None:
    result = call(ctx, "terminal", command="seq 1 200000")
    assert result["truncated"] is True and result["exit_code"] == 0
    assert result["output"].startswith("1\n2\n") and result["output"].endswith("200000\n")


def test_background_process_lifecycle(ctx: ToolContext) -> None:
    started = call(ctx, "terminal", command="echo serving; sleep 100", background=True)
    assert started == {"process_id": 1, "status": "started"}
    deadline = time.monotonic() + 10
    while "serving" not in (polled := call(ctx, "process", action="poll", process_id=1))["output"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert polled["status"] == "running" and polled["exit_code"] is None
    listed = call(ctx, "process", action="list")["processes"]
    assert listed == [{"process_id": 1, "command": "echo serving; sleep 100", "status": "running", "exit_code": None}]
    killed = call(ctx, "process", action="kill", process_id=1)
    assert killed["status"] == "exited" and killed["exit_code"] == 143
    assert "process_id is required" in error_of(ctx, "process", action="poll")
    assert "no background process 7" in error_of(ctx, "process", action="kill", process_id=7)


# --- files ----------------------------------------------------------------------------------------


def test_write_then_read(ctx: ToolContext) -> None:
    written = call(ctx, "write_file", path="pkg/data.txt", content="one\ntwo\nthree\nfour\n")
    assert written == {"path": str(Path(ctx.sandbox.cwd) / "pkg" / "data.txt"), "bytes_written": 19}
    full = call(ctx, "read_file", path="pkg/data.txt")
    assert full["content"] == "one\ntwo\nthree\nfour\n" and full["total_lines"] == 4 and "next_offset" not in full
    page = call(ctx, "read_file", path=written["path"], offset=1, limit=2)
    assert page["content"] == "two\nthree\n" and page["total_lines"] == 4 and page["next_offset"] == 3
    assert "past the end" in error_of(ctx, "read_file", path="pkg/data.txt", offset=10)
    assert call(ctx, "terminal", command="cat pkg/data.txt")["output"] == "one\ntwo\nthree\nfour\n"


def test_read_file_errors(ctx: ToolContext, plain_ctx: ToolContext) -> None:
    assert "not found" in error_of(ctx, "read_file", path="nope.txt")
    ctx.sandbox.write_file("blob.bin", b"\x89PNG\r\n\x1a\n\x00\x00binary")
    assert "binary" in error_of(ctx, "read_file", path="blob.bin")
    assert "outside the sandbox" in error_of(plain_ctx, "read_file", path="/etc/passwd")
    assert "missing required argument(s) ['path']" in error_of(ctx, "read_file")


def test_write_file_refuses_escapes(plain_ctx: ToolContext) -> None:
    assert "outside the sandbox" in error_of(plain_ctx, "write_file", path="../../../escape.txt", content="x")
    assert "outside the sandbox" in error_of(plain_ctx, "write_file", path="/tmp/hermes-escape.txt", content="x")
    assert not Path("/tmp/hermes-escape.txt").exists()


def test_patch(ctx: ToolContext) -> None:
    call(ctx, "write_file", path="app.py", content="x = 1\ny = 1\nprint(x)\n")
    assert call(ctx, "patch", path="app.py", old_string="print(x)", new_string="print(x + y)")["replacements"] == 1
    assert "2 times" in error_of(ctx, "patch", path="app.py", old_string="= 1", new_string="= 2")
    assert "not found" in error_of(ctx, "patch", path="app.py", old_string="z = 3", new_string="z = 4")
    assert call(ctx, "patch", path="app.py", old_string="= 1", new_string="= 2", replace_all=True)["replacements"] == 2
    assert call(ctx, "read_file", path="app.py")["content"] == "x = 2\ny = 2\nprint(x + y)\n"
    assert call(ctx, "terminal", command="python3 app.py")["output"] == "4\n"


def test_search_content_and_filenames(ctx: ToolContext) -> None:
    call(ctx, "write_file", path="src/main.py", content="def main():\n    return helper()\n")
    call(ctx, "write_file", path="src/util.py", content="def helper():\n    return 42\n")
    call(ctx, "write_file", path="notes.md", content="call helper() first\n")
    found = call(ctx, "search_files", pattern=r"def \w+\(")
    assert sorted((m["path"], m["line"], m["text"]) for m in found["matches"]) == [
        ("./src/main.py", 1, "def main():"), ("./src/util.py", 1, "def helper():")]
    only_md = call(ctx, "search_files", pattern="helper", glob="*.md")
    assert only_md["matches"] == [{"path": "./notes.md", "line": 1, "text": "call helper() first"}]
    in_folder = call(ctx, "search_files", pattern="return", path="src/util.py")
    assert in_folder["matches"] == [{"path": "src/util.py", "line": 2, "text": "    return 42"}]
    assert call(ctx, "search_files", pattern="no such text anywhere") == {"matches": [], "count": 0}
    files = call(ctx, "search_files", pattern="*.py", target="filename")
    assert files == {"files": ["./src/main.py", "./src/util.py"], "count": 2}
    assert call(ctx, "search_files", pattern="util", target="filename")["files"] == ["./src/util.py"]
    assert "search failed" in error_of(ctx, "search_files", pattern="(unclosed")
    assert "search failed" in error_of(ctx, "search_files", pattern="x", path="missing-dir")


def test_search_results_are_capped(ctx: ToolContext) -> None:
    call(ctx, "write_file", path="many.txt", content="match\n" * 500)
    result = call(ctx, "search_files", pattern="match")
    assert result["count"] == 100 and len(result["matches"]) == 100 and result["truncated"] is True


# --- code execution -------------------------------------------------------------------------------


def test_execute_code_separates_streams(ctx: ToolContext) -> None:
    code = "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\nsys.exit(3)\n"
    result = call(ctx, "execute_code", code=code)
    assert result == {"stdout": "to stdout\n", "stderr": "to stderr\n", "exit_code": 3}
    assert ".hermes_exec" not in call(ctx, "terminal", command="ls -A")["output"]  # cwd is a sandbox path


def test_execute_code_imports_from_cwd_and_keeps_files(ctx: ToolContext) -> None:
    call(ctx, "write_file", path="helpers.py", content="def answer():\n    return 42\n")
    result = call(ctx, "execute_code", code="import helpers\nopen('out.txt', 'w').write(str(helpers.answer()))")
    assert result["exit_code"] == 0 and result["stderr"] == ""
    assert call(ctx, "read_file", path="out.txt")["content"] == "42"
    crashed = call(ctx, "execute_code", code="raise ValueError('boom')")
    assert crashed["exit_code"] == 1 and "ValueError: boom" in crashed["stderr"]


def test_execute_code_timeout(ctx: ToolContext) -> None:
    started = time.monotonic()
    result = call(ctx, "execute_code", code="import time\nprint('start')\ntime.sleep(100)", timeout=1)
    assert time.monotonic() - started < 4
    assert result["timed_out"] is True and result["exit_code"] is None and result["stdout"] == "start\n"


# --- memory and todo ------------------------------------------------------------------------------


def test_memory_flow(ctx: ToolContext) -> None:
    assert call(ctx, "memory", action="read") == {"notes": [], "count": 0}
    call(ctx, "memory", action="add", content="tests live in tests/")
    call(ctx, "memory", action="add", content="the bug is in parser.py")
    replaced = call(ctx, "memory", action="replace", old_content="parser.py", content="the bug is in lexer.py")
    assert replaced["notes"] == ["tests live in tests/", "the bug is in lexer.py"]
    assert call(ctx, "memory", action="remove", old_content="tests live")["notes"] == ["the bug is in lexer.py"]
    assert ctx.state["memory"] == ["the bug is in lexer.py"]
    assert "content is required" in error_of(ctx, "memory", action="add")
    assert "old_content is required" in error_of(ctx, "memory", action="remove")
    assert "no note contains" in error_of(ctx, "memory", action="remove", old_content="nothing like this")
    call(ctx, "memory", action="add", content="the bug is also in lexer tests")
    assert "2 notes contain" in error_of(ctx, "memory", action="remove", old_content="the bug")


def test_todo_flow(ctx: ToolContext) -> None:
    assert call(ctx, "todo", action="list")["todos"] == []
    call(ctx, "todo", action="add", content="reproduce the bug")
    added = call(ctx, "todo", action="add", content="write a fix", status="in_progress")
    assert added["todos"] == [
        {"id": 1, "content": "reproduce the bug", "status": "pending"},
        {"id": 2, "content": "write a fix", "status": "in_progress"},
    ]
    updated = call(ctx, "todo", action="update", item_id=1, status="done")
    assert updated["todos"][0]["status"] == "done"
    assert updated["counts"] == {"pending": 0, "in_progress": 1, "done": 1}
    removed = call(ctx, "todo", action="remove", item_id=1)
    assert [item["id"] for item in removed["todos"]] == [2]
    assert call(ctx, "todo", action="add", content="run tests")["todos"][-1]["id"] == 3  # ids are not reused
    assert "no task with item_id 9" in error_of(ctx, "todo", action="update", item_id=9, status="done")
    assert "item_id is required" in error_of(ctx, "todo", action="remove")
    assert "status must be one of" in error_of(ctx, "todo", action="update", item_id=2, status="finished")
    assert call(ctx, "todo", action="clear")["todos"] == [] and ctx.state["todo"] == []


# --- registry, schemas and networked tools --------------------------------------------------------


def test_toolsets_and_universe_order() -> None:
    assert list(registry.toolsets) == TOOLSET_ORDER
    assert registry.toolsets["terminal"] == ["terminal", "process"]
    assert registry.toolsets["file"] == ["read_file", "write_file", "patch", "search_files"]
    assert registry.toolsets["code_execution"] == ["execute_code"]
    for toolset, names in NETWORKED.items():
        assert registry.toolsets[toolset] == names
    assert registry.universe[-2:] == ["memory", "todo"]
    assert {name for name in registry.universe if registry.get(name).read_only} >= {"read_file", "search_files"}
    assert not registry.get("write_file").read_only and not registry.get("terminal").read_only


def test_networked_tools_are_offered_only_with_their_backend(ctx: ToolContext) -> None:
    offered = {tool.name for tool in registry.available(TOOLSET_ORDER, ToolBackends())}
    assert offered == {"terminal", "process", "read_file", "write_file", "patch", "search_files", "execute_code",
                       "memory", "todo"}
    for toolset, names in NETWORKED.items():
        for name in names:
            tool = registry.get(name)
            assert name in registry.universe and tool.description
            assert tool.unavailable_reason(ToolBackends()) is not None
    configured = ToolBackends(web_search_url="http://127.0.0.1:9", image=Service("http://127.0.0.1:9", "k", "m"),
                              browser_executable="/usr/bin/chromium")
    offered = {tool.name for tool in registry.available(list(NETWORKED), configured)}
    # browser_vision also needs the vision backend.
    assert offered == {"web_search", "web_extract", "image_generate"} | set(NETWORKED["browser"]) - {"browser_vision"}
    assert "HERMES_WEB_SEARCH_URL" in error_of(ctx, "web_search", query="hermes")


def test_tool_backend_settings_are_checked() -> None:
    env = {"HERMES_WEB_SEARCH_URL": "http://127.0.0.1:8888/", "HERMES_VISION_BASE_URL": "http://127.0.0.1:1/v1"}
    backends = ToolBackends.resolve({"HERMES_VISION_MODEL": "llava"}, env)
    assert backends.web_search_url == "http://127.0.0.1:8888" and backends.vision.model == "llava"
    assert backends.image is None and backends.unavailable("image_gen") and not backends.unavailable("web")
    with pytest.raises(BackendError, match="HERMES_WEB_SERCH_URL"):
        ToolBackends.resolve({"HERMES_WEB_SERCH_URL": "x"}, {})
    with pytest.raises(BackendError, match="expected an http"):
        ToolBackends.resolve(None, {"HERMES_WEB_SEARCH_URL": "127.0.0.1:8888"})
    with pytest.raises(BackendError, match="private address"):
        ToolBackends().check_reachable("http://169.254.169.254/latest/meta-data")
    with pytest.raises(BackendError, match="only http"):
        ToolBackends(web_allow_private=True).check_reachable("file:///etc/passwd")


def test_derived_schemas() -> None:
    terminal = registry.get("terminal").parameters
    assert terminal["required"] == ["command"]
    assert terminal["properties"]["timeout"]["type"] == "integer"
    assert terminal["properties"]["background"]["type"] == "boolean"
    assert terminal["properties"]["command"]["description"].startswith("The shell command line")
    # The documented default timeout is the sandbox's real one.
    assert f"default {int(DEFAULT_COMMAND_TIMEOUT_S)}" in terminal["properties"]["timeout"]["description"]
    assert registry.get("process").parameters["properties"]["action"]["enum"] == ["list", "poll", "kill"]
    search = registry.get("search_files").parameters
    assert search["required"] == ["pattern"] and search["properties"]["target"]["enum"] == ["content", "filename"]
    assert registry.get("patch").parameters["required"] == ["path", "old_string", "new_string"]
    todo = registry.get("todo").parameters["properties"]
    assert todo["action"]["enum"] == ["add", "update", "remove", "list", "clear"]
    assert todo["status"]["enum"] == ["pending", "in_progress", "done"]
    assert registry.get("memory").parameters["properties"]["action"]["enum"] == ["add", "replace", "remove", "read"]
    assert registry.get("web_extract").parameters["properties"]["urls"] == {
        "type": "array", "items": {"type": "string"}, "description": "The http(s) URLs of the pages to read."}
    assert registry.get("browser_scroll").parameters["properties"]["direction"]["enum"] == ["up", "down"]
    assert registry.get("browser_snapshot").parameters == {"type": "object", "properties": {}, "required": []}
    for name in registry.universe:
        definition = registry.get(name).definition()
        assert definition["description"] and "Args:" not in definition["description"]
        assert "ctx" not in definition["parameters"]["properties"]
        for prop, schema in definition["parameters"]["properties"].items():
            assert schema.get("description"), f"{name}.{prop} has no description"
            assert re.fullmatch(r"[a-z_]+", prop)
