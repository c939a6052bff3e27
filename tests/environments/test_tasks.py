"""Task files: validated like datasets, one error naming each bad line, nothing run."""

from __future__ import annotations

import json

import pytest

from hermes_core.environments.tasks import TaskFileError, load_tasks


def write(path, rows):
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def test_a_task_file_loads_with_its_splits_and_categories(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_add.py").write_text("def test_add():\n    assert True\n")
    tasks = load_tasks(write(tmp_path / "tasks.jsonl", [
        {"id": "a", "prompt": "run it", "verifier": {"type": "command", "command": "true"}, "category": "shell"},
        {"id": "b", "prompt": "code it", "verifier": {"type": "pytest", "tests": "tests"}, "split": "eval"},
    ]))
    assert [t.id for t in tasks.tasks] == ["a", "b"]
    assert [t.id for t in tasks.split("eval")] == ["b"] and tasks.tasks[0].category == "shell"
    assert tasks.tasks[1].verifier.files == (("test_add.py", b"def test_add():\n    assert True\n"),)


def test_every_bad_line_is_named_and_nothing_loads(tmp_path):
    path = write(tmp_path / "tasks.jsonl", [
        {"id": "a", "prompt": "p", "verifier": {"type": "command", "command": "true"}},
        "{not json",
        {"id": "a", "prompt": "p2", "verifier": {"type": "command", "command": "true"}},
        {"id": "c", "prompt": "p", "verifier": {"type": "file_equals", "path": "x"}},
        {"id": "d", "prompt": "p", "verifier": {"type": "pytest", "tests": "missing_tests"}},
        {"id": "e", "prompt": "p", "verifier": {"type": "dance"}},
        {"id": "f", "prompt": "p", "verifier": {"type": "command", "command": "true"}, "split": "test"},
        {"id": "g", "prompt": "p"},
        {"prompt": "p", "verifier": {"type": "command", "command": "true"}},
        {"id": "h", "prompt": "p", "verifier": {"type": "command", "command": "true", "timeout": -1}},
    ])
    with pytest.raises(TaskFileError) as caught:
        load_tasks(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: 9 invalid line(s); nothing was run")
    for expected in ("line 2: not valid JSON", "line 3: id 'a' repeats line 1", "line 4: field 'verifier': 'content' must be a string",
                     "line 5: field 'verifier': 'missing_tests': no such file or folder", "line 6: field 'verifier': 'type' must be one of",
                     "line 7: field 'split' must be one of train, eval", "line 8: missing field 'verifier'",
                     "line 9: field 'id' must be a non-empty string", "line 10: field 'verifier': 'timeout' must be a positive"):
        assert expected in message


def test_a_changed_verifier_or_test_file_is_a_new_task(tmp_path):
    (tmp_path / "t.py").write_text("def test_x(): pass\n")
    row = {"id": "a", "prompt": "p", "verifier": {"type": "pytest", "tests": "t.py"}}
    first = load_tasks(write(tmp_path / "tasks.jsonl", [row])).tasks[0].key
    assert load_tasks(write(tmp_path / "tasks.jsonl", [row])).tasks[0].key == first
    (tmp_path / "t.py").write_text("def test_x(): assert 0\n")
    assert load_tasks(write(tmp_path / "tasks.jsonl", [row])).tasks[0].key != first


def test_a_missing_file_and_an_empty_file_say_so(tmp_path):
    with pytest.raises(TaskFileError, match="task file not found"):
        load_tasks(tmp_path / "nope.jsonl")
    with pytest.raises(TaskFileError, match="has no tasks"):
        load_tasks(write(tmp_path / "empty.jsonl", []))


def test_built_in_environments_load_by_name_and_an_unknown_name_says_which_exist():
    coding = load_tasks("builtin:coding")
    assert len(coding.tasks) >= 20 and coding.split("eval") and coding.path.name == "tasks.jsonl"
    with pytest.raises(TaskFileError, match=r"builtin:nope: no such built-in environment \(built in: coding, "
                                            r"task_folders, terminal\)"):
        load_tasks("builtin:nope")
