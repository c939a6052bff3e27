"""The fixed part of the `hermes_tools` module that `execute_code` programs import (never imported by
the project itself: hermes_core/tools/code_rpc.py copies this source into the sandbox and appends one
function per tool the session offers).

It runs INSIDE the sandbox, under whatever python3 the image has, so it uses only the standard
library and stays Python 3.6 compatible. A call writes a request file into the `rpc` folder next to
this module (atomically: write, then rename) and waits for the answer the parent process writes back
through the sandbox's file interface; the parent runs the real tool with the session's context.
"""

import json
import os
import shlex
import threading
import time

_RPC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rpc")
_CALL_TIMEOUT_S = 600  # far beyond the program's own time limit: the parent kills the program first
_lock = threading.Lock()  # one call at a time: requests are numbered and answered in order
_sequence = [0]
_OFFERED = ()  # replaced by the generated part: the tool names this session lets the program call
_ALL_SANDBOX_TOOLS = ()  # replaced too: every name the sandbox may ever offer


def _call(tool, args):
    """Run `tool` with `args` in the parent and return its result: parsed JSON (usually a dict; a
    refused or failed call is {"error": "..."}), or the raw text when the result is not JSON."""
    with _lock:
        if not os.path.isdir(_RPC_DIR):
            os.makedirs(_RPC_DIR, exist_ok=True)
        name = _claim_number()
        request = os.path.join(_RPC_DIR, "req_" + name)
        with open(request + ".tmp", "w", encoding="utf-8") as handle:
            json.dump({"tool": tool, "args": args}, handle)
        os.rename(request + ".tmp", request)
        raw = _answer(os.path.join(_RPC_DIR, "res_" + name), tool)
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _answer(path, tool):
    """The tool's result text, once the parent has written all of it: the answer is one line (a JSON
    string literal, pure ASCII) ending in a newline, so a file still being written has no newline yet."""
    deadline, pause = time.monotonic() + _CALL_TIMEOUT_S, 0.002
    while True:
        if os.path.exists(path):
            with open(path, "rb") as handle:
                data = handle.read()
            if data.endswith(b"\n"):
                return json.loads(data.decode("ascii", "replace"))
        if time.monotonic() > deadline:
            raise RuntimeError("no answer to the %s call after %d s" % (tool, _CALL_TIMEOUT_S))
        time.sleep(pause)
        pause = min(pause * 1.5, 0.05)


def _claim_number():
    """The next free request number. Claimed with an exclusive create, so that processes forked from
    the program (which inherit its counter) never send two requests under one number."""
    while True:
        _sequence[0] += 1
        name = "%06d" % _sequence[0]
        try:
            os.close(os.open(os.path.join(_RPC_DIR, "claim_" + name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return name
        except FileExistsError:
            continue


def __getattr__(name):
    """A sandbox tool this session does not offer: a clear error instead of a bare missing name."""
    if name in _ALL_SANDBOX_TOOLS:
        raise ImportError("%s is not offered in this session, so programs cannot call it either; "
                          "hermes_tools has: %s" % (name, ", ".join(_OFFERED) or "no tools"))
    raise AttributeError("module 'hermes_tools' has no attribute %r" % name)


def json_parse(text):
    """json.loads that accepts control characters inside strings (as terminal output may have)."""
    return json.loads(text, strict=False)


def shell_quote(s):
    """`s` quoted for a shell command line (shlex.quote)."""
    return shlex.quote(s)


def retry(fn, max_attempts=3, delay=2):
    """Call fn() until it returns without raising, at most `max_attempts` times, sleeping `delay`
    seconds after the first failure and doubling it after each further one; re-raises the last error."""
    for attempt in range(max_attempts):
        try:
            return fn()
        except Exception:
            if attempt == max_attempts - 1:
                raise
            time.sleep(delay * (2 ** attempt))
