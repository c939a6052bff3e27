"""Sample keys (SPEC §2) stay byte-for-byte what the spec defines, however they are computed."""

from __future__ import annotations

import hashlib
import json

import pytest

from hermes_core.batch.dataset import sample_key


@pytest.mark.parametrize("prompt, image, cwd, occurrence", [
    ("plain", None, None, 0),
    ('quotes " and \\ backslash, \n newline \t tab \x01 control', "python:3.11", "/srv/app", 2),
    ("unicode é 中文 \u2028 😀", None, "relative/dir", 11),
    ("", "", "", 0),
])
def test_sample_key_is_the_sha256_of_the_canonical_identity(prompt, image, cwd, occurrence):
    identity = json.dumps({"prompt": prompt, "image": image, "cwd": cwd, "occurrence": occurrence},
                          sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    expected = hashlib.sha256((identity + "fingerprint").encode("utf-8")).hexdigest()
    assert sample_key(prompt, image, cwd, occurrence, "fingerprint") == expected
