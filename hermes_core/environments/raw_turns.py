"""A conversation with a model that writes raw text (token-level RL): what it is shown and how its
completions become AIAgent's assistant messages.

The model sees every earlier turn exactly as it wrote it, so a trainer's token sequence extends
turn after turn without re-rendering (atroposlib's managed server keeps one node per rollout only
when each prompt begins with the previous prompt plus its completion). The offered tools are written
into the system turn with our Hermes template's wording, because the model's own template may render
none; `<tool_call>` blocks are parsed strictly, and each malformed block is answered as a tool error.
"""

from __future__ import annotations

from typing import Any

from hermes_core.endpoints.model_client import Completion
from hermes_core.environments.tokens import ChatTokenizer, hermes_template
from hermes_core.environments.tool_calls import parse_tool_calls

SYSTEM_START, TURN_END = "<|im_start|>system\n", "<|im_end|>\n"


def tools_text(tokenizer: ChatTokenizer, tools: list[dict[str, Any]]) -> str:
    """The system turn's text that offers `tools`, as our template writes it."""
    mark = "\x00"  # a system text of its own, to cut after (the template takes no empty conversation)
    rendered = tokenizer.apply_chat_template([{"role": "system", "content": mark}], tools=tools,
                                             chat_template=hermes_template(), tokenize=False)
    return rendered.removeprefix(f"{SYSTEM_START}{mark}\n\n").removesuffix(TURN_END)


class RawTranscript:
    """One rollout's raw completions, in order; turns AIAgent's requests into the model's view."""

    def __init__(self, tokenizer: ChatTokenizer, served_model: str) -> None:
        self.tokenizer, self.served_model = tokenizer, served_model
        self.raw: list[str] = []  # the model's completions, as generated

    def prompt_messages(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The request's messages as the model must see them: tools in the system turn, every
        assistant turn as the raw text it generated (no structured tool_calls to re-render)."""
        messages = [dict(m) for m in body["messages"]]
        if body.get("tools"):
            offer = tools_text(self.tokenizer, body["tools"])
            if messages and messages[0]["role"] == "system":
                messages[0]["content"] = f"{messages[0]['content']}\n\n{offer}"
            else:
                messages.insert(0, {"role": "system", "content": offer})
        turn = 0
        for message in messages:
            if message["role"] == "assistant":
                message.pop("tool_calls", None)
                message["content"] = self.raw[turn]
                turn += 1
        return messages

    def completion(self, text: str, finish_reason: str | None, usage: dict[str, int]) -> Completion:
        """AIAgent's view of a raw completion: the text outside the blocks, the valid calls, and one
        call per malformed block that AIAgent answers with its error."""
        text = text.removesuffix(self.tokenizer.eos_token or "\0")  # the template closes the turn itself
        self.raw.append(text)
        parsed = parse_tool_calls(text)
        calls = list(parsed.calls)
        for number, error in enumerate(parsed.errors):
            calls.append({"id": f"call_invalid_{number}", "type": "function", "parse_error": error,
                          "function": {"name": "invalid_tool_call", "arguments": "{}"}})
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if calls:
            message["tool_calls"] = calls
        return Completion(message=message, finish_reason=finish_reason, usage=usage, served_model=self.served_model)
