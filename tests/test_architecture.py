"""The layout is the architecture (docs/explanation/architecture.md): every import of the product, lazy ones
included, is read from the source and checked against the two "never" rules, the order of the
parts and the absence of import loops."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hermes_core", "hermes_assets")
SIMULATOR = "hermes_core.endpoints.simulated"
# The parts of hermes_core, lowest first: a part imports only parts before it (docs/explanation/architecture.md).
PARTS = ["hermes_core.config", "hermes_core.fileio", "hermes_core.asgi_thread", "hermes_core.sandbox",
         "hermes_core.tools", "hermes_core.endpoints", "hermes_core.formats", "hermes_core.agent", "hermes_core.batch",
         "hermes_core.exports", "hermes_core.environments", "hermes_core.api_server", SIMULATOR, "hermes_core",
         "hermes_assets"]
PLUMBING = PARTS[:3]  # shared by every part: they import nothing of the project but each other


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


MODULES = all_modules()


def imports_of(name: str) -> set[str]:
    """Every module `name` imports anywhere in its source (functions included), resolved to module
    names: `from a import b` counts as `a.b` when that is a module, else as `a`."""
    path, found = MODULES[name], set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return found


GRAPH = {name: imports_of(name) for name in MODULES}


def part_of(name: str) -> str:
    return max((part for part in PARTS if name == part or name.startswith(part + ".")), key=len)


def test_the_core_never_imports_dagster() -> None:
    offenders = {name: sorted(i for i in imported if i.split(".")[0].startswith("dagster"))
                 for name, imported in GRAPH.items() if name.startswith("hermes_core")}
    assert {name: found for name, found in offenders.items() if found} == {}


def test_the_product_never_imports_the_simulated_endpoint() -> None:
    offenders = {name: sorted(i for i in imported if i == SIMULATOR or i.startswith(SIMULATOR + "."))
                 for name, imported in GRAPH.items() if not name.startswith(SIMULATOR)}
    assert {name: found for name, found in offenders.items() if found} == {}


def test_each_part_imports_only_the_parts_below_it() -> None:
    against = []
    for name, imported in GRAPH.items():
        rank = PARTS.index(part_of(name))
        for target in imported:
            if target in MODULES and part_of(target) != part_of(name):
                allowed = PARTS.index(part_of(target)) < rank and not (part_of(name) in PLUMBING and
                                                                         part_of(target) not in PLUMBING)
                if not allowed:
                    against.append(f"{name} -> {target}")
    assert sorted(against) == []


def test_no_import_loops() -> None:
    """Tarjan's strongly connected components over the module graph: every component is one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in GRAPH[node]:
            if target not in MODULES or target == node:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    for name in MODULES:
        if name not in index:
            visit(name)
    assert loops == []


@pytest.mark.parametrize("part", [part for part in PARTS if (ROOT / part.replace(".", "/") / "__init__.py").exists()])
def test_every_part_says_what_it_owns(part: str) -> None:
    assert ast.get_docstring(ast.parse((ROOT / part.replace(".", "/") / "__init__.py").read_text()))


def test_only_the_atropos_adapter_imports_atroposlib() -> None:
    importers = sorted(name for name, imported in GRAPH.items() if any(i.split(".")[0] == "atroposlib" for i in imported))
    assert importers == ["hermes_core.environments.atropos_env"]


def test_loading_the_definitions_imports_no_heavy_optional_library() -> None:
    """The code location loads, and every run's process starts, without datasets, transformers or
    atroposlib (seconds each): they are imported where they are used."""
    import subprocess
    import sys

    code = ("import sys, hermes_assets.definitions; print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'datasets', 'transformers', 'atroposlib', 'torch', 'gguf'}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_planning_and_a_settled_resume_import_no_http_client() -> None:
    """The command line and the definitions load without aiohttp (0.1 s): a plan or a settled resume
    sends no request, so only the code that makes one imports it."""
    import subprocess
    import sys

    code = "import sys, hermes_assets.cli, hermes_assets.definitions; print('aiohttp' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
