"""A real S3 API on 127.0.0.1 (moto's server) and a fresh bucket per test, reached through s3fs the
way a deployment reaches S3, MinIO or Ceph: credentials and FSSPEC_S3_ENDPOINT_URL in the environment."""

from __future__ import annotations

import logging
import uuid
from typing import Iterator

import fsspec.config
import pytest
from fsspec.core import url_to_fs

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture()
def s3_ledger(s3_endpoint: str, isolated_homes, monkeypatch) -> str:
    """A fresh bucket; HERMES_LEDGER_URL names a prefix in it. Returns that URL."""
    for name, value in {**CREDENTIALS, "FSSPEC_S3_ENDPOINT_URL": s3_endpoint}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": s3_endpoint})  # fsspec reads the env at import
    bucket = f"ledgers-{uuid.uuid4().hex[:8]}"
    fs, _ = url_to_fs(f"s3://{bucket}")
    fs.mkdir(bucket)
    monkeypatch.setenv("HERMES_LEDGER_URL", f"s3://{bucket}/hermes")
    return f"s3://{bucket}/hermes"
