"""AIAgent against the real simulated endpoint: the loop of SPEC §4."""

from __future__ import annotations

import json
import re
import time

import pytest

from hermes_core import AIAgent
from hermes_core.agent.loop import SUMMARY_REQUEST, resolve_toolsets
from hermes_core.endpoints.model_client import ModelError
from hermes_core.sandbox import SandboxError


def make_agent(url: str, **options) -> AIAgent:
    options.setdefault("quiet_mode", True)
    options.setdefault("enabled_toolsets", ["terminal", "file"])
    options.setdefault("backoff_base_s", 0.01)
    return AIAgent(model="hermes-sim", base_url=url, api_key="test", **options)


@pytest.mark.parametrize("stream", [False, True])
def test_conversation_calls_a_tool_and_answers(sim_url, stream):
    result = make_agent(sim_url, stream=stream).run_conversation("Run a shell command that prints 'hi there'")
    assert result["completed"] and not result["failed"] and not result["partial"]
    roles = [m["role"] for m in result["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant"]
    call = result["messages"][1]["tool_calls"][0]
    assert call["function"]["name"] == "terminal"
    tool_reply = json.loads(result["messages"][2]["content"])
    assert tool_reply["exit_code"] == 0
    assert result["final_response"] and "terminal" in result["final_response"]
    assert result["api_calls"] == 2
    assert result["usage"]["total_tokens"] > 0
    assert all(result["reasoning"])
    assert result["tool_stats"] == {"terminal": {"count": 1, "success": 1, "failure": 0}}
    assert result["served_model"] == "hermes-sim"


def test_stream_and_non_stream_give_the_same_conversation(sim_url):
    prompt = "Use Python to compute 2+2 [sim:parallel]"
    a = make_agent(sim_url, enabled_toolsets=["code_execution", "terminal"]).run_conversation(prompt)
    b = make_agent(sim_url, enabled_toolsets=["code_execution", "terminal"], stream=True).run_conversation(prompt)
    # `ls -l` in the tool output shows the time: the two runs may straddle a minute; execute_code
    # reports how long the program ran (duration_seconds, as Hermes Agent does).
    unclocked = lambda text: re.sub(r'"duration_seconds": [\d.]+', '"duration_seconds": N', re.sub(r"\d\d:\d\d", "hh:mm", text))  # noqa: E731
    strip = lambda r: [(m["role"], unclocked(m.get("content") or ""), m.get("reasoning"))  # noqa: E731
                       for m in r["messages"]]
    assert strip(a) == strip(b)
    assert len(a["messages"][1]["tool_calls"]) == 2


def test_chat_returns_the_final_text(sim_url):
    answer = make_agent(sim_url, enabled_toolsets=[]).chat("What is the capital of France?")
    assert isinstance(answer, str) and answer


@pytest.mark.parametrize("directive", ["[sim:rate-limit=2]", "[sim:error-500=2]"])
def test_retries_then_succeeds(sim_url, directive):
    result = make_agent(sim_url, enabled_toolsets=[]).run_conversation(f"Say hello {directive}")
    assert result["completed"] and not result["failed"]


def test_endpoint_that_always_fails_marks_the_run_failed(sim_url):
    result = make_agent(sim_url, max_retries=2).run_conversation("Say hello [sim:always-fail]")
    assert result["failed"] and not result["completed"]
    assert "500" in result["error"]


def test_non_retryable_error_is_not_retried(sim_server):
    before = sim_server.log.requests
    result = make_agent(sim_server.base_url, max_retries=5, backoff_base_s=5).run_conversation("Say hello [sim:error=400]")
    assert result["failed"] and "400" in result["error"]
    # Counted at the endpoint, not timed: the duration also holds the sandbox readied meanwhile.
    assert sim_server.log.requests == before + 1


def test_chat_raises_when_the_model_fails(sim_url):
    with pytest.raises(ModelError):
        make_agent(sim_url, max_retries=0).chat("hello [sim:always-fail]")


@pytest.mark.parametrize(
    "directive, expected",
    [("", "reasoning_content"), ("[sim:reasoning-field=reasoning]", "reasoning"),
     ("[sim:reasoning-field=reasoning_details]", "reasoning_details"), ("[sim:think-inline]", "inline")],
)
@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_is_captured_from_every_source(sim_url, directive, expected, stream):
    result = make_agent(sim_url, enabled_toolsets=[], stream=stream).run_conversation(f"Explain tides {directive}")
    final = result["messages"][-1]
    assert final["reasoning"], f"no reasoning captured from {expected}"
    assert "<think>" not in (final["content"] or "")


def test_no_reasoning_is_recorded_as_none(sim_url):
    result = make_agent(sim_url, enabled_toolsets=[]).run_conversation("Explain tides [sim:no-reasoning]")
    assert result["reasoning"] == [None]


def test_hallucinated_tool_gets_an_error_reply_and_is_counted(sim_url):
    result = make_agent(sim_url).run_conversation("Run ls [sim:hallucinate]")
    replies = [m for m in result["messages"] if m["role"] == "tool"]
    assert replies[0]["content"].startswith("Tool 'quantum_teleport' does not exist. Available tools: ")
    assert "terminal" in replies[0]["content"]
    assert result["tool_stats"]["quantum_teleport"] == {"count": 1, "success": 0, "failure": 1}
    assert result["completed"]


def test_three_turns_without_a_valid_call_stop_the_run_as_partial(sim_url):
    result = make_agent(sim_url).run_conversation("Run ls [sim:hallucinate-always]")
    assert result["partial"] and not result["completed"]
    assert result["api_calls"] == 3


def test_malformed_arguments_get_a_parse_error_and_count_as_failure(sim_url):
    result = make_agent(sim_url).run_conversation("Run ls -la [sim:malformed-args]")
    first_reply = next(m for m in result["messages"] if m["role"] == "tool")
    assert "could not parse the arguments" in json.loads(first_reply["content"])["error"]
    assert result["tool_stats"]["terminal"]["failure"] >= 1
    assert result["completed"]


def test_max_iterations_ends_with_a_summary_call(sim_url):
    result = make_agent(sim_url, max_iterations=3).run_conversation("Run ls [sim:loop]")
    assert not result["completed"]
    assert result["api_calls"] == 4  # three tool rounds + the tool-less summary call
    assert result["messages"][-2] == {"role": "user", "content": SUMMARY_REQUEST}
    assert result["final_response"] and not result["messages"][-1].get("tool_calls")


def test_quiet_mode_prints_nothing(sim_url, capfd):
    make_agent(sim_url, quiet_mode=True).run_conversation("Run ls [sim:rate-limit=1]")
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_verbose_mode_shows_progress(sim_url, capfd):
    make_agent(sim_url, quiet_mode=False).run_conversation("Run ls")
    _, err = capfd.readouterr()
    assert "terminal" in err


def test_toolset_filtering():
    assert resolve_toolsets(["file", "terminal"], None) == ["terminal", "file"]
    assert resolve_toolsets(None, ["terminal"]) == ["file", "code_execution", "memory", "todo"]
    assert "web" not in resolve_toolsets(None, None)  # no web backend configured: not offered
    with pytest.raises(ValueError, match="nosuch"):
        resolve_toolsets(["nosuch"], None)
    with pytest.raises(ValueError, match="bogus"):
        resolve_toolsets(None, ["bogus"])


def test_only_enabled_tools_are_offered(sim_url):
    agent = make_agent(sim_url, enabled_toolsets=["file"], disabled_toolsets=None)
    assert [t.name for t in agent.tools] == ["read_file", "write_file", "patch", "search_files"]
    agent = make_agent(sim_url, enabled_toolsets=["file", "terminal"], disabled_toolsets=["file"])
    assert [t.name for t in agent.tools] == ["terminal", "process"]


def test_sandbox_is_closed_after_the_conversation(sim_url, monkeypatch):
    from hermes_core.sandbox import bubblewrap

    monkeypatch.delenv("HERMES_TERMINAL_BACKEND", raising=False)  # the default backend: "local" (bubblewrap)
    opened = []
    original = bubblewrap.BubblewrapBackend.open

    def spy(self, *args, **kwargs):
        sandbox = original(self, *args, **kwargs)
        opened.append(sandbox)
        return sandbox

    monkeypatch.setattr(bubblewrap.BubblewrapBackend, "open", spy)
    make_agent(sim_url).run_conversation("Run ls")
    assert len(opened) == 1
    with pytest.raises(SandboxError, match="closed"):
        opened[0].exec("true")


def test_tool_progress_events_bracket_each_call(sim_url):
    events = []
    result = make_agent(sim_url, tool_progress=events.append).run_conversation("Run ls [sim:parallel]")
    calls = result["messages"][1]["tool_calls"]
    assert [(e["toolCallId"], e["status"]) for e in events] == [
        (calls[0]["id"], "running"), (calls[0]["id"], "completed"), (calls[1]["id"], "running"),
        (calls[1]["id"], "completed")]
    assert events[0]["tool"] == calls[0]["function"]["name"] and events[0]["label"].startswith(events[0]["tool"])


def test_a_run_cancelled_while_its_sandbox_opens_still_closes_it(sim_url):
    import asyncio

    from hermes_core.sandbox import SandboxSettings
    from hermes_core.sandbox.local import PlainBackend

    closed = []

    class SlowBackend(PlainBackend):
        def open(self, *args, **kwargs):
            time.sleep(0.4)
            sandbox = super().open(*args, **kwargs)
            original = sandbox.close
            sandbox.close = lambda: (closed.append(True), original())
            return sandbox

    async def scenario():
        agent = make_agent(sim_url, sandbox_backend=SlowBackend(SandboxSettings()))
        task = asyncio.ensure_future(agent.arun_conversation("Run ls"))
        await asyncio.sleep(0.2)  # the model answered with a tool call; the sandbox is opening
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.6)

    asyncio.run(scenario())
    assert closed == [True]


def timed_backend(events: list[tuple[str, float]], open_error: str | None = None,
                  start_error: Exception | None = None):
    """A plain backend that records in `events` when each sandbox opens, starts and closes; its
    opens fail with `open_error`, its starts with `start_error`."""
    from hermes_core.sandbox import SandboxError, SandboxSettings
    from hermes_core.sandbox.local import PlainBackend

    def start() -> None:
        events.append(("start", time.monotonic()))
        if start_error:
            raise start_error

    class Backend(PlainBackend):
        def open(self, *args, **kwargs):
            events.append(("open", time.monotonic()))
            if open_error:
                raise SandboxError(open_error)
            sandbox = super().open(*args, **kwargs)
            original = sandbox.close
            sandbox.start = start
            sandbox.close = lambda: (events.append(("close", time.monotonic())), original())
            return sandbox

    return Backend(SandboxSettings())


def test_the_sandbox_gets_ready_while_the_model_writes_its_first_reply(sim_url):
    events: list[tuple[str, float]] = []
    agent = make_agent(sim_url, sandbox_backend=timed_backend(events),
                       tool_progress=lambda e: events.append((e["status"], time.monotonic())))
    started = time.monotonic()
    result = agent.run_conversation("Run ls [sim:latency=1]")
    assert result["completed"] and result["sandbox_created"]
    assert [name for name, _ in events] == ["open", "start", "running", "completed", "close"]
    at = dict(events)
    # Opened and started as the conversation starts, not once the first reply is in (1 s later).
    assert at["start"] - started < 0.9 and at["running"] - started >= 1


def test_a_sandbox_no_tool_needed_is_closed_and_not_counted(sim_url):
    events: list[tuple[str, float]] = []
    result = make_agent(sim_url, sandbox_backend=timed_backend(events)).run_conversation("Say hi [sim:no-tools]")
    assert result["completed"] and not result["sandbox_created"] and not result["failed"]
    assert [name for name, _ in events] == ["open", "start", "close"]
    events.clear()
    lazy = make_agent(sim_url, sandbox_backend=timed_backend(events), prepare_sandbox=False)
    assert lazy.run_conversation("Say hi [sim:no-tools]")["completed"] and events == []
    lazy.run_conversation("Run ls")
    assert [name for name, _ in events] == ["open", "start", "close"]  # opened at the tool call


def test_a_conversation_given_close_sandbox_hands_its_sandbox_over_open(sim_url):
    """`close_sandbox` takes the conversation's sandbox instead of a close before the result (the batch
    runner closes it while the record is written); it is still usable when handed over."""
    events: list[tuple[str, float]] = []
    handed = []
    agent = make_agent(sim_url, sandbox_backend=timed_backend(events), close_sandbox=handed.append)
    assert agent.run_conversation("Run ls")["completed"] and [name for name, _ in events] == ["open", "start"]
    assert len(handed) == 1 and handed[0].exec("echo still-open").output.strip() == "still-open"
    handed[0].close()
    assert [name for name, _ in events] == ["open", "start", "close"]


def test_a_sandbox_that_cannot_open_fails_only_samples_that_need_it(sim_url):
    events: list[tuple[str, float]] = []
    broken = timed_backend(events, open_error="no room for a sandbox")
    quiet = make_agent(sim_url, sandbox_backend=broken).run_conversation("Say hi [sim:no-tools]")
    assert quiet["completed"] and not quiet["failed"] and not quiet["sandbox_failed"]
    needed = make_agent(sim_url, sandbox_backend=broken).run_conversation("Run ls")
    assert needed["failed"] and needed["sandbox_failed"] and needed["error"] == "sandbox: no room for a sandbox"
    assert [name for name, _ in events] == ["open", "open"]  # one attempt per conversation


def test_a_sandbox_that_cannot_get_ready_is_still_used_or_closed(sim_url):
    from hermes_core.sandbox import SandboxError

    events: list[tuple[str, float]] = []
    late = make_agent(sim_url, sandbox_backend=timed_backend(events, start_error=SandboxError("not yet")))
    result = late.run_conversation("Run a shell command that prints 'hi there'")
    assert result["completed"] and "hi there" in result["messages"][2]["content"]  # the command started it
    assert [name for name, _ in events] == ["open", "start", "close"]
    events.clear()
    broken = make_agent(sim_url, sandbox_backend=timed_backend(events, start_error=RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):
        broken.run_conversation("Run ls")
    assert [name for name, _ in events] == ["open", "start", "close"]  # not left open


@pytest.mark.parametrize("limit, together", [(None, 2), (1, 1)])
def test_max_parallel_tools_bounds_the_threads_of_a_conversation(sim_url, limit, together):
    """The API server gives each run a bounded share of its worker threads (issue 28, finding 4)."""
    import threading

    from hermes_core.sandbox import SandboxSettings
    from hermes_core.sandbox.local import PlainBackend
    from hermes_core.tools.registry import ToolRegistry

    inside, most, met, lock = [0], [0], threading.Event(), threading.Lock()
    tools = ToolRegistry()

    def peek(ctx, path: str) -> str:
        """Look at a path."""
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            if inside[0] == 2:
                met.set()
        met.wait(0.5)  # unbounded, the other call arrives meanwhile
        with lock:
            inside[0] -= 1
        return "seen"

    tools.register(peek, "probe", read_only=True)
    agent = make_agent(sim_url, enabled_toolsets=["probe"], tool_registry=tools, max_parallel_tools=limit,
                       sandbox_backend=PlainBackend(SandboxSettings()))
    result = agent.run_conversation("Peek at it [sim:parallel]")
    assert [c["function"]["name"] for c in result["messages"][1]["tool_calls"]] == ["peek", "peek"]
    assert most[0] == together
