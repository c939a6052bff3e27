"""What a batch run adds to every chat-completions request: reasoning, provider routing, prefill.

These follow hermes-agent's batch runner, so a run asks an endpoint for the same thing the
original would:

* reasoning in OpenRouter's form, the body's `reasoning` object (the `openai` SDK's
  `extra_body`): `{"enabled": true, "effort": E}` with effort `medium` unless one is given, and
  `{"effort": "none"}` when reasoning is disabled. Endpoints that want OpenAI's top-level
  `reasoning_effort` instead get it with `reasoning_format="openai"` (nothing when disabled);
* OpenRouter's `provider` routing object, with only the keys that are set: `only` (allowed),
  `ignore`, `order`, `sort`;
* prefill messages inserted after the system message (before the conversation) in every
  request, and never saved in the trajectory.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

OPENROUTER, OPENAI = "openrouter", "openai"
REASONING_FORMATS = (OPENROUTER, OPENAI)
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra")
DEFAULT_EFFORT = "medium"
PROVIDER_SORTS = ("price", "throughput", "latency")
# Recipe field -> key of OpenRouter's `provider` object, in the order the original builds it.
PROVIDER_KEYS = (("providers_allowed", "only"), ("providers_ignored", "ignore"), ("providers_order", "order"),
                 ("provider_sort", "sort"))


def provider_list(text: str | None) -> list[str] | None:
    """A comma-separated flag value as a list of names (None when empty), as the original splits it."""
    names = [name.strip() for name in (text or "").split(",") if name.strip()]
    return names or None


def load_prefill_messages(path: str | Path) -> list[dict[str, Any]]:
    """The JSON array of messages in `path` (`--prefill_messages_file`); ValueError naming the file."""
    try:
        messages = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"--prefill_messages_file {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"--prefill_messages_file {path}: not valid JSON: {exc}") from None
    if not isinstance(messages, list):
        raise ValueError(f"--prefill_messages_file {path}: expected a JSON array of messages, "
                         f"got {type(messages).__name__}")
    if problem := options_problem(OPENROUTER, None, None, messages):
        raise ValueError(f"--prefill_messages_file {path}: {problem}")
    return messages


def options_problem(reasoning_format: str, reasoning_effort: str | None, provider_sort: str | None,
                    prefill_messages: Sequence[Any] | None) -> str | None:
    """Why these settings cannot be sent, naming the setting at fault; None when they can."""
    if reasoning_format not in REASONING_FORMATS:
        return f"reasoning_format {reasoning_format!r}: expected one of {', '.join(REASONING_FORMATS)}"
    if reasoning_effort is not None and reasoning_effort not in REASONING_EFFORTS:
        return f"reasoning_effort {reasoning_effort!r}: expected one of {', '.join(REASONING_EFFORTS)}"
    if provider_sort is not None and provider_sort not in PROVIDER_SORTS:
        return f"provider_sort {provider_sort!r}: expected one of {', '.join(PROVIDER_SORTS)}"
    for index, message in enumerate(prefill_messages or ()):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or "content" not in message:
            return (f"prefill_messages[{index}]: expected an object with a string `role` and a `content`, "
                    f"got {message!r}"[:300])
    return None


@dataclass(frozen=True)
class RequestOptions:
    """The request additions of one run (built from its recipe: `Recipe.request_options`)."""

    reasoning_effort: str | None = None
    reasoning_disabled: bool = False
    reasoning_format: str = OPENROUTER
    providers_allowed: tuple[str, ...] = ()
    providers_ignored: tuple[str, ...] = ()
    providers_order: tuple[str, ...] = ()
    provider_sort: str | None = None
    prefill_messages: tuple[dict[str, Any], ...] = ()

    def provider(self) -> dict[str, Any] | None:
        """OpenRouter's routing object, or None when no routing flag is set (then no key is sent)."""
        routing = {key: list(value) if isinstance(value, tuple) else value
                   for name, key in PROVIDER_KEYS if (value := getattr(self, name))}
        return routing or None

    def reasoning_fields(self) -> dict[str, Any]:
        """The body keys that ask for reasoning, in the configured form."""
        if self.reasoning_format == OPENAI:
            return {} if self.reasoning_disabled else {"reasoning_effort": self.reasoning_effort or DEFAULT_EFFORT}
        if self.reasoning_disabled:
            return {"reasoning": {"effort": "none"}}
        return {"reasoning": {"enabled": True, "effort": self.reasoning_effort or DEFAULT_EFFORT}}

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        """`body` with the reasoning and routing keys, and the prefill after its system message."""
        body.update(self.reasoning_fields())
        if routing := self.provider():
            body["provider"] = routing
        if self.prefill_messages:
            messages = body["messages"]
            at = 1 if messages and messages[0].get("role") == "system" else 0
            body["messages"] = [*messages[:at], *(dict(m) for m in self.prefill_messages), *messages[at:]]
        return body


def add_request_arguments(p: argparse.ArgumentParser) -> None:
    """hermes-agent's batch flags for what requests carry (`hermes-batch`)."""
    p.add_argument("--reasoning_format", choices=REASONING_FORMATS, default=OPENROUTER,
                   help="how reasoning is asked for: openrouter (default, as hermes-agent: a `reasoning` object "
                   "{enabled, effort}, effort medium unless --reasoning_effort) or openai (top-level "
                   "`reasoning_effort`, for endpoints that refuse the object)")
    p.add_argument("--providers_allowed", help="OpenRouter providers to allow, comma-separated (provider.only)")
    p.add_argument("--providers_ignored", help="OpenRouter providers to skip, comma-separated (provider.ignore)")
    p.add_argument("--providers_order", help="OpenRouter providers to try in this order, comma-separated "
                   "(provider.order)")
    p.add_argument("--provider_sort", choices=PROVIDER_SORTS, help="OpenRouter: prefer the cheapest, fastest or "
                   "lowest-latency provider (provider.sort)")
    p.add_argument("--prefill_messages_file", help="JSON array of {role, content} messages put after the system "
                   "message of every request (few-shot priming); sent, never saved in the trajectories")
    p.add_argument("--log_prefix_chars", type=int, default=100,
                   help="characters of each tool call's arguments shown in --verbose lines (default 100)")


def request_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The Recipe's request settings from those flags: comma lists split, the prefill file read."""
    return {
        "reasoning_format": args.reasoning_format, "providers_allowed": provider_list(args.providers_allowed),
        "providers_ignored": provider_list(args.providers_ignored),
        "providers_order": provider_list(args.providers_order), "provider_sort": args.provider_sort,
        "prefill_messages": load_prefill_messages(args.prefill_messages_file) if args.prefill_messages_file else None,
        "log_prefix_chars": args.log_prefix_chars,
    }
