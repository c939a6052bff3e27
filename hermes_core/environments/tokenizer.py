"""The tokenizer of a GGUF model file as a Hugging Face fast tokenizer, whose ids equal llama.cpp's.

A trainer needs the ids the served model saw; llama.cpp tokenizes from the vocabulary inside the GGUF
file, so that vocabulary is the reference. It is read with the `gguf` package and converted by
transformers' own GGUF tokenizer converter, once per file content: the result, `tokenizer.json` and
`tokenizer_config.json` (chat template, bos/eos), is cached in a folder named after the file's sha256,
which `AutoTokenizer.from_pretrained` loads offline. Nothing here imports torch (transformers'
`load_gguf_checkpoint` and GGUF reader do, so they are not used). Needs the `atropos` extra.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermes_core.endpoints.local_model import resolve_gguf
from hermes_core.fileio import FileTableCache, fsync_path

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

EXTRA_HINT = "pip install -e '.[atropos]'"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
_DIGESTS = FileTableCache(size=16)  # a 100 MB-10 GB file is hashed once per process while unchanged


class TokenizerUnavailable(ValueError):
    """The tokenizer asked for by name is not on this machine, and fetching it would need the network."""


def _require_extra() -> None:
    """One clear error when the optional packages of the `atropos` extra are missing."""
    try:
        import gguf  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"tokenizers from GGUF files need the optional package {exc.name or 'gguf/transformers'!r}:"
                          f" run {EXTRA_HINT}") from exc


def default_cache_root() -> Path:
    """`$HERMES_CACHE_DIR/tokenizers`, else `~/.cache/hermes-foundry/tokenizers` ($XDG_CACHE_HOME honoured)."""
    base = os.environ.get("HERMES_CACHE_DIR")
    if not base:
        base = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hermes-foundry")
    return Path(base) / "tokenizers"


def file_sha256(path: Path) -> str:
    """The file's sha256 (hex), computed once per process while the file is unchanged."""
    def digest() -> str:
        hasher = hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                hasher.update(chunk)
        return hasher.hexdigest()
    return _DIGESTS.get(path.resolve(), digest)


def read_gguf_tokenizer(gguf_path: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """`(architecture, tokenizer_dict, tokenizer_config)` from the file's metadata, in the shapes
    transformers' converter takes (its key mapping, so new GGUF keys follow transformers upgrades)."""
    from gguf import GGUFReader
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING

    fields = GGUFReader(gguf_path).fields

    def value(key: str) -> Any:
        return fields[key].contents() if key in fields else None

    groups = {group: {name: value(f"tokenizer.{key}") for key, name in renames.items()}
              for group, renames in GGUF_TOKENIZER_MAPPING.items()}
    tokenizer_dict = {name: found for name, found in groups["tokenizer"].items() if found is not None}
    config = {name: found for name, found in groups["tokenizer_config"].items() if found is not None}
    if tokenizer_dict.get("tokenizer_type") == "llama":
        config.setdefault("add_bos_token", True)  # llama.cpp's default for a sentencepiece vocabulary without the flag
    tokens = tokenizer_dict.get("tokens") or []
    for role in ("bos", "eos", "unk", "pad"):
        token_id = tokenizer_dict.get(f"{role}_token_id")
        if token_id is not None and 0 <= token_id < len(tokens):
            config[f"{role}_token"] = tokens[token_id]
    return value("general.architecture"), tokenizer_dict, config


def convert_into(gguf_path: Path, folder: Path) -> None:
    """Write the converted tokenizer's files into `folder` (an empty, private staging folder)."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    architecture, tokenizer_dict, config = read_gguf_tokenizer(gguf_path)
    backend, extra = convert_gguf_tokenizer(architecture, tokenizer_dict)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, **{**config, **extra})
    # The chat template goes into tokenizer_config.json itself, not a separate .jinja file.
    tokenizer.save_pretrained(folder, save_jinja_files=False)


def _publish(staging: Path, final: Path) -> None:
    """Move a complete staging folder to `final` in one rename; when another converter got there first,
    keep its folder (same file, same result): the caller then drops ours."""
    for name in TOKENIZER_FILES:
        fsync_path(staging / name)
    os.chmod(staging, 0o755)  # mkdtemp's 0700 would hide the cache from the other users of a shared cache dir
    try:
        os.rename(staging, final)  # fails on an existing non-empty folder: never half-overwrites a finished one
    except OSError:
        if not (final / TOKENIZER_FILES[0]).is_file():
            raise
    fsync_path(final.parent)


def tokenizer_dir(gguf: str | Path | None = None, cache_dir: Path | None = None) -> Path:
    """The folder of the converted tokenizer of `gguf` (default: the bundled SmolLM2 file):
    `<cache_dir>/<sha256[:16]>/` (cache_dir defaults to `default_cache_root()`), converted on first use.

    The folder appears whole or not at all (written aside, then renamed), so concurrent converters of
    one file are safe; a converter killed midway leaves only a stray `.<digest>.*` folder beside it."""
    gguf_path = resolve_gguf(gguf)
    root = Path(cache_dir) if cache_dir is not None else default_cache_root()
    digest = file_sha256(gguf_path)[:16]
    final = root / digest
    if (final / TOKENIZER_FILES[0]).is_file():
        return final
    _require_extra()
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{digest}.", dir=root))
    try:
        convert_into(gguf_path, staging)
        _publish(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already, unless the conversion failed or lost the race
    return final


def cached_snapshot(name: str) -> Path | None:
    """The folder of `name`'s tokenizer in the local Hugging Face cache, found on disk only, or None.

    Not `from_pretrained(name, local_files_only=True)`: on its way to the cache, huggingface_hub
    (2.4) still fetches an "agent harnesses" list from the Hub unless HF_HUB_OFFLINE was set at import."""
    from huggingface_hub import try_to_load_from_cache

    for filename in ("tokenizer_config.json", "tokenizer.json"):
        found = try_to_load_from_cache(name, filename)  # a path, None, or a "known absent" marker
        if isinstance(found, str):
            return Path(found).parent
    return None


def _cached_or_unavailable(name: str) -> Path:
    """`cached_snapshot(name)`, or TokenizerUnavailable saying how to give a tokenizer offline."""
    instead = "give a local folder holding tokenizer.json, or a .gguf model file (converted offline), instead"
    try:
        snapshot = cached_snapshot(name)
    except ValueError as exc:  # huggingface_hub's HFValidationError: not a repo name at all
        raise TokenizerUnavailable(f"tokenizer {name!r} is no folder, GGUF file or valid model name ({exc}); "
                                   f"{instead}") from exc
    if snapshot is None:
        raise TokenizerUnavailable(f"tokenizer {name!r} is not in the local Hugging Face cache and getting it "
                                   f"would need the network, which this loader never uses; {instead}")
    return snapshot


def _folder(source: str | Path | None) -> Path:
    """The folder of the tokenizer `source` names (see `load_tokenizer`)."""
    path = Path(source).expanduser() if source is not None else None
    if path is None or path.is_file() or path.suffix == ".gguf":
        return tokenizer_dir(path)
    return path if path.is_dir() else _cached_or_unavailable(str(source))


def load_tokenizer(source: str | Path | None = None) -> PreTrainedTokenizerFast:
    """A fast tokenizer, never fetched from the network.

    `source`: None (the bundled SmolLM2 GGUF) or a GGUF file -> its converted tokenizer (`tokenizer_dir`);
    a folder -> the tokenizer saved there; else a model name, which must already be in the local
    Hugging Face cache (`TokenizerUnavailable` otherwise)."""
    _require_extra()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_folder(source), local_files_only=True)


class TurnTokenizer:
    """What rendering a rollout with our own template needs of a tokenizer (`tokens.ChatTokenizer`), read
    from its tokenizer.json by the `tokenizers` package: 0.3 s where importing and loading transformers'
    tokenizer took 3 s at the start of every environment run. Same vocabulary, same ids."""

    def __init__(self, folder: Path) -> None:
        import tokenizers

        self.name_or_path = str(folder)
        self.backend_tokenizer = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        config_file = folder / "tokenizer_config.json"
        config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
        self.chat_template = config.get("chat_template")
        self.all_special_tokens = [token.content for token in self.backend_tokenizer.get_added_tokens_decoder().values()
                                   if token.special]

    def __call__(self, text: str, add_special_tokens: bool = False, return_offsets_mapping: bool = False) -> dict:
        encoded = self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return {"input_ids": encoded.ids, "offset_mapping": encoded.offsets}

    def decode(self, ids: list[int]) -> str:
        return self.backend_tokenizer.decode(ids, skip_special_tokens=False)


def load_rollout_tokenizer(source: str | Path | None = None) -> Any:
    """The tokenizer rollouts are rendered with: a `TurnTokenizer` when our template renders them (the
    model's own cannot render tools), else transformers' (the model's template through jinja)."""
    from hermes_core.environments.tokens import template_for

    light = TurnTokenizer(_folder(source))
    return light if template_for(light)[1] == "hermes" else load_tokenizer(source)
