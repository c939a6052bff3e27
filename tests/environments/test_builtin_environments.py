"""The built-in environments (hermes_core/environments/builtin/): every task file loads, and in a real
local (bubblewrap) sandbox a reference solution scores 1 while a wrong or absent one scores 0.

Every case runs in a new sandbox of its own (an empty working folder, nothing uploaded yet); the cases
of one task run at once, in threads, as a rollout group's verifiers do.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, TypeVar

import pytest

import hermes_core.environments
from hermes_core.environments.tasks import Task, load_tasks
from hermes_core.environments.verifiers import UPLOAD_DIR, verify
from hermes_core.sandbox import Sandbox, get_backend

BUILTIN = Path(hermes_core.environments.__file__).parent / "builtin"
CODING, TERMINAL, FOLDERS = BUILTIN / "coding", BUILTIN / "terminal", BUILTIN / "task_folders"
TASK_FILES = {"coding": CODING / "tasks.jsonl", "terminal": TERMINAL / "tasks.jsonl",
              "task_folders": FOLDERS / "tasks.jsonl"}
REFERENCE_DIR = "/tmp/hermes-reference"  # where a folder's solution.sh goes: outside the working folder
T = TypeVar("T")


def tasks_of(path: Path) -> dict[str, Task]:
    return {task.id: task for task in load_tasks(path).tasks}


CODING_TASKS, TERMINAL_TASKS, FOLDER_TASKS = (tasks_of(TASK_FILES[name]) for name in TASK_FILES)
TERMINAL_SOLUTIONS: dict[str, str] = json.loads((TERMINAL / "solutions.json").read_text())


def public_functions(source: str) -> list[str]:
    return [node.name for node in ast.parse(source).body
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")]


@pytest.fixture(scope="module")
def backend():
    with get_backend("local") as made:
        yield made


def open_sandbox(backend):
    return backend.open(f"builtin-{uuid.uuid4().hex[:12]}")


@pytest.fixture()
def sandbox(backend):
    opened = open_sandbox(backend)
    try:
        yield opened
    finally:
        opened.close()


def in_fresh_sandboxes(backend, *cases: Callable[[Sandbox], T]) -> list[T]:
    """Each case run in a new sandbox of its own (empty working folder, empty /tmp), all at once."""
    def one(case: Callable[[Sandbox], T]) -> T:
        sandbox = open_sandbox(backend)
        try:
            return case(sandbox)
        finally:
            sandbox.close()

    with ThreadPoolExecutor(len(cases)) as pool:
        return list(pool.map(one, cases))


def run(sandbox: Sandbox, command: str, timeout: float = 60) -> str:
    result = sandbox.exec(command, timeout=timeout)
    assert result.exit_code == 0, f"{command!r} failed (exit {result.exit_code}):\n{result.output}"
    return result.output


def score(task: Task, sandbox: Sandbox) -> tuple[float, str]:
    verdict = verify(task.verifier, sandbox)
    return verdict.reward, verdict.detail


# --- the task files ---------------------------------------------------------------------------------

def test_every_builtin_task_file_loads_with_unique_ids_and_both_splits():
    loaded = {name: load_tasks(path).tasks for name, path in TASK_FILES.items()}
    assert len(loaded["coding"]) >= 22 and len(loaded["terminal"]) >= 12 and len(loaded["task_folders"]) == 3
    ids = [task.id for tasks in loaded.values() for task in tasks]
    assert len(ids) == len(set(ids)), [i for i, n in Counter(ids).items() if n > 1]
    for name, tasks in loaded.items():
        assert {task.split for task in tasks} == {"train", "eval"}, name
        assert all(task.category != "default" and task.prompt.strip() for task in tasks), name
    assert {t.verifier.type for t in loaded["coding"]} == {"pytest"}
    assert {t.verifier.type for t in loaded["terminal"]} == {"file_equals", "file_contains", "command"}
    assert {t.verifier.type for t in loaded["task_folders"]} == {"task_folder"}


def test_coding_tasks_match_their_tests_and_reference_solutions():
    tests = {p.name for p in (CODING / "tests").glob("test_*.py")}
    solutions = {p.stem for p in (CODING / "solutions").glob("*.py")}
    assert tests == {f"test_{task_id}.py" for task_id in CODING_TASKS}
    assert solutions == set(CODING_TASKS)
    for task_id, task in CODING_TASKS.items():
        # Only the task's own test file is uploaded, never a reference solution.
        assert [name for name, _ in task.verifier.files] == [f"test_{task_id}.py"]
        assert "solution.py" in task.prompt
        names = public_functions((CODING / "solutions" / f"{task_id}.py").read_text())
        assert names and all(f"def {name}(" in task.prompt for name in names), (task_id, names)


def test_terminal_references_cover_every_task():
    assert set(TERMINAL_SOLUTIONS) == set(TERMINAL_TASKS)


def test_task_folders_prompt_their_instruction_and_upload_only_their_tests():
    assert {p.name for p in FOLDERS.iterdir() if p.is_dir()} == set(FOLDER_TASKS)
    for task_id, task in FOLDER_TASKS.items():
        folder = FOLDERS / task_id
        assert task.prompt == (folder / "instruction.md").read_text()
        assert (folder / "solution.sh").is_file()
        names = [name for name, _ in task.verifier.files]
        assert "tests/test.sh" in names and all(name.startswith("tests/") for name in names), names


# --- coding: pytest in the sandbox ------------------------------------------------------------------

@pytest.mark.parametrize("task_id", sorted(CODING_TASKS))
def test_coding_reference_scores_one_and_a_wrong_or_missing_solution_zero(task_id, backend):
    task = CODING_TASKS[task_id]
    reference = (CODING / "solutions" / f"{task_id}.py").read_text()
    stub = "".join(f"def {name}(*args, **kwargs):\n    return None\n\n\n" for name in public_functions(reference))

    def with_solution(source: str | None) -> Callable[[Sandbox], tuple[float, str]]:
        def case(sandbox: Sandbox) -> tuple[float, str]:
            if source is not None:
                sandbox.write_file(f"{sandbox.cwd}/solution.py", source.encode())
            return score(task, sandbox)
        return case

    # a stub returning None for every function; no solution.py at all (the tests cannot import it)
    right, wrong, missing = in_fresh_sandboxes(backend, with_solution(reference), with_solution(stub),
                                               with_solution(None))
    assert right[0] == 1.0, right[1]
    assert wrong[0] == 0.0, wrong[1]
    assert missing[0] == 0.0, missing[1]


# --- terminal: file and command verifiers -----------------------------------------------------------

@pytest.mark.parametrize("task_id", sorted(TERMINAL_TASKS))
def test_terminal_reference_command_scores_one_and_an_untouched_sandbox_zero(task_id, backend):
    task = TERMINAL_TASKS[task_id]

    def solved(sandbox: Sandbox) -> tuple[float, str]:
        run(sandbox, TERMINAL_SOLUTIONS[task_id])
        return score(task, sandbox)

    right, untouched = in_fresh_sandboxes(backend, solved, lambda sandbox: score(task, sandbox))
    assert right[0] == 1.0, right[1]
    assert untouched[0] == 0.0, untouched[1]


# --- task folders: tests/test.sh writes the reward --------------------------------------------------

def run_reference(sandbox, task_id: str) -> None:
    sandbox.write_file(f"{REFERENCE_DIR}/solution.sh", (FOLDERS / task_id / "solution.sh").read_bytes())
    run(sandbox, f"bash {REFERENCE_DIR}/solution.sh && rm -rf {REFERENCE_DIR}")


@pytest.mark.parametrize("task_id", sorted(FOLDER_TASKS))
def test_task_folder_reference_scores_one_and_an_untouched_sandbox_zero(task_id, backend):
    task = FOLDER_TASKS[task_id]

    def solved(sandbox: Sandbox) -> tuple[float, str]:
        run_reference(sandbox, task_id)
        verdict = score(task, sandbox)
        # what the verifier left: its uploaded tests and the reward, nothing else (test.sh cleans up)
        assert run(sandbox, f"ls -A {UPLOAD_DIR}").split() == ["reward.txt", "tests"]
        return verdict

    right, untouched = in_fresh_sandboxes(backend, solved, lambda sandbox: score(task, sandbox))
    assert right[0] == 1.0, right[1]
    assert untouched[0] == 0.0, untouched[1]


def test_the_broken_script_as_given_scores_zero(sandbox):
    task = FOLDER_TASKS["fix-the-script"]
    given = re.search(r"```bash\n(.*?)```", task.prompt, re.S).group(1)
    sandbox.write_file(f"{sandbox.cwd}/sum.sh", given.encode())
    run(sandbox, "chmod +x sum.sh")
    reward, detail = score(task, sandbox)
    assert reward == 0.0 and "FAIL: simple.txt" in detail, detail


def test_csv_summary_gives_partial_credit(sandbox):
    task = FOLDER_TASKS["csv-summary"]
    run_reference(sandbox, "csv-summary")
    run(sandbox, "(head -n 1 summary.csv; tail -n +2 summary.csv | sort) > sorted.csv && mv sorted.csv summary.csv")
    reward, detail = score(task, sandbox)  # right header, regions and totals; wrong order
    assert reward == 0.75, detail

    run(sandbox, "printf 'region,units,revenue\\nnorth,1,1.00\\n' > summary.csv")
    reward, detail = score(task, sandbox)  # only the header
    assert reward == 0.25, detail


@pytest.mark.parametrize("task_id", sorted(FOLDER_TASKS))
def test_task_folders_score_the_same_in_a_docker_sandbox(task_id, tmp_path):
    from contract_backends.docker import IMAGE, make_backend

    with make_backend(tmp_path) as docker:
        for solve, expected in ((True, 1.0), (False, 0.0)):
            sandbox = docker.open(f"folder-{uuid.uuid4().hex[:8]}", IMAGE)
            try:
                if solve:
                    run_reference(sandbox, task_id)
                reward, detail = score(FOLDER_TASKS[task_id], sandbox)
            finally:
                sandbox.close()
            assert reward == expected, detail
