"""The ledger on object storage against the ledger in the run folder, on the same records: the cost
of recording a finished sample, of a fresh process loading the ledger, and of reading the kept
trajectories back, before and after each batch (100 records) is folded into one segment. The store is moto's S3 server on 127.0.0.1 in its own process: no network
latency, so these are lower bounds on a real bucket, where each request adds a round trip
(~10-30 ms) and the concurrent fetches hide most of it.

    .venv/bin/python bench/object_ledger.py [--records 2000]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fsspec.core import url_to_fs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hermes_core.batch.ledger import Ledger  # noqa: E402
from hermes_core.batch.object_ledger import ObjectLedger  # noqa: E402


def record(i: int) -> dict:
    turns = [{"from": "gpt" if t % 2 else "human", "value": f"turn {t} of sample {i} " + "x" * 400} for t in range(20)]
    return {"sample_key": f"s{i:06d}", "partition_key": f"b{i // 100:05d}-bench", "disposition": "kept",
            "api_calls": 3, "usage": {"total_tokens": 900}, "row": {"conversations": turns, "tool_stats": {}}}


def moto_server() -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return server, f"http://127.0.0.1:{port}"
        time.sleep(0.1)
    raise RuntimeError("moto_server did not start")


def measure(open_ledger, records: list[dict]) -> dict[str, float]:
    ledger = open_ledger()
    started = time.perf_counter()
    for item in records:
        ledger.append(item["partition_key"], item)
    appended = time.perf_counter() - started
    started = time.perf_counter()
    fresh = open_ledger()  # another process, or a pod that starts after a crash
    loaded = time.perf_counter() - started
    started = time.perf_counter()
    count = sum(1 for _ in fresh.records(sorted(fresh.latest)))
    read = time.perf_counter() - started
    assert len(fresh.latest) == count == len(records)
    result = {"append ms/record": 1000 * appended / len(records), "fresh load s": loaded, "read back s": read}
    started = time.perf_counter()
    for partition in sorted({item["partition_key"] for item in records}):
        ledger.compact(partition)  # what each batch's run does when it ends
    result["fold s"] = time.perf_counter() - started
    started = time.perf_counter()
    folded = open_ledger()
    result["folded: load s"] = time.perf_counter() - started
    started = time.perf_counter()
    assert sum(1 for _ in folded.records(sorted(folded.latest))) == len(records)
    result["folded: read s"] = time.perf_counter() - started
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2000)
    args = parser.parse_args()
    records = [record(i) for i in range(args.records)]
    server, endpoint = moto_server()
    try:
        os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
        fs, _ = url_to_fs("s3://bench", endpoint_url=endpoint)
        fs.mkdir("bench")
        import fsspec.config

        fsspec.config.conf["s3"] = {"endpoint_url": endpoint}
        with tempfile.TemporaryDirectory() as folder:
            local = measure(lambda: Ledger(Path(folder) / "raw"), records)
        remote = measure(lambda: ObjectLedger("s3://bench/run"), records)
    finally:
        server.terminate()
    print(f"{args.records} records of ~{len(str(records[0])) // 1000} KB")
    print(f"{'':18}{'run folder':>12}{'S3 (moto)':>12}{'ratio':>8}")
    for name in local:
        ratio = f"{remote[name] / local[name]:8.1f}" if local[name] else f"{'':8}"
        print(f"{name:18}{local[name]:12.3f}{remote[name]:12.3f}{ratio}")


if __name__ == "__main__":
    main()
