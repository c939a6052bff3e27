"""Rollouts through AIAgent on the simulated model, scored in their own bubblewrap sandbox."""

from __future__ import annotations

import asyncio
import json

import pytest

from hermes_core.config import Endpoint
from hermes_core.environments.rollout import RolloutSettings, run_group
from hermes_core.environments.tasks import load_tasks
from hermes_core.sandbox import get_backend
from hermes_core.tools.distributions import BUILTIN_DISTRIBUTIONS

ADD_TEST = "from solution import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


@pytest.fixture(scope="module")
def backend():
    with get_backend("local") as made:
        yield made


@pytest.fixture()
def settings(sim_url):
    return RolloutSettings(endpoint=Endpoint.resolve(sim_url, "k", "hermes-sim"),
                           distribution=BUILTIN_DISTRIBUTIONS["terminal_only"], seed=7)


def tasks_of(tmp_path, rows):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return {task.id: task for task in load_tasks(path).tasks}


def roll(task, settings, backend, size=1):
    return asyncio.run(run_group(task, 0, size, settings, backend))


def test_file_verifiers_score_what_the_rollout_left_in_its_sandbox(tmp_path, settings, backend):
    tasks = tasks_of(tmp_path, [
        {"id": "right", "prompt": "run it [sim:command=echo 42 > answer.txt]",
         "verifier": {"type": "file_equals", "path": "answer.txt", "content": "42", "strip": True}},
        {"id": "wrong", "prompt": "run it [sim:command=echo 41 > answer.txt]",
         "verifier": {"type": "file_equals", "path": "answer.txt", "content": "42", "strip": True}},
        {"id": "absent", "prompt": "run it [sim:command=true]",
         "verifier": {"type": "file_contains", "path": "answer.txt", "text": "42"}},
    ])
    right, = roll(tasks["right"], settings, backend)
    assert (right.reward, right.error) == (1.0, None)
    assert [m["role"] for m in right.messages] == ["user", "assistant", "tool", "assistant"]
    assert json.loads(right.messages[1]["tool_calls"][0]["function"]["arguments"]) == {"command": "echo 42 > answer.txt"}
    assert {t["function"]["name"] for t in right.tools} >= {"terminal"} and right.toolsets == ["terminal", "file"]
    assert roll(tasks["wrong"], settings, backend)[0].reward == 0.0
    absent, = roll(tasks["absent"], settings, backend)
    assert (absent.reward, absent.error, absent.detail) == (0.0, None, "answer.txt: no such file")


def test_pytest_scores_a_correct_and_a_wrong_solution_and_the_model_never_sees_the_tests(tmp_path, settings, backend):
    (tmp_path / "test_add.py").write_text(ADD_TEST)
    spec = {"type": "pytest", "tests": "test_add.py", "timeout": 60}
    tasks = tasks_of(tmp_path, [
        {"id": "good", "prompt": r"run it [sim:command=printf 'def add(a, b):\n    return a + b\n' > solution.py; ls -a /tmp]",
         "verifier": spec},
        {"id": "bad", "prompt": r"run it [sim:command=printf 'def add(a, b):\n    return a - b\n' > solution.py]",
         "verifier": spec},
        {"id": "none", "prompt": "run it [sim:command=true]", "verifier": spec},
    ])
    good, = roll(tasks["good"], settings, backend)
    assert (good.reward, good.error) == (1.0, None), good.detail
    assert "hermes-verifier" not in good.messages[2]["content"]  # uploaded only once the rollout ended
    assert "1 passed" in good.detail
    bad, = roll(tasks["bad"], settings, backend)
    assert (bad.reward, bad.error) == (0.0, None) and "1 failed" in bad.detail
    none, = roll(tasks["none"], settings, backend)  # no solution.py: the test module cannot import it
    assert (none.reward, none.error) == (0.0, None)


def test_a_verifier_that_hangs_is_cut_at_its_timeout_and_is_an_error_not_a_zero(tmp_path, settings, backend):
    task = tasks_of(tmp_path, [{"id": "hang", "prompt": "run it [sim:command=true]",
                                "verifier": {"type": "command", "command": "sleep 60", "timeout": 1}}])["hang"]
    rollout, = roll(task, settings, backend)
    assert rollout.reward is None
    assert rollout.error == "verifier: the verifier timed out after 1 s"


def test_a_sandbox_that_cannot_open_fails_the_rollout_and_scores_nothing(tmp_path, settings, backend):
    task = tasks_of(tmp_path, [{"id": "x", "prompt": "run it", "image": str(tmp_path / "no-such-rootfs"),
                                "verifier": {"type": "command", "command": "true"}}])["x"]
    rollout, = roll(task, settings, backend)
    assert rollout.reward is None and rollout.error.startswith("sandbox: ")


def test_a_task_folder_writes_its_own_reward(tmp_path, settings, backend):
    folder = tmp_path / "hello-task"
    (folder / "tests").mkdir(parents=True)
    (folder / "tests" / "test.sh").write_text(
        '#!/bin/bash\nif grep -q hello greeting.txt 2>/dev/null; then echo 1 > "$REWARD_FILE"; '
        'else echo 0 > "$REWARD_FILE"; fi\n')
    (folder / "tests" / "silent.sh").write_text("exit 0\n")
    tasks = tasks_of(tmp_path, [
        {"id": "hello", "prompt": "run it [sim:command=echo hello > greeting.txt]",
         "verifier": {"type": "task_folder", "path": "hello-task"}},
        {"id": "nothing", "prompt": "run it [sim:command=true]", "verifier": {"type": "task_folder", "path": "hello-task"}},
    ])
    assert roll(tasks["hello"], settings, backend)[0].reward == 1.0
    assert roll(tasks["nothing"], settings, backend)[0].reward == 0.0
    (folder / "tests" / "test.sh").write_text("exit 0\n")  # writes no reward: an error of the rollout
    silent = tasks_of(tmp_path, [{"id": "s", "prompt": "run it [sim:command=true]",
                                  "verifier": {"type": "task_folder", "path": "hello-task"}}])["s"]
    rollout, = roll(silent, settings, backend)
    assert rollout.reward is None and rollout.error.startswith("verifier: tests/test.sh wrote no reward")


def test_a_group_draws_toolsets_reproducibly_per_task_group_and_member(tmp_path, sim_url, backend):
    settings = RolloutSettings(endpoint=Endpoint.resolve(sim_url, "k", "hermes-sim"),
                               distribution=BUILTIN_DISTRIBUTIONS["balanced"], seed=3)
    task = tasks_of(tmp_path, [{"id": "t", "prompt": "say hi [sim:no-tools]",
                                "verifier": {"type": "command", "command": "true"}}])["t"]
    first = roll(task, settings, backend, size=4)
    again = roll(task, settings, backend, size=4)
    assert [r.toolsets for r in first] == [r.toolsets for r in again]
    assert [r.member for r in first] == [0, 1, 2, 3] and len({r.key for r in first}) == 4
    assert all(r.reward == 1.0 for r in first)


def test_the_built_in_coding_environment_scores_a_scripted_correct_and_wrong_solution(settings, backend):
    import base64
    import dataclasses

    from hermes_core.environments.tasks import BUILTIN

    task = next(t for t in load_tasks("builtin:coding").tasks if t.id == "run_length_encode")
    reference = (BUILTIN / "coding" / "solutions" / "run_length_encode.py").read_bytes()
    wrong = b"def run_length_encode(text):\n    return text\n"
    for source, reward in ((reference, 1.0), (wrong, 0.0)):
        command = f"echo {base64.b64encode(source).decode()} | base64 -d > solution.py"
        scripted = dataclasses.replace(task, prompt=f"{task.prompt} run it [sim:command={command}]")
        rollout, = roll(scripted, settings, backend)
        assert (rollout.reward, rollout.error) == (reward, None), rollout.detail
