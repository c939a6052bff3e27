"""Tokens and masks from a rollout's messages: every assistant turn trained, nothing else."""

from __future__ import annotations

import json

import pytest

from hermes_core.environments.tokens import IGNORE, Tokenized, render_tokens, trained_spans

pytest.importorskip("gguf", reason="the atropos extra (make test installs it)")


@pytest.fixture(scope="module")
def tokenizer(tokenizer_cache):
    from hermes_core.environments.tokenizer import load_tokenizer, tokenizer_dir

    return load_tokenizer(tokenizer_dir(cache_dir=tokenizer_cache))


TOOLS = [{"type": "function", "function": {"name": "terminal", "description": "Run a command",
                                            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]
CALL = {"id": "call_0", "type": "function", "function": {"name": "terminal", "arguments": '{"command": "echo 42 > a.txt"}'}}
MESSAGES = [
    {"role": "system", "content": "You are careful."},
    {"role": "user", "content": "Write 42 to a.txt"},
    {"role": "assistant", "content": "I'll write it.", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_0", "name": "terminal", "content": '{"output": "", "exit_code": 0}'},
    {"role": "assistant", "content": "Done: a.txt holds 42."},
]


def test_masks_train_exactly_the_assistant_turns(tokenizer):
    tokenized = render_tokens(tokenizer, MESSAGES, TOOLS)
    assert isinstance(tokenized, Tokenized) and (tokenized.source, tokenized.template) == ("rendered", "hermes")
    assert len(tokenized.tokens) == len(tokenized.masks)
    assert all(m in (IGNORE, t) for t, m in zip(tokenized.tokens, tokenized.masks))
    spans = trained_spans(tokenized.masks)
    decoded = [tokenizer.decode(tokenized.tokens[a:b]) for a, b in spans]
    assert decoded == [
        "I'll write it.\n<tool_call>\n"
        '{"name": "terminal", "arguments": {"command": "echo 42 > a.txt"}}\n</tool_call><|im_end|>',
        "Done: a.txt holds 42.<|im_end|>",
    ]
    whole = tokenizer.decode(tokenized.tokens)
    assert whole.startswith("<|im_start|>system\nYou are careful.\n\nYou can call functions.")
    assert json.dumps(TOOLS[0]["function"]) in whole  # the offered tool is rendered
    assert tokenized.tokens == tokenizer(whole, add_special_tokens=False)["input_ids"]


def test_user_system_and_tool_text_is_never_trained(tokenizer):
    tokenized = render_tokens(tokenizer, MESSAGES, TOOLS)
    untrained = tokenizer.decode([t for t, m in zip(tokenized.tokens, tokenized.masks) if m == IGNORE])
    for text in ("Write 42 to a.txt", "You are careful.", '"exit_code": 0', "<|im_start|>assistant"):
        assert text in untrained
    trained = tokenizer.decode([t for t, m in zip(tokenized.tokens, tokenized.masks) if m != IGNORE])
    assert "Write 42" not in trained and "exit_code" not in trained and "<|im_start|>" not in trained


def test_a_turn_of_calls_only_starts_with_its_first_call(tokenizer):
    second = {**CALL, "id": "call_1"}
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": None, "tool_calls": [CALL, second]}]
    tokenized = render_tokens(tokenizer, messages, TOOLS)
    (start, end), = trained_spans(tokenized.masks)
    block = '<tool_call>\n{"name": "terminal", "arguments": {"command": "echo 42 > a.txt"}}\n</tool_call>'
    assert tokenizer.decode(tokenized.tokens[start:end]) == f"{block}\n{block}<|im_end|>"


def test_turn_by_turn_encoding_equals_encoding_the_whole_text(tokenizer):
    from hermes_core.environments.tokens import assistant_spans, encode, template_for

    text, _ = assistant_spans(tokenizer, template_for(tokenizer)[0], MESSAGES, TOOLS)
    ids, offsets = encode(tokenizer, text)
    whole = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    assert ids == whole["input_ids"] and offsets == [tuple(o) for o in whole["offset_mapping"]]


CONVERSATIONS = [
    MESSAGES,
    MESSAGES[1:],  # no system turn
    [{"role": "user", "content": "go"}, {"role": "assistant", "content": None, "tool_calls": [CALL, {**CALL, "id": "c1"}]},
     {"role": "tool", "tool_call_id": "call_0", "content": "é ✓ \"quoted\"\n<x>"}, {"role": "tool", "content": None},
     {"role": "system", "content": "a later system turn"}, {"role": "assistant", "content": ""},
     {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "näme", "arguments": ""}}]}],
    [{"role": "system", "content": None}, {"role": "user", "content": ["a", "list"]}],
]


@pytest.mark.parametrize("tools", [TOOLS, None, TOOLS * 2])
@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
def test_the_python_renderer_writes_what_the_jinja_template_writes(tokenizer, conversation, tools):
    """render_hermes (one pass, spans noted) against hermes_template.jinja through transformers (the spans
    from rendering each turn's prefix), with and without a generation prompt."""
    from hermes_core.environments.chatml import render_hermes
    from hermes_core.environments.tokens import _render, assistant_spans, hermes_template

    messages = CONVERSATIONS[conversation]
    for prompt in (False, True):
        assert render_hermes(messages, tools, prompt)[0] == _render(tokenizer, hermes_template(), messages, tools, prompt)
    assert render_hermes(messages, tools) == assistant_spans(tokenizer, hermes_template(), messages, tools)


def test_the_light_tokenizer_renders_rollouts_exactly_as_transformers_does(tokenizer, tokenizer_cache):
    """Environment runs render with TurnTokenizer (tokenizer.json through `tokenizers`, no transformers)
    when our template is the one that renders: same tokens and masks for every conversation."""
    from hermes_core.environments.tokenizer import TurnTokenizer, load_rollout_tokenizer, tokenizer_dir

    folder = tokenizer_dir(cache_dir=tokenizer_cache)
    light = load_rollout_tokenizer(folder)
    assert isinstance(light, TurnTokenizer) and light.chat_template == tokenizer.chat_template
    for messages in CONVERSATIONS:
        assert render_tokens(light, messages, TOOLS) == render_tokens(tokenizer, messages, TOOLS)
    text = "<|im_start|>user\nnaïve café ✓<|im_end|>\n"
    assert light(text)["input_ids"] == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert light.decode(light(text)["input_ids"]) == tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"])
