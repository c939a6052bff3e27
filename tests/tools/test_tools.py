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
    # web_search too, as in Hermes Agent (offered when a web backend is configured).
    "browser": ["browser_navigate", "browser_snapshot", "browser_click", "browser_type", "browser_scroll",
                "browser_back", "browser_press", "browser_get_images", "browser_vision", "browser_console",
                "web_search"],
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


# --- files ----------------------------------------------------------------------------------------


def test_write_then_read(ctx: ToolContext) -> None:
    written = call(ctx, "write_file", path="pkg/data.txt", content="one\ntwo\nthree\nfour\n")
    assert written["resolved_path"] == str(Path(ctx.sandbox.cwd) / "pkg" / "data.txt") and written["bytes_written"] == 19
    full = call(ctx, "read_file", path="pkg/data.txt")
    assert full["content"] == "1|one\n2|two\n3|three\n4|four" and full["total_lines"] == 4 and not full["truncated"]
    page = call(ctx, "read_file", path=written["resolved_path"], offset=2, limit=2)
    assert page["content"] == "2|two\n3|three" and page["total_lines"] == 4 and "offset=4" in page["hint"]
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
    assert "Could not find" in error_of(ctx, "patch", path="app.py", old_string="z = 3", new_string="z = 4")
    assert call(ctx, "patch", path="app.py", old_string="= 1", new_string="= 2", replace_all=True)["replacements"] == 2
    assert call(ctx, "read_file", path="app.py")["content"] == "1|x = 2\n2|y = 2\n3|print(x + y)"
    assert call(ctx, "terminal", command="python3 app.py")["output"] == "4\n"


# --- memory and todo ------------------------------------------------------------------------------


def test_memory_keeps_its_two_targets_apart(ctx: ToolContext) -> None:
    added = call(ctx, "memory", action="add", target="memory", content="tests live in tests/")
    assert added["success"] is True and added["target"] == "memory" and added["entry_count"] == 1
    assert added["usage"] == "0% — 20/2,200 chars" and "current_entries" not in added  # a write lists nothing
    call(ctx, "memory", action="add", target="memory", content="the bug is in parser.py")
    about_user = call(ctx, "memory", action="add", target="user", content="prefers short answers")
    assert about_user["target"] == "user" and about_user["entry_count"] == 1 and about_user["usage"].endswith("/1,375 chars")
    assert call(ctx, "memory", action="add", target="memory", content="tests live in tests/")["entry_count"] == 2
    call(ctx, "memory", action="replace", target="memory", old_text="parser.py", content="the bug is in lexer.py")
    call(ctx, "memory", action="remove", target="memory", old_text="tests live")
    assert ctx.state["memory"] == {"memory": ["the bug is in lexer.py"], "user": ["prefers short answers"]}
    # The user store has no such entry: the other store is not searched.
    missed = call(ctx, "memory", action="remove", target="user", old_text="lexer")
    assert missed["success"] is False and "no entry contains 'lexer'" in missed["error"]
    assert missed["current_entries"] == ["prefers short answers"]
    assert "missing required argument(s) ['target']" in error_of(ctx, "memory", action="add", content="x")
    assert "target must be 'memory' or 'user'" in error_of(ctx, "memory", action="add", target="notes", content="x")


def test_memory_refusals_change_nothing(ctx: ToolContext) -> None:
    def refused(**arguments: Any) -> str:
        text = registry.call("memory", {"target": "memory", **arguments}, ctx)
        assert result_failed(text), text
        return json.loads(text)["error"]

    assert "content is required for add" in refused(action="add")
    assert "old_text is required for remove" in refused(action="remove")
    call(ctx, "memory", action="add", target="memory", content="the bug is in lexer.py")
    call(ctx, "memory", action="add", target="memory", content="the bug is also in lexer tests")
    assert "2 different entries contain 'the bug'" in refused(action="remove", old_text="the bug")
    assert "more than its 2,200" in refused(action="add", content="x" * 2200)
    # Operations: all or none, the budget checked once at the end.
    assert "operation 2: no entry contains 'nothing'" in refused(operations=[
        {"action": "add", "content": "kept? no"}, {"action": "remove", "old_text": "nothing"}])
    assert ctx.state["memory"]["memory"] == ["the bug is in lexer.py", "the bug is also in lexer tests"]
    done = call(ctx, "memory", target="memory", operations=[
        {"action": "remove", "old_text": "also"}, {"action": "replace", "old_text": "lexer.py", "content": "y" * 2000},
        {"action": "add", "content": "z" * 150}])
    assert done["success"] is True and done["entry_count"] == 2


def test_todo_writes_replace_or_merge_the_list(ctx: ToolContext) -> None:
    assert call(ctx, "todo") == {"todos": [], "summary": {"total": 0, "pending": 0, "in_progress": 0,
                                                          "completed": 0, "cancelled": 0}}
    plan = [{"id": "1", "content": "reproduce the bug", "status": "in_progress"},
            {"id": "2", "content": "write a fix", "status": "pending"},
            {"id": "3", "content": "run tests", "status": "pending"}]
    assert call(ctx, "todo", todos=plan)["todos"] == plan
    # merge=true: known ids get the fields given, new ids are appended, the others stay as they were.
    merged = call(ctx, "todo", todos=[{"id": "1", "status": "completed"}, {"id": "2", "content": "write the fix",
                                                                           "status": "in_progress"},
                                      {"id": "4", "content": "open a PR", "status": "pending"}], merge=True)
    assert merged["todos"] == [{"id": "1", "content": "reproduce the bug", "status": "completed"},
                               {"id": "2", "content": "write the fix", "status": "in_progress"},
                               {"id": "3", "content": "run tests", "status": "pending"},
                               {"id": "4", "content": "open a PR", "status": "pending"}]
    assert merged["summary"] == {"total": 4, "pending": 2, "in_progress": 1, "completed": 1, "cancelled": 0}
    assert call(ctx, "todo")["todos"] == merged["todos"]  # no todos: a read
    # merge=false (the default): the given list is the whole list; an unknown status becomes pending.
    replaced = call(ctx, "todo", todos=[{"id": "9", "content": "start over", "status": "finished"},
                                        {"id": "8", "content": "drop it", "status": "cancelled"}])
    assert replaced["todos"] == [{"id": "9", "content": "start over", "status": "pending"},
                                 {"id": "8", "content": "drop it", "status": "cancelled"}]
    assert replaced["summary"]["total"] == 2 and replaced["summary"]["cancelled"] == 1
    assert call(ctx, "todo", todos=json.dumps([{"id": "a", "content": "as a string", "status": "pending"}]))[
        "todos"] == [{"id": "a", "content": "as a string", "status": "pending"}]
    assert "todos must be a list" in error_of(ctx, "todo", todos={"id": "1"})
    assert call(ctx, "todo", todos=[])["todos"] == [] and ctx.state["todo"] == []


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
    browser_only = ToolBackends(browser_executable="/usr/bin/chromium")
    offered = [tool.name for tool in registry.available(["web", "browser"], browser_only)]
    assert "web_search" not in offered and "browser_navigate" in offered
    with_web = [tool.name for tool in registry.available(["web", "browser"], configured)]
    assert with_web.count("web_search") == 1  # a tool of two toolsets is offered once


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
    assert registry.get("process").parameters["properties"]["action"]["enum"] == [
        "list", "poll", "log", "wait", "kill", "write", "submit", "close"]
    search = registry.get("search_files").parameters
    assert search["required"] == ["pattern"] and search["properties"]["target"]["enum"] == ["content", "files"]
    assert registry.get("patch").parameters["required"] == ["mode"]
    todo = registry.get("todo").parameters
    assert "required" not in todo and todo["properties"]["merge"]["default"] is False
    assert todo["properties"]["todos"]["items"]["properties"]["status"]["enum"] == [
        "pending", "in_progress", "completed", "cancelled"]
    memory = registry.get("memory").parameters
    assert memory["required"] == ["target"] and memory["properties"]["action"]["enum"] == ["add", "replace", "remove"]
    assert registry.get("web_extract").parameters["properties"]["urls"]["maxItems"] == 5
    assert registry.get("browser_scroll").parameters["properties"]["direction"]["enum"] == ["up", "down"]
    assert registry.get("browser_back").parameters == {"type": "object", "properties": {}}  # no `required`
    for name in registry.universe:
        definition = registry.get(name).definition()
        assert definition["description"] and "Args:" not in definition["description"]
        assert "ctx" not in definition["parameters"]["properties"]
        for prop, schema in definition["parameters"]["properties"].items():
            assert schema.get("description"), f"{name}.{prop} has no description"
            assert re.fullmatch(r"[a-z_]+", prop)
