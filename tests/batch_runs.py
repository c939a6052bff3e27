"""What tests write and read around a batch run: datasets, JSONL outputs, ledger records, and
what the simulated endpoint was sent."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path

from hermes_assets.cli import batch_main


def write_dataset(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def read_jsonl(path: Path, whole_lines: bool = False) -> list[dict]:
    """A JSONL file's records; `whole_lines`: leave out a last line still being written (no newline yet)."""
    # "\n" only: records may hold U+2028 or U+0085 raw, which str.splitlines() would break on.
    lines = path.read_text(encoding="utf-8").split("\n")
    return [json.loads(line) for line in (lines[:-1] if whole_lines else lines) if line.strip()]


def ledger_records(run_dir: Path) -> list[dict]:
    """The ledger's records so far: a run in progress may be appending to a last line."""
    return [r for path in sorted((run_dir / "raw").glob("*.jsonl")) for r in read_jsonl(path, whole_lines=True)]


def record(key: str, partition: str = "b00001-x", disposition: str = "kept", calls: int = 2) -> dict:
    return {"sample_key": key, "partition_key": partition, "disposition": disposition, "api_calls": calls,
            "usage": {"total_tokens": 10}}


def prompts(n: int, label: str, latency: float | None = None) -> list[dict]:
    """`n` rows no other test sends; with `latency`, the simulated endpoint answers each call that late."""
    tag = uuid.uuid4().hex[:6]
    slow = f" [sim:latency={latency}]" if latency else ""
    return [{"prompt": f"{label} {tag} #{i}: run a command{slow}"} for i in range(n)]


class Sent:
    """Sample starts the simulated endpoint received since this object was made, per prompt."""

    def __init__(self, server):
        self.server, self.before = server, Counter(server.log.sample_starts)

    def counts(self) -> Counter:
        now = Counter(self.server.log.sample_starts)
        now.subtract(self.before)
        return +now


def run(dataset: Path, url: str, *extra: str, run_name: str = "rs") -> int:
    return batch_main([f"--dataset_file={dataset}", f"--run_name={run_name}", f"--base_url={url}", "--api_key=k",
                       "--distribution=terminal_only", "--batch_size=20", "--num_workers=4", "--max_retries=0",
                       *extra])
