"""Sample keys (SPEC §2) stay byte-for-byte what the spec defines, however they are computed; every
input byte is either kept exactly or refused naming its file and line (SPEC §1)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from hermes_core.batch.dataset import DatasetError, dataset_path, load_dataset, sample_key


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


# --- every input byte (issue 17, item 6) ---------------------------------------------------------

def write_bytes(path, lines: list[bytes]):
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def row(value: dict) -> bytes:
    """A row as `json.dumps(ensure_ascii=False)` writes it: U+2028, U+0085 ... stay raw."""
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


# Every character str.splitlines() breaks on besides "\n" and "\r": legal raw inside a JSON string.
LINE_BREAKERS = "\u2028\u2029\x85\x1c\x1d\x1e"


def test_records_split_on_newline_only_and_prompts_stay_byte_exact(tmp_path):
    prompts = [f"before{char}after" for char in LINE_BREAKERS]
    dataset = write_bytes(tmp_path / "d.jsonl", [row({"prompt": p}) for p in prompts]
                          + [row({"prompt": "windows line end"}) + b"\r"])
    loaded = load_dataset(dataset, "fp")
    assert [s.prompt for s in loaded.samples] == [*prompts, "windows line end"]
    assert [s.line for s in loaded.samples] == list(range(1, len(prompts) + 2))
    assert loaded.invalid == []


def test_a_byte_order_mark_is_not_part_of_the_first_record(tmp_path):
    dataset = write_bytes(tmp_path / "d.jsonl", [b"\xef\xbb\xbf" + row({"prompt": "first"}), row({"prompt": "second"})])
    loaded = load_dataset(dataset, "fp")
    assert [s.prompt for s in loaded.samples] == ["first", "second"] and loaded.invalid == []


def test_invalid_utf8_is_refused_with_its_lines(tmp_path):
    dataset = write_bytes(tmp_path / "d.jsonl", [
        row({"prompt": "fine"}), b'{"prompt": "bad \xff byte"}', row({"prompt": "fine \u2028 too"}),
        b'{"prompt": "truncated \xe2\x82"}'])
    with pytest.raises(DatasetError) as refused:
        load_dataset(dataset, "fp")
    message = str(refused.value)
    assert str(dataset) in message and "2 invalid line(s)" in message
    assert "line 2: not valid UTF-8 (byte 0xff at column 17)" in message
    assert "line 4: not valid UTF-8 (byte 0xe2" in message
    skipped = load_dataset(dataset, "fp", skip_invalid=True)  # counted, never replaced by U+FFFD
    assert [s.prompt for s in skipped.samples] == ["fine", "fine \u2028 too"]
    assert [bad.line for bad in skipped.invalid] == [2, 4]


def test_lone_surrogates_are_refused_with_file_and_line(tmp_path):
    dataset = write_bytes(tmp_path / "d.jsonl", [
        row({"prompt": "pair \U0001F600"}), rb'{"prompt": "pair \ud83d\ude00"}', rb'{"prompt": "lone \ud800"}',
        rb'{"prompt": "ok", "metadata": {"k": "\udfff"}}', rb'{"prompt": "escaped \\ud800 is text"}'])
    with pytest.raises(DatasetError) as refused:
        load_dataset(dataset, "fp")
    message = str(refused.value)
    assert str(dataset) in message and "2 invalid line(s)" in message
    assert "line 3: holds a lone surrogate" in message and "line 4: holds a lone surrogate" in message
    kept = load_dataset(dataset, "fp", skip_invalid=True).samples
    assert [s.prompt for s in kept] == ["pair \U0001F600", "pair \U0001F600", "escaped \\ud800 is text"]


def test_paths_that_are_no_dataset_file_are_named(tmp_path):
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "fifo")  # reading it would block forever: refused before any read
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    for name, reason in (("folder", "is a directory"), ("fifo", "not a regular file"),
                         ("dangling", "broken or looping symbolic link"), ("loop1", "broken or looping symbolic link"),
                         ("absent", "dataset file not found")):
        with pytest.raises(DatasetError, match=reason) as refused:
            dataset_path(tmp_path / name)
        assert str(refused.value).startswith(f"{tmp_path / name}: ")
        with pytest.raises(DatasetError, match=reason):
            load_dataset(tmp_path / name, "fp")


def test_a_read_that_fails_is_a_dataset_error(tmp_path, monkeypatch):
    with pytest.raises(DatasetError, match=r"^/proc/self/mem: cannot read the dataset file: Input/output error"):
        load_dataset("/proc/self/mem", "fp")  # a regular file whose read fails (EIO), even for root
    dataset = write_bytes(tmp_path / "d.jsonl", [row({"prompt": "hi"})])

    def denied(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)  # tests run as root: chmod 000 would not stop a read
    with pytest.raises(DatasetError, match=f"^{dataset}: cannot read the dataset file: Permission denied"):
        load_dataset(dataset, "fp")


def test_a_cwd_in_a_reserved_folder_is_refused_however_spelled(tmp_path):
    """Issue 28: posixpath.normpath keeps two leading slashes, so `//etc`, `//proc` passed the
    reserved-folder checks, and the samples whose sandboxes they broke were kept as data."""
    dataset = write_bytes(tmp_path / "d.jsonl", [
        row({"prompt": "fine", "cwd": "/srv/app"}),
        row({"prompt": "a", "cwd": "//etc"}),
        row({"prompt": "b", "cwd": "//proc", "image": "python:3.11"}),
        row({"prompt": "c", "cwd": "///usr"}),
        row({"prompt": "d", "cwd": "/./proc/..//proc"}),
        row({"prompt": "e", "cwd": "//"}),
        row({"prompt": "an image's own /usr", "cwd": "//usr/src/app", "image": "node:20"}),
        row({"prompt": "f", "cwd": "/app\u0000x"}),
    ])
    with pytest.raises(DatasetError) as refused:
        load_dataset(dataset, "fp")
    lines = str(refused.value).splitlines()
    assert lines[0] == f"{dataset}: 6 invalid line(s); nothing was run (fix them or pass --skip-invalid):"
    assert lines[1] == ("  line 2: field 'cwd' '//etc' is inside the host's read-only /etc (that is /etc): without "
                        "an image, the sandbox's system folders are the host's; choose another working directory "
                        "or give the row an image")
    assert lines[2] == ("  line 3: field 'cwd' '//proc' is inside /proc (that is /proc), the kernel's own folder, "
                        "which no sandbox uses as a working directory")
    assert lines[3].startswith("  line 4: field 'cwd' '///usr' is inside the host's read-only /usr (that is /usr):")
    assert lines[4].startswith("  line 5: field 'cwd' '/./proc/..//proc' is inside /proc (that is /proc), ")
    assert lines[5].startswith("  line 6: field 'cwd' '//' is the root folder (that is /)")
    assert lines[6] == "  line 8: field 'cwd' '/app\\x00x' contains a NUL byte"
    kept = load_dataset(dataset, "fp", skip_invalid=True).samples
    assert [(s.line, s.cwd) for s in kept] == [(1, "/srv/app"), (7, "//usr/src/app")]  # keys as the rows spell them
