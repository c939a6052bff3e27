"""A one-line progress bar for long runs: samples done/total, rate, ETA, tokens, failures."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from hermes_core.formats.filters import Disposition


class Progress:
    def __init__(self, total: int | None = None, stream: TextIO | None = None, min_interval_s: float = 0.2,
                 verbose: bool = False, preview_chars: int = 100):
        self.total = total or 0
        self.verbose = verbose  # also one line per finished sample
        self.preview_chars = preview_chars  # of each tool call's arguments (the recipe's log_prefix_chars)
        self.stream = stream or sys.stderr
        self.done = self.kept = self.failed = self.discarded = self.tokens = 0
        self.started = time.monotonic()
        self._last_draw = 0.0
        self._tty = self.stream.isatty()
        self._min_interval_s = min_interval_s if self._tty else 5.0  # logs get a line every few seconds

    def start(self, total: int) -> None:
        self.total, self.started = total, time.monotonic()
        self.stream.write(f"running {total} sample(s)\n" if total else "nothing to run: every sample is done\n")

    def update(self, record: dict[str, Any]) -> None:
        self.done += 1
        self.tokens += record["usage"]["total_tokens"]
        disposition = record["disposition"]
        if disposition == Disposition.KEPT:
            self.kept += 1
        elif disposition in (Disposition.FAILED_RETRYABLE, Disposition.FAILED_TERMINAL):
            self.failed += 1
        else:
            self.discarded += 1
        if self.verbose:
            error = f": {record['error']}" if record.get("error") else ""
            restart = "\r" if self._tty else ""  # overwrite the bar, which is redrawn below
            self.stream.write(f"{restart}#{record['prompt_index']} {disposition} "
                              f"({record['api_calls']} calls, {record['duration_s']:.1f}s){error}\n")
            for call in (c for m in record.get("messages") or () for c in m.get("tool_calls") or ()):
                function = call.get("function") or {}
                self.stream.write(f"  [P{record['prompt_index']}] {function.get('name')}: "
                                  f"{self._preview(str(function.get('arguments')))}\n")
        now = time.monotonic()
        if now - self._last_draw >= self._min_interval_s or self.done == self.total:
            self._last_draw = now
            self._draw(now)

    def _preview(self, text: str) -> str:
        """`text` cut to `preview_chars`, marked when cut (as the original's log previews are)."""
        return text if len(text) <= self.preview_chars else text[:self.preview_chars] + "..."

    def _draw(self, now: float) -> None:
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate else 0.0
        width = 24
        filled = int(width * self.done / self.total) if self.total else width
        line = (
            f"[{'#' * filled}{'-' * (width - filled)}] {self.done}/{self.total} "
            f"{rate * 60:.1f}/min ETA {eta:.0f}s | kept {self.kept} discarded {self.discarded} "
            f"failed {self.failed} | tokens {self.tokens}"
        )
        self.stream.write(("\r" + line) if self._tty else (line + "\n"))
        self.stream.flush()

    def finish(self) -> None:
        if self.total and self._tty:
            self.stream.write("\n")
            self.stream.flush()
