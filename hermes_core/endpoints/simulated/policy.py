"""Deterministic reply policy of the simulated model: the reply is a pure function of the request.

Behaviour is steered by `[sim:NAME]` / `[sim:NAME=VALUE]` directives in the first user message, so
tests and demos can script a conversation (tool rounds, reasoning format, failures) from the prompt.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from hermes_core.endpoints import SIMULATED_MODEL_ID

MODEL_ID = SIMULATED_MODEL_ID
INVALID_TOOL = "quantum_teleport"
REASONING_FIELDS = ("reasoning_content", "reasoning", "reasoning_details")
_DIRECTIVE = re.compile(r"\[sim:([A-Za-z0-9_.\-]+)(?:=([^\]]*))?\]")
# Fallback order when no keyword matches: cheap, always-useful tools first.
PREFERENCE = ("terminal", "execute_code", "write_file", "read_file", "search_files", "web_search", "memory", "todo")
# Per tool: what it is used for (for the reasoning text) and the prompt keywords (word-bounded
# regexes) that make it suitable.
TOOL_HINTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "terminal": ("run a shell command", ("run", "command", "shell", "list", "install", "director(y|ies)", "ls",
                                         "bash", "terminal", "folder")),
    "execute_code": ("run a small Python program", ("python", "compute", "calculate", "code", "script", "sum",
                                                    "math", "fibonacci", "factorial")),
    "write_file": ("write the file", ("write", "create", "save")),
    "read_file": ("read the file", ("read", "show (the )?contents?", "contents? of", "open", "cat")),
    "search_files": ("search the files", ("search", "find", "grep", "in (the )?files", "codebase")),
    "web_search": ("search the web", ("search", "latest", "news", "web", "internet", "online", "look up")),
    "web_extract": ("read the page", ("read (the )?(page|article)", "extract", "fetch", "article")),
    "memory": ("store this in memory", ("remember", "memori[sz]e", "memory", "recall")),
    "todo": ("record the task in the todo list", ("plan", "task list", "todos?", "to-do", "checklist")),
    "browser_navigate": ("open the web page", ("browse", "website", "web ?page", "page", "url", "https?")),
    "browser_click": ("click the link", ("click", "follow")),
    "browser_type": ("fill in the form", ("type", "fill", "form")),
    "image_generate": ("generate the image", ("image", "draw", "picture", "illustration", "paint")),
    "vision_analyze": ("analyze the image", ("look at", "describe (the |this )?(image|picture|photo)",
                                             "screenshot", "photo")),
}


class SimulatedHTTPError(Exception):
    """A scripted failure; the server turns it into an OpenAI-style error body."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after


@dataclass
class Reply:
    content: str | None
    reasoning: str | None
    reasoning_field: str = "reasoning_content"
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"
    usage: dict[str, Any] = field(default_factory=dict)

    def reasoning_value(self) -> Any:
        """The reasoning as sent on the wire: `reasoning_details` is a list of text parts."""
        if self.reasoning is None:
            return None
        if self.reasoning_field == "reasoning_details":
            return [{"type": "reasoning.text", "text": self.reasoning}]
        return self.reasoning


def text_of(content: Any) -> str:
    """Message content as plain text (content may be a string or a list of typed parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise SimulatedHTTPError(400, "'messages' must be a non-empty list of message objects")
    return messages


def _user_texts(messages: list[dict[str, Any]]) -> list[str]:
    return [text_of(m.get("content")) for m in messages if m.get("role") == "user"]


def directives(body: dict[str, Any]) -> dict[str, str]:
    """`[sim:...]` directives of the first user message (name -> value, "" when valueless)."""
    users = _user_texts(_messages(body))
    return {name.lower(): value.strip() for name, value in _DIRECTIVE.findall(users[0] if users else "")}


def conversation_key(body: dict[str, Any]) -> str:
    """Hash of the request messages: identical (retried) requests share an attempt counter."""
    raw = json.dumps(body.get("messages") if isinstance(body, dict) else None, sort_keys=True, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()


def _number(value: str | None, default: float) -> float:
    try:
        return float(value) if value not in (None, "") else default
    except ValueError:
        return default


def extra_latency(body: dict[str, Any]) -> float:
    """Per-conversation delay from `[sim:latency=S]` (0 when absent or unparsable)."""
    try:
        return max(0.0, _number(directives(body).get("latency"), 0.0))
    except SimulatedHTTPError:
        return 0.0


def _tokens(chars: int) -> int:
    return math.ceil(chars / 4)  # the usual ~4 characters per token approximation


def _phrase(text: str, words: int = 8, limit: int = 60) -> str:
    cleaned = " ".join(_DIRECTIVE.sub(" ", text).split())
    short = " ".join(cleaned.split()[:words])[:limit].strip()
    return short or "the task"


def _quoted(text: str) -> str | None:
    # Quotes must not touch word characters, so apostrophes ("user's") are not taken as quotes.
    match = re.search(r"(?<!\w)[\"“']([^\"”'\n]{1,80})[\"”'](?!\w)", _DIRECTIVE.sub(" ", text))
    return match.group(1).strip() if match else None


def _filename(text: str) -> str:
    match = re.search(r"\b[\w\-/]+\.(?:txt|md|py|json|csv|yaml|yml|log|html|js|sh)\b", text)
    return match.group(0) if match else "notes.txt"


def _url(text: str) -> str | None:
    match = re.search(r"https?://[^\s\"'<>)\]]+", text)
    return match.group(0).rstrip(".,;:!?") if match else None  # "see http://x/a.html, then" ends at .html


def _tool_arguments(name: str, prompt: str, variant: int, command: str | None = None,
                    earlier: str = "") -> dict[str, Any]:
    """Plausible arguments for well-known tools (`earlier`: the last tool result, for URLs and paths
    found there); others are derived from the schema alone."""
    quoted, phrase = _quoted(prompt), _phrase(prompt)
    safe = (quoted or "hello from hermes-sim").replace("'", "")
    if name == "terminal":
        if command:  # [sim:command=...]: tests pick the exact command the agent runs
            return {"command": command}
        if variant:
            return {"command": "pwd && ls -la"}
        listing = re.search(r"\b(list|director(y|ies)|folder|ls)\b", prompt, re.I)
        return {"command": "ls -la" if listing and not quoted else f"echo '{safe}' && ls -la"}
    if name == "execute_code":
        code = f"print({quoted!r})" if quoted else "print(sum(range(10)))"
        return {"code": "print(2 ** 10)" if variant else code}
    if name == "write_file":
        return {"path": _filename(prompt), "content": f"{quoted or 'hello from hermes-sim'}\n"}
    if name == "read_file":
        return {"path": _filename(prompt)}
    if name == "search_files":
        return {"pattern": quoted or ("hermes" if variant else "hello")}
    if name == "web_search":
        return {"query": phrase}
    if name == "memory":
        return {"action": "add", "target": "memory", "content": f"{'Follow up on' if variant else 'User asked'}: {phrase}"}
    if name == "todo":
        return {"todos": [{"id": "2" if variant else "1", "content": f"{'Follow up on' if variant else 'Do'}: {phrase}",
                           "status": "in_progress"}], "merge": True}
    if name == "web_extract":
        return {"urls": [_url(prompt) or _url(earlier) or "https://example.com"]}
    if name == "browser_navigate":
        return {"url": _url(prompt) or _url(earlier) or "https://example.com"}
    if name in ("browser_click", "browser_type"):  # the first link (or field) of the snapshot just taken
        roles = "link|button" if name == "browser_click" else "textbox|searchbox"
        ref = re.search(rf'- (?:{roles})[^\[]*\[(@e\d+)\]', earlier)
        return {"ref": ref.group(1) if ref else "@e1", **({"text": quoted or "Ada"} if name == "browser_type" else {})}
    if name == "image_generate":
        return {"prompt": quoted or phrase, "aspect_ratio": "square"}
    if name == "vision_analyze":
        path = re.search(r'"path": "([^"]+\.(?:png|jpe?g|gif|webp))"', earlier)
        return {"image_url": path.group(1) if path else _url(prompt) or "https://example.com/image.png",
                "question": "Describe this image."}
    return {}


def _value_for(prop: str, schema: dict[str, Any], prompt: str) -> Any:
    """A schema-valid placeholder for a property the known-tool arguments did not supply."""
    if schema.get("enum"):
        return "add" if "add" in schema["enum"] else schema["enum"][0]
    kind = schema.get("type")
    kind = next((k for k in kind if k != "null"), "string") if isinstance(kind, list) else kind
    defaults = {"integer": 1, "number": 1, "boolean": False, "array": [], "object": {}}
    if kind in defaults:
        return defaults[kind]
    if re.search(r"path|file", prop, re.I):
        return _filename(prompt)
    if re.search(r"url", prop, re.I):
        return _url(prompt) or "https://example.com"
    return _phrase(prompt)


_TYPE_CHECK = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list, "object": dict}


def _fits(value: Any, prop: dict[str, Any]) -> bool:
    kind = prop.get("type")
    if not isinstance(kind, str) or kind not in _TYPE_CHECK:
        return True
    if kind != "boolean" and isinstance(value, bool):  # bool is an int subclass
        return False
    return isinstance(value, _TYPE_CHECK[kind])


def conform(arguments: dict[str, Any], schema: dict[str, Any] | None, prompt: str) -> dict[str, Any]:
    """Fit `arguments` to the tool's JSON schema: drop unknown keys, fix enums/types, fill required."""
    schema = schema if isinstance(schema, dict) else {}
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    result = {k: v for k, v in arguments.items() if not props or k in props}
    for key, value in list(result.items()):
        prop = props.get(key) if isinstance(props.get(key), dict) else {}
        if (prop.get("enum") and value not in prop["enum"]) or not _fits(value, prop):
            result[key] = _value_for(key, prop, prompt)
    for key in schema.get("required") or []:
        if key not in result:
            prop = props.get(key) if isinstance(props.get(key), dict) else {}
            result[key] = _value_for(key, prop, prompt)
    return result


def _offered(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Offered function tools, name -> parameters schema, in request order."""
    tools: dict[str, dict[str, Any]] = {}
    for tool in body.get("tools") or []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            tools[fn["name"]] = fn.get("parameters") or {}
    return tools


def _tool_pool(offered: list[str], prompt: str) -> list[str]:
    """Tools to rotate through: keyword matches (best first), then the preferred fallbacks."""
    def score(name: str) -> int:
        return sum(bool(re.search(rf"\b{kw}\b", prompt, re.I)) for kw in TOOL_HINTS.get(name, ("", ()))[1])

    def rank(name: str) -> tuple[int, int, int]:
        pref = PREFERENCE.index(name) if name in PREFERENCE else len(PREFERENCE)
        return (-score(name), pref, offered.index(name))

    matching = sorted((n for n in offered if score(n) > 0), key=rank)
    pool = matching + [n for n in PREFERENCE if n in offered and n not in matching]
    return pool or offered[:1]


def _call(name: str, arguments: str, seed: str, index: int) -> dict[str, Any]:
    call_id = "call_" + hashlib.sha256(f"{seed}:{index}".encode()).hexdigest()[:12]
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _excerpt(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _arithmetic(prompt: str) -> str | None:
    match = re.search(r"(-?\d+(?:\.\d+)?)\s*([+\-*/x×])\s*(-?\d+(?:\.\d+)?)", prompt)
    if not match:
        return None
    a, op, b = float(match.group(1)), match.group(2), float(match.group(3))
    if op == "/" and b == 0:
        return None
    value = {"+": a + b, "-": a - b, "/": a / b}.get(op, a * b)
    return f"{match.group(1)} {op} {match.group(3)} = {int(value) if value == int(value) else round(value, 6)}"


def _check_failures(flags: dict[str, str], attempt: int) -> None:
    """Scripted errors: attempts are 1-based per identical request, so retries eventually succeed."""
    if "error" in flags:
        status = int(_number(flags["error"], 500))
        status = status if 400 <= status <= 599 else 500
        raise SimulatedHTTPError(status, f"Simulated error {status} ([sim:error])", 0.05 if status == 429 else None)
    if "always-fail" in flags:
        raise SimulatedHTTPError(500, "Simulated server failure ([sim:always-fail])")
    limited = int(_number(flags.get("rate-limit"), 0))
    if attempt <= limited:
        retry = _number(flags.get("retry-after"), 0.05)
        raise SimulatedHTTPError(429, f"Simulated rate limit (attempt {attempt} of {limited})", retry)
    if attempt <= limited + int(_number(flags.get("error-500"), 0)):
        raise SimulatedHTTPError(500, f"Simulated server error (attempt {attempt})")


def _transcript_to_summarize(body: dict[str, Any], users: list[str]) -> str | None:
    """The transcript of a context-summarisation request (as `hermes-compress` sends): no tools, one
    user message asking to summarise a `<conversation>...</conversation>` block. None otherwise."""
    if body.get("tools") or len(users) != 1 or "summar" not in users[0].lower():
        return None
    match = re.search(r"<conversation>(.*?)(?:</conversation>|$)", users[0], re.S)
    return match.group(1) if match else None


def _transcript_summary(transcript: str) -> str:
    """A short, plausible summary: the tools called in the transcript and the last result."""
    names = re.findall(r'<tool_call>\s*\{"name":\s*"([^"]+)"', transcript)
    if not names:
        return f"Summary: the earlier turns covered: {_excerpt(_DIRECTIVE.sub(' ', transcript), 160)}"
    listed = ", ".join(f"`{n}`" for n in dict.fromkeys(names))
    summary = f"Summary: the assistant made {len(names)} tool call(s) using {listed}."
    results = re.findall(r"<tool_response>\s*(.*?)\s*</tool_response>", transcript, re.S)
    return summary + (f" The last result was: {_excerpt(results[-1], 160)}" if results else "")


def respond(body: dict[str, Any], attempt: int = 1) -> Reply:
    """The simulated model's reply to a chat-completions request (rules: package docstring).

    `attempt` is the 1-based count of identical requests seen, used only by the scripted errors.
    """
    messages = _messages(body)
    flags = directives(body)
    _check_failures(flags, attempt)
    users = _user_texts(messages)
    prompt = _DIRECTIVE.sub(" ", users[-1] if users else "").strip()
    topic = _phrase(users[0] if users else "")
    offered = _offered(body)
    choice = body.get("tool_choice")
    if choice == "none":
        offered = {}
    forced = choice.get("function", {}).get("name") if isinstance(choice, dict) else None

    turn = messages
    if "each-turn" in flags:  # each user message wants its own tool rounds, steered by its own directives
        turn = messages[max(i for i, m in enumerate(messages) if m.get("role") == "user"):]
        flags = {**flags, **{name.lower(): value.strip() for name, value in _DIRECTIVE.findall(users[-1])}}
    tool_msgs = [m for m in turn if m.get("role") == "assistant" and m.get("tool_calls")]
    used = [c.get("function", {}).get("name", "?") for m in tool_msgs for c in m["tool_calls"] if isinstance(c, dict)]
    results = [text_of(m.get("content")) for m in messages if m.get("role") == "tool"]
    rounds = len(tool_msgs)
    # Scripted bad rounds (hallucinated tool, malformed args) do not count towards the wanted rounds.
    if "hallucinate-always" in flags:
        completed = 0
    elif "hallucinate" in flags or "malformed-args" in flags:
        completed = max(0, rounds - 1)
    else:
        completed = rounds
    wanted = 0 if "no-tools" in flags else int(_number(flags.get("tools"), 1))
    if "loop" in flags:
        wanted = 10**9
    # The agent's final "please summarize" request comes after the task message, never as it.
    summarize = len(users) > 1 and "summar" in prompt.lower()

    transcript = _transcript_to_summarize(body, users)

    tool_calls: list[dict[str, Any]] = []
    if transcript is not None:
        reasoning = "I am asked to summarise part of a conversation; I will list the tools used and the outcome."
        content = _transcript_summary(transcript)
    elif summarize:
        reasoning = "The user wants a summary of the conversation so far; I will not call more tools."
        content = f'Summary: the task was "{topic}".'
        if used:
            content += f" I made {len(used)} tool call(s) using {', '.join(f'`{n}`' for n in dict.fromkeys(used))}."
        if results:
            content += f" The last result was: {_excerpt(results[-1])}"
    elif offered and (completed < wanted or forced or choice == "required"):
        seed = f"{conversation_key(body)}:{rounds}"
        if "hallucinate-always" in flags or ("hallucinate" in flags and rounds == 0):
            names = [INVALID_TOOL]
        else:
            pool = [forced] if forced in offered else _tool_pool(list(offered), prompt)
            count = 2 if "parallel" in flags else 1
            names = [pool[(completed * count + i) % len(pool)] for i in range(count)]
        for index, name in enumerate(names):
            if name == INVALID_TOOL:
                args = json.dumps({"target": "mars"})
            else:
                variant = index if names.count(name) > 1 else completed
                arguments = _tool_arguments(name, prompt, variant, flags.get("command"), results[-1] if results else "")
                fitted = conform(arguments, offered[name], prompt)
                args = json.dumps(fitted, ensure_ascii=False)
                if "malformed-args" in flags and rounds == 0 and index == 0:
                    args = args[:-1] if args.endswith("}") else args + "{"  # unbalanced JSON on purpose
            tool_calls.append(_call(name, args, seed, index))
        listed = " and ".join(f"`{n}`" for n in names)
        purpose = TOOL_HINTS.get(names[0], ("make progress",))[0]
        reasoning = f'The user asks: "{_phrase(prompt)}". I should use the {listed} tool to {purpose}.'
        content = None
    elif results:
        reasoning = f"The tool results are in; I can now answer the request about \"{topic}\"."
        listed = ", ".join(f"`{n}`" for n in dict.fromkeys(used)) or "the tools"
        content = f"Done. I used {listed}; it returned: {_excerpt(results[-1])}"
    else:
        reasoning = f'The user asks: "{_phrase(prompt)}". I can answer this directly without tools.'
        computed = _arithmetic(prompt)
        content = (
            f"The answer is {computed}."
            if computed
            else f'Here is my answer to "{_phrase(prompt, 20, 160)}": this is a simulated response from {MODEL_ID}.'
        )

    field_name = flags.get("reasoning-field") or "reasoning_content"
    field_name = field_name if field_name in REASONING_FIELDS else "reasoning_content"
    if "no-reasoning" in flags:
        reasoning = None
    elif "think-inline" in flags:
        content, reasoning = f"<think>{reasoning}</think>\n{content or ''}", None

    prompt_chars = len(json.dumps(messages, default=str)) + len(json.dumps(body.get("tools") or [], default=str))
    reasoning_tokens = _tokens(len(reasoning or ""))
    call_chars = sum(len(c["function"]["name"]) + len(c["function"]["arguments"]) for c in tool_calls)
    completion = max(1, _tokens(len(content or "") + call_chars) + reasoning_tokens)
    prompt_tokens = max(1, _tokens(prompt_chars))
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
    }
    return Reply(content, reasoning, field_name, tool_calls, "tool_calls" if tool_calls else "stop", usage)
