"""Token-level mode on the real local model (llama.cpp, SmolLM2): the ids and logprobs a trainer gets are
the ones llama.cpp generated, through atroposlib's own managed server, one sequence per rollout."""

from __future__ import annotations

import json

import pytest

from hermes_assets.foundry_cli import foundry_main
from hermes_core.environments.tokens import IGNORE, trained_spans

pytest.importorskip("atroposlib", reason="the atropos extra (make test installs it)")
pytest.importorskip("xllamacpp", reason="the local extra (make test installs it)")
from atroposlib.api.server import ScoredData  # noqa: E402

pytestmark = pytest.mark.local_model


@pytest.fixture(scope="module")
def llama():
    from hermes_core.endpoints.local_model import LocalModelServer

    with LocalModelServer() as server:
        yield server


def test_token_level_groups_carry_llama_cpps_own_ids_and_logprobs(tmp_path, llama, tokenizer_cache, monkeypatch):
    from hermes_core.environments.atropos_env import LlamaCppServer

    generated: list[tuple[list[int], list[float]]] = []  # what llama.cpp answered, call by call
    original = LlamaCppServer._tokens_and_logprobs_completion_wrapper

    async def spy(self, **kwargs):
        answer = await original(self, **kwargs)
        generated.extend(zip(answer[1], answer[2]))
        return answer

    monkeypatch.setattr(LlamaCppServer, "_tokens_and_logprobs_completion_wrapper", spy)
    monkeypatch.setenv("HERMES_CACHE_DIR", str(tokenizer_cache.parent))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tasks.jsonl").write_text(json.dumps({
        "id": "greet", "prompt": "Say hello to Ada in one short sentence.",
        "verifier": {"type": "command", "command": "true"}}) + "\n")
    assert foundry_main(["env", "process", "--token_level", "--tasks", "tasks.jsonl", "--base_url", llama.base_url,
                         "--model", "smollm2", "--groups", "1", "--group_size", "2", "--keep_equal_scores",
                         "--max_tokens", "40", "--max_turns", "2", "--temperature", "0", "--out", "groups.jsonl"]) == 0
    [group] = [json.loads(line) for line in (tmp_path / "groups.jsonl").read_text().splitlines()]
    ScoredData(**group)
    assert group["group_overrides"]["token_source"] == "generated" and group["scores"] == [1.0, 1.0]
    answers = {tuple(ids): logprobs for ids, logprobs in generated}
    for tokens, masks, logprobs, messages in zip(group["tokens"], group["masks"], group["inference_logprobs"],
                                                 group["messages"]):
        assert len(tokens) == len(masks) == len(logprobs)
        spans = trained_spans(masks)
        assert len(spans) == sum(m["role"] == "assistant" for m in messages)  # one sequence covers every turn
        for start, end in spans:  # each trained span is a completion llama.cpp sent, with its logprobs
            assert answers[tuple(tokens[start:end])] == logprobs[start:end]
            assert all(lp <= 0 for lp in logprobs[start:end])
        assert all(lp == 1.0 for lp, m in zip(logprobs, masks) if m == IGNORE)  # atroposlib's prompt placeholder
