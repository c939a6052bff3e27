"""One conversion of the bundled GGUF's tokenizer for the whole session (about 10 s each)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tokenizer_cache(tmp_path_factory) -> Path:
    """A private cache folder holding the bundled model's converted tokenizer."""
    pytest.importorskip("gguf", reason="the atropos extra (make test installs it)")
    from hermes_core.endpoints.local_model import bundled_gguf
    from hermes_core.environments.tokenizer import tokenizer_dir

    if bundled_gguf() is None:
        pytest.skip("needs the bundled SmolLM2 GGUF (make local)")
    cache = tmp_path_factory.mktemp("cache") / "tokenizers"  # the layout under $HERMES_CACHE_DIR
    tokenizer_dir(None, cache_dir=cache)
    return cache
