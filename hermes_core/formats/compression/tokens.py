"""Offline token counting for trajectory compression (SPEC §10).

Two counters, both strictly local (nothing is ever fetched from a model hub):
- `TokenizerFileCounter`: a `tokenizer.json` file (Hugging Face `tokenizers` format), exact for the
  model it belongs to. Needs the optional `tokenizers` package.
- `ApproximateCounter`: ceil(characters / 4), the usual rule of thumb for English text and code
  with BPE vocabularies. It is deterministic and dependency-free, but only an estimate: expect
  ±25% against a real tokenizer (more for CJK text, which runs closer to 1 token per character).

Both add `TURN_OVERHEAD` tokens per conversation turn for the role markers a chat template wraps
around every message (e.g. `<|im_start|>assistant\\n ... <|im_end|>\\n`), so budgets compare to what
a trainer actually sees rather than to the bare text.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, Protocol, Sequence

TURN_OVERHEAD = 4
CHARS_PER_TOKEN = 4
APPROXIMATION = f"approximate: ceil(chars/{CHARS_PER_TOKEN}) per turn value + {TURN_OVERHEAD} tokens per turn"


class TokenizerError(ValueError):
    """The tokenizer cannot be used (missing file, unreadable file, `tokenizers` not installed)."""


class TokenCounter(Protocol):
    kind: str  # "tokenizer_file" or "approximate"

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """Token counts of several texts (batched: a real tokenizer encodes them in parallel)."""
        ...

    def describe(self) -> dict[str, Any]:
        """What the counts mean, recorded in the metrics so numbers are never mistaken for exact."""
        ...


class ApproximateCounter:
    kind = "approximate"

    def __init__(self, note: str | None = None) -> None:
        self.note = note  # why the approximation stands in for a named tokenizer

    def count_many(self, texts: Sequence[str]) -> list[int]:
        return [math.ceil(len(text) / CHARS_PER_TOKEN) for text in texts]

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": None,
                "description": APPROXIMATION + (f" ({self.note})" if self.note else "")}


class TokenizerFileCounter:
    kind = "tokenizer_file"

    def __init__(self, path: str | Path) -> None:
        self.path = _tokenizer_file(Path(path))
        try:
            from tokenizers import Tokenizer  # optional dependency: only needed for exact counts
        except ImportError as exc:
            raise TokenizerError(
                f"--tokenizer {self.path} needs the `tokenizers` package (pip install tokenizers); "
                "without --tokenizer the approximate counter is used"
            ) from exc
        try:
            self._tokenizer = Tokenizer.from_file(str(self.path))
        except Exception as exc:  # the Rust loader raises a bare Exception on malformed files
            raise TokenizerError(f"{self.path}: not a valid tokenizer.json ({exc})") from exc

    def count_many(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [len(encoding.ids) for encoding in encodings]

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": str(self.path),
                "description": f"tokenizer file {self.path.name} + {TURN_OVERHEAD} tokens per turn"}


def _tokenizer_file(path: Path) -> Path:
    """A tokenizer.json file, or a local model folder holding one. Hub names are refused, not fetched."""
    candidate = path / "tokenizer.json" if path.is_dir() else path
    if not candidate.is_file():
        raise TokenizerError(
            f"{path}: no such local tokenizer file (pass a tokenizer.json or a folder containing one; "
            "hermes-compress never downloads tokenizers)"
        )
    return candidate.resolve()


def load_counter(tokenizer: str | Path | None) -> TokenCounter:
    """The counter for `--tokenizer`: exact from a local file, else the documented approximation."""
    return TokenizerFileCounter(tokenizer) if tokenizer else ApproximateCounter()


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def hub_cache_file(name: str) -> Path | None:
    """The tokenizer.json of Hugging Face hub model `name` if it is already in the local hub cache."""
    home = os.environ.get("HF_HOME") or str(Path("~/.cache/huggingface").expanduser())
    cache = Path(os.environ.get("HF_HUB_CACHE") or Path(home) / "hub")
    found = sorted(cache.glob(f"models--{name.replace('/', '--')}/snapshots/*/tokenizer.json"))
    return found[-1] if found else None


def counter_for_name(name: str) -> TokenCounter:
    """The counter for a tokenizer named in a config file, as the original names it: a local file
    or folder is used as such; a hub id (`org/model`) is read from the local Hugging Face cache when
    it is there, else the approximate counter stands in (never downloaded); any other missing path
    raises TokenizerError."""
    path = Path(name).expanduser()
    if path.exists() or not HUB_ID.match(name):
        return TokenizerFileCounter(path)
    cached = hub_cache_file(name)
    if cached is not None:
        return TokenizerFileCounter(cached)
    return ApproximateCounter(note=f"{name!r} is a model hub id that is not in the local Hugging Face cache; "
                              "hermes-compress never downloads tokenizers")


def turn_tokens(turns: Sequence[dict[str, Any]], counter: TokenCounter) -> list[int]:
    """Tokens per ShareGPT turn: its value plus the per-turn template overhead."""
    counts = counter.count_many([str(turn.get("value") or "") for turn in turns])
    return [count + TURN_OVERHEAD for count in counts]
