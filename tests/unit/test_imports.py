"""The package's layout: no import cycles, and the product never imports the local stack."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "strata"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _parents(module: str) -> list[str]:
    """The packages whose `__init__` runs before `module` does, outermost first."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _imported(node: ast.Import | ast.ImportFrom, importer: str, modules: set[str]) -> set[str]:
    """The package modules one import statement in `importer` runs.

    Importing `a.b.c` runs `a/__init__.py` and `a/b/__init__.py` first, and so does
    `from a.b import c`, where `c` is the submodule `a.b.c` if there is one and
    otherwise a name that `a/b/__init__.py` binds. The importer's own packages have
    begun running before it did, so reaching them again closes no cycle; taking a
    name from one of them does, since that name may not be bound yet.
    """
    if isinstance(node, ast.Import):
        named = {a.name for a in node.names}
        implied = {p for name in named for p in _parents(name)}
    else:
        source = node.module or ""
        if node.level:
            is_package = any(m.startswith(f"{importer}.") for m in modules)
            package = importer if is_package else importer.rpartition(".")[0]
            base = package.rsplit(".", node.level - 1)[0]
            source = f"{base}.{source}" if source else base
        submodules = {f"{source}.{a.name}" for a in node.names} & modules
        takes_names = len(submodules) < len(node.names)
        named = submodules | ({source} if takes_names else set())
        implied = set(_parents(source)) | ({source} if submodules else set())
    running = {importer, *_parents(importer)}
    return ((named | (implied - running)) & modules) - {importer}


def _imports() -> dict[str, set[str]]:
    """Every module of the package and the package modules it imports, at any depth.

    Imports inside functions and under `TYPE_CHECKING` count: a function-level import
    only puts a cycle off until the first call, and a type-only one turns real the day
    the guard goes.
    """
    paths = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                found |= _imported(node, name, set(paths))
        graph[name] = found
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each group of modules that import each other, so all are reported.

    Removing one cycle's modules from the graph leaves the other groups' cycles, as
    no cycle crosses from one group of mutually reachable modules to another.
    """
    found = []
    left = {m: set(t) for m, t in graph.items()}
    while cycle := _cycle(left):
        found.append(cycle)
        reach = _reaching(left, cycle[0])
        left = {m: t - reach for m, t in left.items() if m not in reach}
    return found


def _reaching(graph: dict[str, set[str]], start: str) -> set[str]:
    """The modules `start` reaches that also reach it back: its group, `start` included."""

    def closure(edges: dict[str, set[str]]) -> set[str]:
        seen, todo = {start}, [start]
        while todo:
            for nxt in edges.get(todo.pop(), set()) - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    back: dict[str, set[str]] = {}
    for m, targets in graph.items():
        for t in targets:
            back.setdefault(t, set()).add(m)
    return closure(graph) & closure(back)


def test_the_package_has_no_import_cycle():
    graph = _imports()
    assert len(graph) > 30  # the walk found the package
    cycles = _cycles(graph)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_a_cycle_is_found_when_there_is_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_every_separate_cycle_is_reported():
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c", "e"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "a"], ["c", "d", "c"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def _edges(source: str, importer: str = "p.x") -> set[str]:
    modules = {"p", "p.x", "p.q", "p.q.checks", "p.q.run", "p.q.deep", "p.q.deep.leaf"}
    return {
        m
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for m in _imported(node, importer, modules)
    }


def test_importing_a_submodule_runs_its_parent_packages():
    assert _edges("from p.q.checks import Check") == {"p.q", "p.q.checks"}
    assert _edges("import p.q.deep.leaf") == {"p.q", "p.q.deep", "p.q.deep.leaf"}
    assert _edges("from p.q.deep import leaf") == {"p.q", "p.q.deep", "p.q.deep.leaf"}
    assert _edges("def f():\n    from p.q.run import run_quality\n") == {"p.q", "p.q.run"}


def test_from_a_package_imports_a_submodule_or_a_name():
    assert _edges("from p.q import checks") == {"p.q", "p.q.checks"}
    assert _edges("from p.q import run_quality") == {"p.q"}
    assert _edges("from p.q import checks, run_quality") == {"p.q", "p.q.checks"}


def test_the_importers_own_packages_are_already_running():
    assert _edges("from p.q.checks import Check", importer="p.q.run") == {"p.q.checks"}
    assert _edges("from p.q import checks", importer="p.q.run") == {"p.q.checks"}
    assert _edges("from p.q import Check", importer="p.q.run") == {"p.q"}


def test_a_relative_import_is_resolved_from_the_importers_package():
    assert _edges("from . import checks", importer="p.q.run") == {"p.q.checks"}
    assert _edges("from .deep import leaf", importer="p.q") == {"p.q.deep", "p.q.deep.leaf"}
    assert _edges("from .. import x", importer="p.q.run") == {"p.x"}


def test_the_product_imports_nothing_from_the_local_stack():
    graph = _imports()
    product = {m for m in graph if not m.startswith("strata.local")}
    assert "strata.run" in product and "strata.local.broker" in graph
    leaks = sorted(f"{m} -> {t}" for m in product for t in graph[m] if t.startswith("strata.local"))
    assert not leaks, leaks


# What the executors' Spark installation brings along: not in their packed environment.
_FROM_SPARK = ("pyspark", "py4j")

# Imports the Spark tasks' modules in an interpreter where every distribution the
# executor lock lacks is missing, as in the executors' packed environment: an optional
# import (pandas, from pyarrow and pyspark) falls back as it does there.
_AS_ON_AN_EXECUTOR = """
import importlib.abc, importlib.metadata, sys
locked = set(sys.argv[1].split(","))
dists = importlib.metadata.packages_distributions()
norm = lambda d: d.lower().replace("_", "-")
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top in dists and top != "strata" and top not in {spark}:
            if not {{norm(d) for d in dists[top]}} & locked:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Missing())
import strata.batch.task, strata.batch.write, strata.maintenance._bins
"""


def test_the_spark_tasks_import_only_what_the_executors_environment_holds():
    # The executors' packed environment (`make dist`) holds the executor lock alone: a
    # module the tasks import from any other distribution fails every task on a
    # cluster, though every local run passes (the driver's environment has it all).
    import subprocess
    import sys

    lock = (PACKAGE.parent / "requirements" / "executor.lock").read_text().splitlines()
    locked = {line.split("==")[0].lower().replace("_", "-") for line in lock if "==" in line}
    code = _AS_ON_AN_EXECUTOR.format(spark=repr(set(_FROM_SPARK)))
    done = subprocess.run(
        [sys.executable, "-c", code, ",".join(sorted(locked))], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
