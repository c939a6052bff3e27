"""The GGUF tokenizer: its ids equal llama.cpp's own (the real local server's /tokenize), it is converted
once per file content and cached, it carries the file's chat template, and it never uses the network."""

from __future__ import annotations

import importlib.util
import json
import socket
import sys
import urllib.request
from pathlib import Path

import pytest

from hermes_core.endpoints.local_model import LocalModelError, LocalModelServer, bundled_gguf
from hermes_core.environments import tokenizer as gguf_tokenizer
from hermes_core.environments.tokenizer import TokenizerUnavailable, load_tokenizer, tokenizer_dir

needs_gguf = pytest.mark.skipif(
    bundled_gguf() is None or importlib.util.find_spec("gguf") is None,
    reason="needs the bundled SmolLM2 GGUF (`make local`) and the gguf package (pip install -e '.[atropos]')")
needs_llama_cpp = pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None,
                                     reason="llama.cpp (xllamacpp, the `local` extra) is not installed")

TEXTS = [
    "The quick brown fox jumps over the lazy dog. Don't stop; it's 3.14159 or 1234567!",
    "def area(r):\n    if r < 0:\n\t\traise ValueError('r')\n    return 3.14 * r ** 2  # pi r²\n\n\n",
    "Café naïve résumé — 日本語のテキスト, Ελληνικά, emoji 😀👍🏽 and 👨‍👩‍👧 ZWJ.",
    "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "   leading, trailing   \r\n\r\n  \u00a0nbsp\t",
    "<tool_call>\n{\"name\": \"terminal\", \"arguments\": {\"command\": \"ls -la\"}}\n</tool_call><|endoftext|>",
]
CONVERSATION = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}]


@pytest.fixture(scope="module")
def converted(tokenizer_cache) -> Path:
    """The bundled model's tokenizer, converted once for this module into a private cache."""
    if bundled_gguf() is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("needs the bundled SmolLM2 GGUF and the gguf package")
    return tokenizer_dir(None, cache_dir=tokenizer_cache)


@pytest.fixture(scope="module")
def tok(converted: Path):
    return load_tokenizer(converted)


@pytest.fixture(scope="module")
def llama_root():
    """The root URL (llama.cpp's native routes, not /v1) of the real local model server."""
    with LocalModelServer(threads=2, context=2048) as server:
        yield server.base_url.removesuffix("/v1")


def llama_tokenize(root: str, text: str, add_special: bool = False) -> list[int]:
    body = json.dumps({"content": text, "add_special": add_special, "parse_special": True}).encode()
    request = urllib.request.Request(f"{root}/tokenize", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["tokens"]


@needs_gguf
@needs_llama_cpp
@pytest.mark.local_model
@pytest.mark.parametrize("text", TEXTS, ids=["english", "code", "unicode", "chat_special", "whitespace", "tool_call"])
def test_ids_equal_llama_cpp_tokenization(tok, llama_root: str, text: str) -> None:
    assert tok.encode(text, add_special_tokens=False) == llama_tokenize(llama_root, text)
    # Both add the same special tokens (this file says: no BOS) when asked to.
    assert tok.encode(text) == llama_tokenize(llama_root, text, add_special=True)


@needs_gguf
@needs_llama_cpp
@pytest.mark.local_model
def test_a_rendered_conversation_tokenizes_as_llama_cpp_does(tok, llama_root: str) -> None:
    rendered = tok.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert tok.encode(rendered, add_special_tokens=False) == llama_tokenize(llama_root, rendered)


@needs_gguf
def test_the_conversion_never_imports_torch(converted: Path) -> None:
    assert "torch" not in sys.modules


@needs_gguf
def test_the_second_call_reuses_the_cache(converted: Path, monkeypatch) -> None:
    files = {name: (converted / name).stat().st_mtime_ns for name in gguf_tokenizer.TOKENIZER_FILES}

    def no_conversion(*args: object) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_tokenizer, "convert_into", no_conversion)
    assert tokenizer_dir(bundled_gguf(), cache_dir=converted.parent) == converted
    assert {name: (converted / name).stat().st_mtime_ns for name in files} == files
    assert [path.name for path in converted.parent.iterdir()] == [converted.name]  # no staging folder left


@needs_gguf
def test_a_converter_that_loses_the_race_keeps_the_winners_folder(converted: Path, tmp_path: Path,
                                                                   monkeypatch) -> None:
    def lose_the_race(gguf_path: Path, staging: Path) -> None:
        # Another process finishes first, while this one is still writing its own copy.
        winner = tmp_path / converted.name
        winner.mkdir()
        for name in gguf_tokenizer.TOKENIZER_FILES:
            (winner / name).write_bytes((converted / name).read_bytes())
            (staging / name).write_text("the loser's half-written copy")

    monkeypatch.setattr(gguf_tokenizer, "convert_into", lose_the_race)
    assert tokenizer_dir(None, cache_dir=tmp_path) == tmp_path / converted.name
    assert [path.name for path in tmp_path.iterdir()] == [converted.name]
    assert (tmp_path / converted.name / "tokenizer.json").read_bytes() == (converted / "tokenizer.json").read_bytes()


@needs_gguf
def test_the_ggufs_chat_template_and_special_tokens_are_kept(converted: Path, tok) -> None:
    config = json.loads((converted / "tokenizer_config.json").read_text())
    assert config["bos_token"] == tok.bos_token == "<|im_start|>"
    assert config["eos_token"] == tok.eos_token == "<|im_end|>"
    assert "<|im_start|>" in config["chat_template"]
    assert tok.apply_chat_template(CONVERSATION, tokenize=False) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n")


@needs_gguf
def test_the_default_cache_is_under_hermes_cache_dir(converted: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HERMES_CACHE_DIR", str(tmp_path))
    (tmp_path / "tokenizers").mkdir()
    (tmp_path / "tokenizers" / converted.name).symlink_to(converted)  # already converted: no second conversion
    assert tokenizer_dir() == tmp_path / "tokenizers" / converted.name
    assert load_tokenizer(None).encode("Hello world", add_special_tokens=False) == [19556, 905]


@pytest.fixture()
def network_attempts(monkeypatch) -> list[object]:
    """Every name lookup or connection tried during the test (each refused), to assert there were none:
    recorded rather than raised, since huggingface_hub swallows errors of its best-effort requests."""
    attempts: list[object] = []

    def refuse(*args: object) -> None:
        attempts.append(args)
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)  # a name lookup is already a network access
    monkeypatch.setattr(socket.socket, "connect", refuse)
    return attempts


def test_an_unknown_name_is_unavailable_without_touching_the_network(network_attempts, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TokenizerUnavailable, match="not in the local .* would need the network.*local folder.*gguf"):
        load_tokenizer("hermes-foundry-tests/no-such-tokenizer")
    with pytest.raises(TokenizerUnavailable, match="no folder, GGUF file or valid model name.*local folder"):
        load_tokenizer("not a valid repo name!")
    assert network_attempts == []


@needs_gguf
def test_a_name_in_the_local_hugging_face_cache_loads_offline(converted: Path, tmp_path: Path, network_attempts,
                                                               monkeypatch) -> None:
    import huggingface_hub.constants

    snapshot = tmp_path / "models--hermes-foundry-tests--smollm2" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    for name in gguf_tokenizer.TOKENIZER_FILES:
        (snapshot / name).write_bytes((converted / name).read_bytes())
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    tok = load_tokenizer("hermes-foundry-tests/smollm2")
    assert tok.encode("Hello world", add_special_tokens=False) == [19556, 905] and network_attempts == []


def test_a_file_that_is_not_gguf_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.model").write_bytes(b"\x0a\x0bnot a gguf file")
    (tmp_path / "model.gguf").write_text("{}")
    for path in (tmp_path / "tokenizer.model", tmp_path / "model.gguf"):
        with pytest.raises(LocalModelError, match="not a GGUF model file"):
            load_tokenizer(path)
        with pytest.raises(LocalModelError, match="not a GGUF model file"):
            tokenizer_dir(path, cache_dir=tmp_path / "cache")
    with pytest.raises(LocalModelError, match="no such file"):
        load_tokenizer(tmp_path / "absent.gguf")
    assert not (tmp_path / "cache").exists()


def test_missing_packages_name_the_extra(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` now raises ImportError
    with pytest.raises(ImportError, match=r"'gguf'.*pip install -e '\.\[atropos\]'"):
        load_tokenizer(tmp_path)
