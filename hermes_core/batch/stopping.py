"""Stopping a run early without losing work (SPEC §5): a signal or a budget stops the scheduling of
new samples, the samples in flight finish and are recorded, and the run stays resumable.

`interrupt` is this process's: the command line's SIGINT/SIGTERM handler sets it. A `Budget` stops
one invocation when the run's spend (every attempt ever recorded in the ledger, so a resume counts
nothing twice) reaches a limit.
"""

from __future__ import annotations

import fnmatch
import os
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import yaml


class StopRequest:
    """Why new samples must not start, once set; the first reason wins."""

    def __init__(self) -> None:
        self._reason: str | None = None
        self._lock = threading.Lock()

    def request(self, reason: str) -> None:
        with self._lock:
            self._reason = self._reason or reason

    def clear(self) -> None:
        with self._lock:
            self._reason = None

    @property
    def reason(self) -> str | None:
        return self._reason


interrupt = StopRequest()  # set by `graceful_signals`


@contextmanager
def graceful_signals(on_abort: Callable[[], None] | None = None) -> Iterator[None]:
    """While a pool of samples runs: the first SIGINT/SIGTERM starts no new sample and lets those in
    flight finish and be recorded; a second calls `on_abort` (the orchestrator's chance to release
    what the run holds) and exits at once (records are whole lines and files are replaced
    atomically: nothing is half written). Only the main thread can take signals; elsewhere this
    does nothing."""
    interrupt.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, _frame: object) -> None:
        if interrupt.reason:
            print("\nsecond signal: aborting now; finished samples are saved, run the same command to resume",
                  file=sys.stderr, flush=True)
            try:
                if on_abort:
                    on_abort()
            finally:
                os._exit(130)
        interrupt.request(f"interrupted by {signal.Signals(signum).name}")
        print(f"\n{interrupt.reason}: finishing the samples in flight (again to abort now)", file=sys.stderr, flush=True)

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class PriceError(ValueError):
    """The price table is invalid, or has no price for a model a cost budget needs."""


@dataclass(frozen=True)
class Price:
    prompt_per_mtok: float  # USD per million prompt tokens
    completion_per_mtok: float

    def cost(self, usage: Mapping[str, Any]) -> float:
        return (usage.get("prompt_tokens", 0) * self.prompt_per_mtok
                + usage.get("completion_tokens", 0) * self.completion_per_mtok) / 1e6


BUILTIN_PRICES = {"hermes-sim": Price(0.0, 0.0)}


def load_prices(path: str | Path | None) -> dict[str, Price]:
    """`model-glob: {prompt_per_mtok: X, completion_per_mtok: Y}` from a YAML/JSON file, in file order,
    then the built-ins (the first entry that matches a model wins)."""
    prices: dict[str, Price] = {}
    if not path:
        return dict(BUILTIN_PRICES)
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise PriceError(f"{path}: cannot read the price table: {exc}") from None
    if not isinstance(raw, dict):
        raise PriceError(f"{path}: expected a mapping of model name (or glob) to prices")
    for model, entry in raw.items():
        try:
            prices[str(model)] = Price(float(entry["prompt_per_mtok"]), float(entry["completion_per_mtok"]))
        except (TypeError, KeyError, ValueError):
            raise PriceError(f"{path}: {model}: expected {{prompt_per_mtok: <USD>, completion_per_mtok: <USD>}}") from None
    return {**prices, **{model: price for model, price in BUILTIN_PRICES.items() if model not in prices}}


def price_of(model: str, prices: Mapping[str, Price]) -> Price | None:
    """The first entry that names `model` or whose glob matches it."""
    return next((p for glob, p in prices.items() if glob == model or fnmatch.fnmatchcase(model, glob)), None)


@dataclass(frozen=True)
class Budget:
    """Limits on a run's spend, counted over every attempt ever recorded."""

    max_cost_usd: float | None = None
    max_tokens_total: int | None = None

    def exceeded(self, spent: Mapping[str, float]) -> str | None:
        """Why the run must stop scheduling, or None."""
        if self.max_tokens_total is not None and spent.get("total_tokens", 0) >= self.max_tokens_total:
            return f"budget reached: {int(spent['total_tokens'])} tokens of max_tokens_total {self.max_tokens_total}"
        if self.max_cost_usd is not None and spent.get("cost_usd", 0.0) >= self.max_cost_usd:
            return f"budget reached: ${spent['cost_usd']:.4f} of max_cost_usd ${self.max_cost_usd:.4f}"
        return None
