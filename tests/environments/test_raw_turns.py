"""Raw completions (token-level mode) as AIAgent's turns: the model sees its own text again, valid calls
run, and each malformed <tool_call> block is answered with its error."""

from __future__ import annotations

import asyncio
import json

import pytest

from hermes_core.agent.loop import AIAgent
from hermes_core.environments.raw_turns import RawTranscript

RAW = ('Let me look.<tool_call>\n{"name": "terminal", "arguments": {"command": "echo hi"}}\n</tool_call>\n'
       '<tool_call>\n{"name": "terminal", "arguments": {oops}}\n</tool_call>')


@pytest.fixture(scope="module")
def tokenizer(tokenizer_cache):
    from hermes_core.environments.tokenizer import load_tokenizer

    return load_tokenizer(next(p for p in tokenizer_cache.iterdir() if not p.name.startswith(".")))


def test_a_malformed_block_is_answered_with_its_error_and_the_valid_call_runs(tokenizer):
    transcript = RawTranscript(tokenizer, "local")
    replies = iter([RAW + tokenizer.eos_token, "Done." + tokenizer.eos_token])
    seen: list[list[dict]] = []

    async def model_call(body):
        seen.append(transcript.prompt_messages(body))
        return transcript.completion(next(replies), "stop", {})

    agent = AIAgent(model="local", base_url="http://127.0.0.1:9/v1", api_key="k", quiet_mode=True,
                    enabled_toolsets=["terminal"], sandbox_backend="local", model_call=model_call)
    result = asyncio.run(agent.arun_conversation("say hi"))
    tools = [m for m in result["messages"] if m["role"] == "tool"]
    assert json.loads(tools[0]["content"])["output"].strip() == "hi"  # the valid call ran in the sandbox
    assert json.loads(tools[1]["content"]) == {"error": json.loads(tools[1]["content"])["error"]}
    assert json.loads(tools[1]["content"])["error"].startswith("tool call block 2:")
    assert result["final_response"] == "Done."
    second = seen[1]  # what the model saw before its second turn
    assert second[0]["role"] == "system" and "<tools>" in second[0]["content"] and '"terminal"' in second[0]["content"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool", "tool"]
    assert second[2] == {"role": "assistant", "content": RAW}  # its own text, as written, no re-rendered calls
