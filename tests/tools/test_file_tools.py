"""Contract tests of the file toolset (Hermes Agent's interface) in a real bubblewrap sandbox."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from hermes_core.sandbox import SandboxSettings
from hermes_core.sandbox.bubblewrap import BubblewrapBackend
from hermes_core.tools import ToolContext, registry, result_failed


@pytest.fixture
def ctx(tmp_path: Path):
    with BubblewrapBackend(SandboxSettings(state_root=tmp_path / "sandboxes")).open("files", cwd="/app") as sandbox:
        yield ToolContext(sandbox=sandbox, task_id="task-files")


def call(ctx: ToolContext, name: str, **arguments: Any) -> dict[str, Any]:
    text = registry.call(name, arguments, ctx)
    assert not result_failed(text), text
    return json.loads(text)


def error_of(ctx: ToolContext, name: str, **arguments: Any) -> str:
    text = registry.call(name, arguments, ctx)
    assert result_failed(text), text
    return json.loads(text)["error"]


def text_of(ctx: ToolContext, path: str) -> str:
    return ctx.sandbox.read_file(path).decode()


# --- read_file / write_file -----------------------------------------------------------------------


def test_read_file_offset_is_one_based_and_limit_pages(ctx: ToolContext) -> None:
    call(ctx, "write_file", path="ten.txt", content="".join(f"line {n}\n" for n in range(1, 11)))
    first = call(ctx, "read_file", path="ten.txt")  # defaults: offset 1, limit 500
    assert first["content"].split("\n")[0] == "1|line 1" and first["total_lines"] == 10
    assert first["truncated"] is False and "hint" not in first
    page = call(ctx, "read_file", path="ten.txt", offset=1, limit=3)
    assert page["content"] == "1|line 1\n2|line 2\n3|line 3"
    assert page["truncated"] is True and "offset=4" in page["hint"]
    assert call(ctx, "read_file", path="ten.txt", offset=9, limit=5)["content"] == "9|line 9\n10|line 10"
    # Out-of-range values are clamped like the original's: offset 0 reads from line 1, limit <= 2000.
    assert call(ctx, "read_file", path="ten.txt", offset=0, limit=1)["content"] == "1|line 1"
    big = call(ctx, "write_file", path="big.txt", content="x\n" * 2500)
    assert big["bytes_written"] == 5000
    assert call(ctx, "read_file", path="big.txt", limit=9999)["content"].count("\n") == 1999
    assert "past the end" in error_of(ctx, "read_file", path="ten.txt", offset=11)


def test_read_file_cuts_long_lines_and_big_pages(ctx: ToolContext) -> None:
    call(ctx, "write_file", path="wide.txt", content="a" * 5000 + "\n" + ("b" * 1500 + "\n") * 100)
    page = call(ctx, "read_file", path="wide.txt")
    assert page["content"].startswith("1|" + "a" * 2000 + "... [truncated]\n2|b")
    assert page["truncated"] is True and page["truncated_by"] == "bytes"
    assert page["next_offset"] == page["content"].count("\n") + 2 and len(page["content"]) <= 100_000


def test_write_file_result_and_refusals(ctx: ToolContext) -> None:
    result = call(ctx, "write_file", path="deep/er/file.txt", content="hi\n", cross_profile=False)
    assert result == {"bytes_written": 3, "dirs_created": True, "resolved_path": "/app/deep/er/file.txt",
                      "files_modified": ["/app/deep/er/file.txt"]}
    assert call(ctx, "write_file", path="deep/er/file.txt", content="ho\n")["dirs_created"] is False
    assert "line-number" in error_of(ctx, "write_file", path="x.txt", content="1|import os\n2|print(os)\n")
    assert "missing required argument(s) ['content']" in error_of(ctx, "write_file", path="x.txt")


# --- patch ----------------------------------------------------------------------------------------


def test_patch_replace_mode(ctx: ToolContext) -> None:
    call(ctx, "write_file", path="app.py", content="x = 1\ny = 1\nprint(x)\n")
    done = call(ctx, "patch", path="app.py", old_string="print(x)", new_string="print(x + y)")  # mode defaults
    assert done["success"] is True and "+print(x + y)" in done["diff"] and done["files_modified"] == ["/app/app.py"]
    assert "2 times" in error_of(ctx, "patch", mode="replace", path="app.py", old_string="= 1", new_string="= 2")
    assert "Could not find" in error_of(ctx, "patch", mode="replace", path="app.py", old_string="z = 3",
                                        new_string="z = 4")
    call(ctx, "patch", mode="replace", path="app.py", old_string="= 1", new_string="= 2", replace_all=True)
    # Lines that differ only in indentation still match (models often get it wrong).
    call(ctx, "patch", mode="replace", path="app.py", old_string="  y = 2", new_string="y = 3")
    assert text_of(ctx, "app.py") == "x = 2\ny = 3\nprint(x + y)\n"
    assert "old_string and new_string required" in error_of(ctx, "patch", mode="replace", path="app.py")
    assert "patch content required" in error_of(ctx, "patch", mode="patch")


V4A = """*** Begin Patch
*** Update File: src/app.py
@@ def main():
     print("hello")
-    return 1
+    return 0
@@ def helper():
-    pass
+    return 42
*** Add File: docs/NEW.md
+# New
+
+text
*** Delete File: old.txt
*** End Patch
"""


def test_v4a_patch_updates_adds_and_deletes(ctx: ToolContext) -> None:
    call(ctx, "write_file", path="src/app.py",
         content='import os\n\n\ndef main():\n    print("hello")\n    return 1\n\n\ndef helper():\n    pass\n')
    call(ctx, "write_file", path="old.txt", content="bye\n")
    result = call(ctx, "patch", mode="patch", patch=V4A)
    assert result["success"] is True
    assert result["files_modified"] == ["src/app.py"] and result["files_created"] == ["docs/NEW.md"]
    assert result["files_deleted"] == ["old.txt"] and "+    return 42" in result["diff"]
    assert text_of(ctx, "src/app.py") == ('import os\n\n\ndef main():\n    print("hello")\n    return 0\n\n\n'
                                         'def helper():\n    return 42\n')
    assert text_of(ctx, "docs/NEW.md") == "# New\n\ntext\n"
    assert ctx.sandbox.exec("test -e old.txt").exit_code == 1


def test_v4a_hunk_with_wrong_context_changes_nothing(ctx: ToolContext) -> None:
    call(ctx, "write_file", path="a.py", content="one\ntwo\n")
    call(ctx, "write_file", path="b.py", content="alpha\nbeta\n")
    bad = ("*** Begin Patch\n*** Update File: a.py\n-one\n+ONE\n*** Add File: c.py\n+new\n"
           "*** Update File: b.py\n@@ alpha\n beta\n-gamma\n+GAMMA\n*** Delete File: a.py\n*** End Patch")
    message = error_of(ctx, "patch", mode="patch", patch=bad)
    assert "b.py: hunk 1 (@@ alpha)" in message and "'beta'" in message and "no file was changed" in message
    assert text_of(ctx, "a.py") == "one\ntwo\n" and text_of(ctx, "b.py") == "alpha\nbeta\n"
    assert ctx.sandbox.exec("test -e c.py").exit_code == 1
    assert "starts with the line '*** Begin Patch'" in error_of(ctx, "patch", mode="patch", patch="-x\n+y")
    assert "patch line 3" in error_of(ctx, "patch", mode="patch",
                                      patch="*** Begin Patch\n*** Update File: a.py\nnonsense\n*** End Patch")
    assert "not found" in error_of(ctx, "patch", mode="patch",
                                   patch="*** Begin Patch\n*** Delete File: nope.txt\n*** End Patch")


# --- search_files ---------------------------------------------------------------------------------


@pytest.fixture
def tree(ctx: ToolContext) -> ToolContext:
    call(ctx, "write_file", path="src/main.py", content="import util\n\ndef main():\n    return util.helper()\n")
    call(ctx, "write_file", path="src/util.py", content="def helper():\n    return 42\n")
    call(ctx, "write_file", path="notes.md", content="call helper() first\n")
    call(ctx, "write_file", path=".git/config", content="helper = secret\n")
    old = time.time() - 3600
    ctx.sandbox.exec(f"touch -d @{int(old)} src/main.py")  # util.py is the newest .py file
    return ctx


def test_search_files_by_name(tree: ToolContext) -> None:
    found = call(tree, "search_files", pattern="*.py", target="files")
    assert found == {"total_count": 2, "files": ["./src/util.py", "./src/main.py"]}  # newest first
    assert call(tree, "search_files", pattern="util", target="files", path="src")["files"] == ["src/util.py"]
    paged = call(tree, "search_files", pattern="*", target="files", limit=1, offset=1)
    assert paged["total_count"] == 3 and len(paged["files"]) == 1 and paged["truncated"] is True
    assert "offset=2" in paged["hint"]


def test_search_content_with_glob_and_context(tree: ToolContext) -> None:
    found = call(tree, "search_files", pattern="helper")  # .git is hidden, so skipped
    assert found["total_count"] == 3 and {m["path"] for m in found["matches"]} == {
        "./src/main.py", "./src/util.py", "./notes.md"}
    only_py = call(tree, "search_files", pattern=r"def \w+\(", file_glob="*.py", path="src")
    assert sorted((m["path"], m["line"], m["content"]) for m in only_py["matches"]) == [
        ("src/main.py", 3, "def main():"), ("src/util.py", 1, "def helper():")]
    around = call(tree, "search_files", pattern="def main", path="src/main.py", context=1)
    assert [(m["line"], m["content"]) for m in around["matches"]] == [(2, ""), (3, "def main():"),
                                                                       (4, "    return util.helper()")]
    assert call(tree, "search_files", pattern="no such text anywhere") == {"total_count": 0}
    assert "Search failed" in error_of(tree, "search_files", pattern="(unclosed")
    assert "Path not found" in error_of(tree, "search_files", pattern="x", path="missing-dir")


def test_search_output_modes(tree: ToolContext) -> None:
    files = call(tree, "search_files", pattern="helper", output_mode="files_only")
    assert files["total_count"] == 3 and sorted(files["files"]) == ["./notes.md", "./src/main.py", "./src/util.py"]
    counts = call(tree, "search_files", pattern="return|helper", output_mode="count", path="src")
    assert counts == {"total_count": 3, "counts": {"src/main.py": 1, "src/util.py": 2}}  # lines, per file


def test_search_content_pages_and_groups_many_matches(ctx: ToolContext) -> None:
    call(ctx, "write_file", path="many.txt", content="match\n" * 120)
    first = call(ctx, "search_files", pattern="match")  # default limit 50
    assert first["truncated"] is True and "offset=50" in first["hint"]
    rows = first["matches_text"].split("\n")  # 5 or more matches come grouped by file
    assert rows[0] == "./many.txt" and rows[1] == "  1: match" and len(rows) == 51
    last = call(ctx, "search_files", pattern="match", limit=50, offset=100)
    assert last["matches_text"].split("\n")[1:3] == ["  101: match", "  102: match"]
    assert len(last["matches_text"].split("\n")) == 21 and "truncated" not in last
    few = call(ctx, "search_files", pattern="match", limit=2, offset=5)
    assert [(m["line"], m["content"]) for m in few["matches"]] == [(6, "match"), (7, "match")]


def test_v4a_context_hint_picks_the_place_and_move(ctx: ToolContext) -> None:
    call(ctx, "write_file", path="two.py", content="class A:\n    def go(self):\n        pass\n\nclass B:\n"
                                                    "    def go(self):\n        pass\n")
    ambiguous = "*** Begin Patch\n*** Update File: two.py\n     def go(self):\n-        pass\n+        return 1\n*** End Patch"
    assert "matches 2 places" in error_of(ctx, "patch", mode="patch", patch=ambiguous)
    call(ctx, "patch", mode="patch", patch=ambiguous.replace("two.py\n", "two.py\n@@ class B:\n"))
    assert text_of(ctx, "two.py").endswith("class B:\n    def go(self):\n        return 1\n")
    moved = call(ctx, "patch", mode="patch", patch="*** Begin Patch\n*** Move File: two.py -> lib/two.py\n*** End Patch")
    assert moved["files_modified"] == ["two.py -> lib/two.py"] and "return 1" in text_of(ctx, "lib/two.py")
    assert ctx.sandbox.exec("test -e two.py").exit_code == 1
