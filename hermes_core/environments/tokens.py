"""Tokens and masks a trainer can use, rendered from a rollout's messages with a chat template.

Masks follow atroposlib's convention: -100 on tokens the trainer must not learn (system, user and
tool turns, the template's headers), the token id itself on every assistant turn's tokens. Tokens
come from rendering the finished conversation (`source: rendered`); tokens a server generated are
recorded as `generated` by whoever has them, so the two are never mixed silently.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any, Iterator, Protocol, Sequence

from hermes_core.environments.chatml import render_hermes

IGNORE = -100
RENDERED, GENERATED = "rendered", "generated"
TURN_START = "<|im_start|>"  # ChatML's; where the text is cut for encoding when it is a special token


class TemplateError(ValueError):
    """The chat template cannot render this conversation so that its turns line up with tokens."""


class ChatTokenizer(Protocol):  # what transformers' PreTrainedTokenizerFast offers
    chat_template: str | None

    def apply_chat_template(self, conversation: list[dict[str, Any]], **kwargs: Any) -> Any: ...

    def __call__(self, text: str, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class Tokenized:
    tokens: list[int]
    masks: list[int]
    source: str  # RENDERED or GENERATED
    template: str  # "model" (the tokenizer's own) or "hermes" (ours: the model's cannot render tools)

    @property
    def trained(self) -> int:
        return sum(mask != IGNORE for mask in self.masks)


@functools.lru_cache(maxsize=1)
def hermes_template() -> str:
    return resources.files("hermes_core.environments").joinpath("hermes_template.jinja").read_text("utf-8")


def template_for(tokenizer: ChatTokenizer) -> tuple[str, str]:
    """The tokenizer's own template when it renders tools and tool calls, else ours (ChatML, Hermes format)."""
    own = tokenizer.chat_template
    if isinstance(own, str) and "tools" in own and "tool_calls" in own:
        return own, "model"
    return hermes_template(), "hermes"


def _render(tokenizer: ChatTokenizer, template: str, messages: list[dict[str, Any]],
            tools: list[dict[str, Any]] | None, generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools or None, chat_template=template, tokenize=False,
                                         add_generation_prompt=generation_prompt)


def assistant_spans(tokenizer: ChatTokenizer, template: str, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None) -> tuple[str, list[tuple[int, int]]]:
    """The rendered text and the character span of each assistant turn in it: from after the
    generation prompt to the end of the turn (its end-of-turn token included, trailing newlines not)."""
    full = _render(tokenizer, template, messages, tools)
    spans = []
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        before = _render(tokenizer, template, messages[:index], tools, generation_prompt=True)
        through = _render(tokenizer, template, messages[: index + 1], tools)
        if not (full.startswith(before) and full.startswith(through) and len(through) > len(before)):
            raise TemplateError(f"the chat template renders turn {index + 1} differently as a prefix than in "
                                "the whole conversation: its tokens cannot be attributed to turns")
        spans.append((len(before), len(through.rstrip("\n"))))
    return full, spans


@functools.lru_cache(maxsize=256)
def _encode_segment(tokenizer: Any, segment: str) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    encoded = tokenizer.backend_tokenizer.encode(segment, add_special_tokens=False)
    return tuple(encoded.ids), tuple(encoded.offsets)


def _turns(tokenizer: ChatTokenizer, text: str) -> Iterator[tuple[Sequence[int], Sequence[tuple[int, int]], int, int]]:
    """(ids, offsets within the piece, start, length) of each piece of `text`: each turn (cut before its
    start token, a special token no merge crosses), encoded once per process (the system turn with the
    offered tools is the same in every rollout and most of the text); or the whole text as one piece
    when the tokenizer has no such token or no fast backend."""
    marker = TURN_START if TURN_START in getattr(tokenizer, "all_special_tokens", ()) else None
    if marker is None or not hasattr(tokenizer, "backend_tokenizer"):
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        yield list(encoded["input_ids"]), [tuple(pair) for pair in encoded["offset_mapping"]], 0, len(text)
        return
    start = 0
    for segment in re.split(f"(?={re.escape(marker)})", text):
        if segment:
            yield (*_encode_segment(tokenizer, segment), start, len(segment))
            start += len(segment)


def encode(tokenizer: ChatTokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids and character offsets of `text`, as the tokenizer gives them for the whole text."""
    ids: list[int] = []
    offsets: list[tuple[int, int]] = []
    for piece_ids, piece_offsets, start, _ in _turns(tokenizer, text):
        ids += piece_ids
        offsets += [(low + start, high + start) for low, high in piece_offsets]
    return ids, offsets


def _masks(tokens: Sequence[int], offsets: Sequence[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """Each token's id when it lies inside one of `spans` (and is not empty), else IGNORE."""
    return [token if end > start and any(low <= start and end <= high for low, high in spans) else IGNORE
            for token, (start, end) in zip(tokens, offsets)]


def render_tokens(tokenizer: ChatTokenizer, messages: list[dict[str, Any]],
                  tools: list[dict[str, Any]] | None = None) -> Tokenized:
    """Tokens of the whole conversation and masks giving every assistant turn's tokens to the trainer."""
    template, name = template_for(tokenizer)
    if name == "hermes":  # ours: written in Python, spans and all, in one pass
        text, spans = render_hermes(messages, tools)
    else:
        text, spans = assistant_spans(tokenizer, template, messages, tools)
    # Turn by turn: a turn without an assistant span (most of the text) is all IGNORE at once.
    tokens: list[int] = []
    masks: list[int] = []
    for ids, offsets, start, length in _turns(tokenizer, text):
        inside = [(low - start, high - start) for low, high in spans if low < start + length and high > start]
        tokens += ids
        masks += _masks(ids, offsets, inside) if inside else [IGNORE] * len(ids)
    return Tokenized(tokens, masks, RENDERED, name)


def trained_spans(masks: list[int]) -> list[tuple[int, int]]:
    """[start, end) runs of trained positions (one per assistant turn when rendered)."""
    spans, start = [], None
    for index, mask in enumerate([*masks, IGNORE]):
        if mask != IGNORE and start is None:
            start = index
        elif mask == IGNORE and start is not None:
            spans.append((start, index))
            start = None
    return spans
