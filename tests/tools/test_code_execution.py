"""`execute_code` against real sandboxes: programs that call the session's tools through
`from hermes_tools import ...`, the channel's defences (names, budget, garbage, a program dying in the
middle of a call), exact stdout, the time limit, and the same program on every backend."""

from __future__ import annotations

import importlib
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from contract_backends import BACKENDS
from hermes_core.sandbox import SandboxSettings
from hermes_core.sandbox.base import SandboxFailed
from hermes_core.sandbox.bubblewrap import BubblewrapBackend
from hermes_core.sandbox.local import PlainBackend
from hermes_core.tools import ToolContext, registry, result_failed
from hermes_core.tools import code as code_tool
from hermes_core.tools import code_rpc
from hermes_core.tools.backends import ToolBackends
from procs import open_fds
from web_servers import searx, site  # noqa: F401  (fixtures)

OFFERED = frozenset({"terminal", "process", "read_file", "write_file", "execute_code"})


@pytest.fixture
def ctx(tmp_path: Path):
    with BubblewrapBackend(SandboxSettings(state_root=tmp_path / "sandboxes")).open("code", cwd="/app") as sandbox:
        yield ToolContext(sandbox=sandbox, task_id="task-1", offered=OFFERED)


def run(ctx: ToolContext, code: str) -> dict[str, Any]:
    return json.loads(registry.call("execute_code", {"code": code}, ctx))


def leftovers(ctx: ToolContext) -> str:
    return json.loads(registry.call("terminal", {"command": "ls -A"}, ctx))["output"]


TOOLS_PROGRAM = """
from hermes_tools import terminal, write_file, read_file
written = write_file("notes/plan.txt", "first\\nsecond\\n")
page = read_file("notes/plan.txt")
counted = terminal("wc -l < notes/plan.txt && pwd")
print(type(written).__name__, written.get("error"))
print(page["total_lines"], "second" in page["content"])
print(repr(counted["output"]), counted["exit_code"])
"""


def test_a_program_calls_the_sessions_tools(ctx: ToolContext) -> None:
    result = run(ctx, TOOLS_PROGRAM)
    assert result["output"] == "dict None\n2 True\n'2\\n/app\\n' 0\n", result
    assert (result["status"], result["exit_code"], result["tool_calls_made"]) == ("success", 0, 3)
    assert result["stdout_truncated"] is False and result["stdout_bytes_total"] == len(result["output"])
    assert ctx.sandbox.read_file("notes/plan.txt") == b"first\nsecond\n"  # the same sandbox as the session's
    assert ".hermes_exec" not in leftovers(ctx)


def test_tools_the_session_does_not_offer_are_refused(ctx: ToolContext) -> None:
    program = """
import hermes_tools
try:
    from hermes_tools import web_search
except ImportError as exc:
    print("import:", exc)
print(hermes_tools._call("web_search", {"query": "x"})["error"])
print(hermes_tools._call("process", {"action": "list"})["error"])
print(hermes_tools._call("execute_code", {"code": "print(1)"})["error"])
"""
    result = run(ctx, program)
    lines = result["output"].splitlines()
    assert lines[0] == ("import: web_search is not offered in this session, so programs cannot call it either; "
                        "hermes_tools has: read_file, terminal, write_file")
    assert lines[1] == ("tool 'web_search' cannot be called from execute_code in this session "
                        "(callable: read_file, terminal, write_file)")
    # Offered to the model, but not a tool programs may call (as in the original: 7 sandbox tools).
    assert "'process' cannot be called" in lines[2] and "'execute_code' cannot be called" in lines[3]
    assert result["tool_calls_made"] == 0 and result["status"] == "success"


def test_arguments_are_checked_by_the_tool_itself(ctx: ToolContext) -> None:
    program = """
import hermes_tools
from hermes_tools import read_file, terminal
print(read_file("missing.txt")["error"][:40])
print(hermes_tools._call("read_file", {"path": "a", "colour": "red"})["error"])
print(hermes_tools._call("write_file", ["not", "an", "object"])["error"])
print(terminal("sleep 5; echo late", timeout=1).get("timed_out"))
print(hermes_tools._call("terminal", {"command": "echo fg", "background": True})["output"])
"""
    result = run(ctx, program)
    lines = result["output"].splitlines()
    assert "missing.txt" in lines[0]
    assert lines[1] == "read_file: unknown argument(s) ['colour']"
    assert lines[2] == "write_file: the arguments must be a JSON object"
    assert lines[3] == "True"  # the tool's own timeout argument works
    assert lines[4] == "fg"  # background is dropped: programs run commands in the foreground only
    assert result["tool_calls_made"] == 4  # refused shapes are not calls; the tools' own refusals are


def test_the_51st_call_is_refused(ctx: ToolContext) -> None:
    program = """
from hermes_tools import terminal
results = [terminal("echo %d" % i) for i in range(51)]
print(sum(r["output"] == "%d\\n" % i for i, r in enumerate(results[:50])), results[50]["error"])
"""
    result = run(ctx, program)
    assert result["output"] == ("50 this program has already made 50 tool calls, the most one execute_code run "
                                "may make; no further calls are carried out\n"), result
    assert result["tool_calls_made"] == 50


def test_garbage_on_the_channel_is_answered_and_the_parent_stays_healthy(ctx: ToolContext) -> None:
    program = r"""
import json, os, time
import hermes_tools
rpc = hermes_tools._RPC_DIR
os.makedirs(rpc)
def answer(number):
    return json.loads(hermes_tools._answer(os.path.join(rpc, "res_%06d" % number), "test"))["error"]
def send(number, payload):
    with open(os.path.join(rpc, "req_%06d" % number), "wb") as handle:
        handle.write(payload)
    return answer(number)
print(send(1, b"\xff\xfe not json"))
print(send(2, b"[1, 2, 3]"))
print(send(3, b"[" * 200000))
os.makedirs(os.path.join(rpc, "req_000004"))  # a folder where a request belongs
print(answer(4))
print(send(5, b'{"tool": "terminal", "args": {"command": 7}}'))
hermes_tools._sequence[0] = 5
print(hermes_tools.terminal("echo still served")["output"], end="")
"""
    result = run(ctx, program)
    lines = result["output"].splitlines()
    assert lines[0].startswith("invalid request (not JSON)")
    assert lines[1] == 'invalid request: expected {"tool": NAME, "args": {...}}'
    assert lines[2].startswith("invalid request (not JSON)")  # nested too deep to parse
    assert lines[3].startswith("unreadable request")
    assert lines[4].startswith("TypeError"), result  # a tool that chokes on its arguments
    assert lines[5] == "still served", result  # the channel carried on after the garbage
    assert result["status"] == "success"


def test_a_program_that_dies_in_a_call_or_never_reads_its_answer(ctx: ToolContext) -> None:
    dies = """
import os, threading
from hermes_tools import terminal
threading.Timer(0.5, lambda: os._exit(3)).start()
print("calling", flush=True)
terminal("sleep 3")
"""
    started = time.monotonic()
    result = run(ctx, dies)
    assert time.monotonic() - started < 10
    assert (result["status"], result["exit_code"], result["output"]) == ("error", 3, "calling\n")
    assert result["tool_calls_made"] == 1
    # A request left behind by a program that exits at once is never answered, and holds nothing up.
    abandoned = """
import json, os
import hermes_tools
os.makedirs(hermes_tools._RPC_DIR)
with open(os.path.join(hermes_tools._RPC_DIR, "req_000001"), "w") as handle:
    json.dump({"tool": "terminal", "args": {"command": "sleep 3"}}, handle)
"""
    started = time.monotonic()
    assert run(ctx, abandoned)["status"] == "success"
    assert time.monotonic() - started < 20
    assert run(ctx, TOOLS_PROGRAM)["tool_calls_made"] == 3  # the next run is served as usual
    assert ".hermes_exec" not in leftovers(ctx)


def test_stdout_is_exactly_what_the_program_printed(ctx: ToolContext) -> None:
    program = """
import os, sys
from hermes_tools import terminal
sys.stdout.write("héllo  ")
print("\\tworld", flush=True)
print("to stderr", file=sys.stderr)
terminal("echo via a tool")
os.system("echo from a child")
sys.stdout.write("no newline at the end")
"""
    result = run(ctx, program)
    assert result["output"] == "héllo  \tworld\nfrom a child\nno newline at the end"
    assert result["stdout_bytes_total"] == len(result["output"].encode())
    assert "error" not in result  # stderr only shows when the program failed, as in the original


def test_failures_show_stderr(ctx: ToolContext) -> None:
    code = "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\nsys.exit(3)\n"
    result = run(ctx, code)
    assert (result["status"], result["exit_code"], result["error"]) == ("error", 3, "to stderr\n")
    assert result["output"] == "to stdout\n\n--- stderr ---\nto stderr\n"
    assert run(ctx, "import os\nos._exit(4)")["error"] == "The program ended with exit code 4."
    crashed = run(ctx, "raise ValueError('boom')")
    assert crashed["exit_code"] == 1 and "ValueError: boom" in crashed["error"]
    assert "error" in json.loads(registry.call("execute_code", {"code": "  "}, ctx))
    assert ".hermes_exec" not in leftovers(ctx)


def test_imports_from_cwd_and_keeps_files(ctx: ToolContext) -> None:
    ctx.sandbox.write_file("helpers.py", b"def answer():\n    return 42\n")
    result = run(ctx, "import helpers\nopen('out.txt', 'w').write(str(helpers.answer()))")
    assert result["status"] == "success" and result["output"] == ""
    assert ctx.sandbox.read_file("out.txt") == b"42"
    # A file of the task named like the module does not replace it.
    ctx.sandbox.write_file("hermes_tools.py", b"raise SystemExit('shadowed')\n")
    assert run(ctx, "from hermes_tools import terminal\nprint(terminal('echo ok')['output'], end='')")["output"] == "ok\n"


def test_long_stdout_keeps_its_head_and_tail(ctx: ToolContext) -> None:
    result = run(ctx, "print('a' * 30000)\nprint('b' * 40000)")
    assert result["stdout_truncated"] is True and result["stdout_bytes_total"] == 70002
    assert result["stdout_bytes_captured"] == 50000 and result["stdout_bytes_omitted"] == 20002
    assert result["output"].startswith("a" * 20000) and result["output"].endswith("b" * 29999 + "\n")
    assert "20,002 of 70,002 bytes left out" in result["output"] and result["warning"]


def test_timeout_kills_the_program_and_bounds_its_tool_calls(ctx: ToolContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model cannot choose the timeout (there is no such argument); the tool's own one applies, and
    a tool call in flight when it passes ends with it."""
    monkeypatch.setattr(code_tool, "TIMEOUT_S", 2)
    assert "unknown argument(s) ['timeout']" in json.loads(
        registry.call("execute_code", {"code": "print(1)", "timeout": 5}, ctx))["error"]
    started = time.monotonic()
    result = run(ctx, "import time\nprint('start')\ntime.sleep(100)")
    assert time.monotonic() - started < 6
    assert (result["status"], result["exit_code"]) == ("timeout", 124)
    assert result["output"].startswith("start\n\n") and result["error"] in result["output"]
    started = time.monotonic()
    result = run(ctx, "from hermes_tools import terminal\nprint('start', flush=True)\nterminal('sleep 100')")
    assert time.monotonic() - started < 8, result
    assert result["status"] == "timeout" and result["tool_calls_made"] == 1
    assert ".hermes_exec" not in leftovers(ctx)


def test_a_context_without_the_offered_list_allows_the_configured_sandbox_tools(ctx: ToolContext) -> None:
    unknown = ToolContext(sandbox=ctx.sandbox, task_id="task-1")  # e.g. a library caller's own context
    program = "import hermes_tools\nprint(hermes_tools._OFFERED)"
    assert run(unknown, program)["output"] == "('patch', 'read_file', 'search_files', 'terminal', 'write_file')\n"


def test_web_tools_from_a_program_follow_the_sessions_web_policy(ctx: ToolContext, searx: str, site: str) -> None:
    program = f"""
from hermes_tools import web_search, web_extract
found = web_search("foundry", limit=1)
url = found["results"][0]["url"]
extracted = web_extract([url])
page = (extracted.get("pages") or [extracted])[0]
print(url == {site + "/index.html"!r}, "text" if "Hermes Foundry" in (page.get("content") or "") else page["error"])
"""
    offered = OFFERED | {"web_search", "web_extract"}
    trusting = ToolContext(sandbox=ctx.sandbox, task_id="task-1", offered=offered,
                           backends=ToolBackends(web_search_url=searx, web_allow_private=True))
    assert run(trusting, program)["output"] == "True text\n"
    # The same program in a session whose policy refuses private addresses: refused inside it too.
    strict = ToolContext(sandbox=ctx.sandbox, task_id="task-1", offered=offered,
                         backends=ToolBackends(web_search_url=searx))
    refused = run(strict, program)["output"]
    assert refused.startswith("True ") and "text" not in refused and "127.0.0.1" in refused, refused


# --- every backend --------------------------------------------------------------------------------


@pytest.fixture(params=[*BACKENDS, "plain"])
def backend_ctx(request, tmp_path: Path):
    """The sandbox contract's backends (tests/contract_backends: real docker, modal and singularity
    through their fakes) and the explicit `plain` one."""
    if request.param == "plain":
        backend, image = PlainBackend(SandboxSettings(state_root=tmp_path / "plain")), None
    else:
        contract = importlib.import_module(f"contract_backends.{request.param}")
        backend, image = contract.make_backend(tmp_path), contract.IMAGE
    try:
        sandbox = backend.open(f"code-{uuid.uuid4().hex[:8]}", image, None)
        try:
            yield ToolContext(sandbox=sandbox, task_id="task-1", offered=OFFERED)
        finally:
            sandbox.close()
    finally:
        backend.close()


# A FIFO where a request belongs held the parent's read (60 s, on `plain` for good); a 9 MiB request
# was read whole, and its terminal call, over the exec server's 8 MiB cap, failed the sandbox.
HOSTILE_REQUESTS = """
import json, os
import hermes_tools
from hermes_tools import terminal
rpc = hermes_tools._RPC_DIR
os.makedirs(rpc)
os.mkfifo(os.path.join(rpc, "req_000001"))
print(json.loads(hermes_tools._answer(os.path.join(rpc, "res_000001"), "test"))["error"])
hermes_tools._sequence[0] = 1
print(terminal("echo " + "x" * (9 << 20)).get("error"))
print(terminal("echo still served")["output"], end="")
"""


@pytest.mark.timeout(150)
def test_hostile_request_files_are_answered_at_once(backend_ctx: ToolContext) -> None:
    result = run(backend_ctx, HOSTILE_REQUESTS)
    lines = result["output"].splitlines()
    assert len(lines) == 3, result
    assert lines[0].startswith("unreadable request (a request is a regular file of at most 1 MiB): ")
    assert lines[0].endswith("is not a regular file (a FIFO, socket or device); only regular files are read")
    assert "/req_000002' is larger than 1 MiB" in lines[1], lines[1]
    assert lines[2] == "still served" and result["tool_calls_made"] == 1 and result["status"] == "success"


def test_tool_calls_from_programs_work_on_every_backend(backend_ctx: ToolContext) -> None:
    result = run(backend_ctx, TOOLS_PROGRAM.replace(" && pwd", ""))
    assert result["output"].startswith("dict None\n2 True\n'2\\n' 0\n"), result
    assert result["tool_calls_made"] == 3 and not result_failed(json.dumps(result))
    assert backend_ctx.sandbox.read_file("notes/plan.txt") == b"first\nsecond\n"


def test_processes_forked_by_the_program_get_their_own_answers(ctx: ToolContext) -> None:
    program = """
import os
from hermes_tools import terminal
terminal("true")
pids = []
for n in range(3):
    pid = os.fork()
    if pid == 0:
        answer = terminal("echo child %d" % n)["output"]
        with open("child-%d.txt" % n, "w") as handle:
            handle.write(answer)
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
print(terminal("cat child-*.txt")["output"], end="")
"""
    result = run(ctx, program)
    assert result["output"] == "child 0\nchild 1\nchild 2\n", result
    assert result["tool_calls_made"] == 5


# --- a sandbox that fails under a program -----------------------------------------------------------


def _fail_sandbox(ctx: ToolContext) -> None:
    """Fail the sandbox for good as a real fault does: a request its exec server refuses (no argv)."""
    with pytest.raises(SandboxFailed):
        ctx.sandbox._server.call([], "/", {}, 5, None, lambda chunk: None, None)


@pytest.mark.timeout(120)
def test_a_sandbox_failing_under_a_program_ends_the_call_with_its_failure(ctx: ToolContext, tmp_path: Path) -> None:
    """Every later call of a failed sandbox fails: the channel asked again at once, leaking each call's
    fds until the process had none left. Now the program ends with the sandbox, the call raises the
    failure (registry.call lets it through: the agent fails the sample), every fd is released and
    other sandboxes work on."""
    run(ctx, "print('warm')")  # what a sandbox keeps open for its life is open before counting
    before = open_fds()
    assert run(ctx, HOSTILE_REQUESTS)["output"].endswith("still served\n")
    assert open_fds() == before
    raised: list[SandboxFailed] = []

    def program() -> None:
        try:
            run(ctx, "import time\nfrom hermes_tools import write_file\nwrite_file('started', '')\ntime.sleep(100)")
        except SandboxFailed as exc:
            raised.append(exc)

    thread = threading.Thread(target=program)
    thread.start()
    deadline = time.monotonic() + 30
    while "started" not in ctx.sandbox.exec("ls").output and time.monotonic() < deadline:
        time.sleep(0.05)
    _fail_sandbox(ctx)
    thread.join()
    assert len(raised) == 1, raised
    assert str(raised[0]).startswith("the sandbox failed: its exec server stopped while running a command")
    assert open_fds() == before
    with BubblewrapBackend(SandboxSettings(state_root=tmp_path / "next")).open("next") as fresh:
        assert run(ToolContext(sandbox=fresh, task_id="task-2", offered=OFFERED), TOOLS_PROGRAM)["tool_calls_made"] == 3


class _CountedReads:
    """A sandbox whose reads are counted (the rest is the real one's)."""

    def __init__(self, sandbox: Any) -> None:
        self.sandbox, self.reads = sandbox, 0

    def read_file(self, *args: Any) -> bytes:
        self.reads += 1
        return self.sandbox.read_file(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sandbox, name)


def _serve_for(ctx: ToolContext, seconds: float) -> tuple[_CountedReads, BaseException | None]:
    """Serve a channel on `ctx` for `seconds` (as if the program ran that long): the reads it made and
    what it raised."""
    counted = _CountedReads(ctx.sandbox)
    channel = code_rpc.ToolChannel(ToolContext(sandbox=counted, task_id="task-1", offered=OFFERED),
                                   ".hermes_exec_test/rpc", ["terminal"], time.monotonic() + 60)
    finished = threading.Event()
    threading.Timer(seconds, finished.set).start()
    try:
        channel.serve(finished)
    except BaseException as exc:  # noqa: BLE001 - what the test looks at
        return counted, exc
    return counted, None


def test_the_channel_stops_at_a_failed_sandbox_and_backs_off_on_unreadable_requests(ctx: ToolContext) -> None:
    """In a failed sandbox every read fails: the channel asked ~10,000 times in 20 s, answering each
    number in turn. Now it stops at the first; other unreadable requests are answered ever more slowly."""
    ctx.sandbox.exec("mkdir -p " + " ".join(f".hermes_exec_test/rpc/req_{n:06d}" for n in range(1, 201)))
    counted, raised = _serve_for(ctx, 1.0)  # 200 folders where requests belong: each answered with an error
    assert raised is None and 3 <= counted.reads <= 10, counted.reads
    answered = ctx.sandbox.exec("ls .hermes_exec_test/rpc | grep -c res_").output.strip()
    assert int(answered) == counted.reads
    _fail_sandbox(ctx)
    counted, raised = _serve_for(ctx, 1.0)
    assert isinstance(raised, SandboxFailed) and counted.reads == 1
