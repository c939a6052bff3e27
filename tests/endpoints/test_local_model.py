"""The real local model path: llama.cpp in process (xllamacpp) serving SmolLM2-135M, driven through
the constrained tool-call mode. Needs the optional extra (`make local`; `make test` installs it). The model is
weak: these tests assert structure, never quality."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from hermes_assets.cli import batch_main
from hermes_core.endpoints import constrained
from hermes_core.config import data_root
from hermes_core.batch.ledger import Ledger
from hermes_core.endpoints.local_model import LocalModelError, LocalModelServer, bundled_gguf, resolve_gguf
from hermes_core.tools import registry

try:
    import xllamacpp
except ImportError:
    xllamacpp = None



def needs_local_model(test):
    """Marked `local_model` (select with -m local_model); skipped where the optional extra is absent."""
    return pytest.mark.local_model(pytest.mark.skipif(
        xllamacpp is None or bundled_gguf() is None,
        reason="optional local model not installed (`make local`; `make test` installs it)")(test))


PROMPTS = ["Run a shell command that lists the files in the current folder",
           "Use the terminal to print today's date", "Create a file named notes.txt containing hello"]


def test_a_missing_or_foreign_model_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LocalModelError, match="no such file"):
        resolve_gguf(tmp_path / "absent.gguf")
    (tmp_path / "model.bin").write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(LocalModelError, match="not a GGUF model file"):
        resolve_gguf(tmp_path / "model.bin")


@pytest.fixture(scope="module")
def local_model():
    with LocalModelServer(threads=2) as server:
        yield server


@needs_local_model
def test_llama_cpp_accepts_the_reply_schema_of_every_tool(local_model) -> None:
    tools = [tool.openai_schema() for tool in registry.available(registry.toolsets)]
    body = {"model": "smollm2", "max_tokens": 48, "temperature": 0,
            **constrained.request_body([{"role": "user", "content": "List the files here"}], tools)}
    request = urllib.request.Request(f"{local_model.base_url}/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        reply = json.load(response)["choices"][0]["message"]["content"]
    assert reply.lstrip().startswith("{")  # the grammar holds from the first token (48 tokens may cut it)


@needs_local_model
def test_three_prompts_end_to_end_on_the_real_model(local_model, isolated_homes, tmp_path: Path) -> None:
    dataset = tmp_path / "d.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": prompt}) + "\n" for prompt in PROMPTS))
    code = batch_main([f"--dataset_file={dataset}", "--run_name=local", f"--base_url={local_model.base_url}",
                       "--api_key=local", "--model=smollm2", "--distribution=terminal_only", "--num_workers=1",
                       "--tool_call_mode=constrained", "--reasoning_disabled", "--max_tokens=200", "--max_turns=3",
                       "--temperature=0"])
    assert code == 0
    run = data_root() / "local"
    records = Ledger(run / "raw").latest
    assert len(records) == 3 and all(r["disposition"] != "failed_retryable" for r in records.values())
    stats = json.loads((run / "statistics.json").read_text())
    assert sum(stats["counts"][d] for d in ("kept", "discarded_no_reasoning", "discarded_hallucinated_tool",
                                             "discarded_incomplete", "failed_terminal")) == 3
    assert stats["api_calls"] >= 3 and stats["usage"]["total_tokens"] > 0
    offered = {"terminal", "process"}
    calls = [call["function"] for _, record in Ledger(run / "raw").records(records) for message in record["messages"]
             if message["role"] == "assistant" for call in message.get("tool_calls") or []]
    assert calls, "the constrained replies produced no tool call at all"
    for call in calls:
        assert call["name"] in offered and isinstance(json.loads(call["arguments"]), dict)
    rows = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    assert all(row["metadata"]["tool_call_mode"] == "constrained" for row in rows)
    assert all("hermes-sim" not in (row["metadata"]["served_model"] or "") for row in rows)
