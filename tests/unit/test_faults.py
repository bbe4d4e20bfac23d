"""The fault seam: the product names its points, and only the tests decide what happens there.

The crash tests that break real processes through it are in tests/integration
(test_crash.py and others); here, the seam itself, the tests' handler, and the hook
that installs it in a process the tests start.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from strata import faults
from tests.faults import (
    CRASH_AT,
    FAIL_ONCE_AT,
    ONCE_MARKER,
    READ_SKIP,
    STOP_AT,
    Injected,
    armed,
    installed,
)

PACKAGE = Path(__file__).resolve().parents[2] / "strata"
# What the product used to read or define to inject faults itself.
FAULT_VARIABLES = {CRASH_AT, STOP_AT, FAIL_ONCE_AT, ONCE_MARKER, READ_SKIP}
RETIRED = {
    "CRASH_ENV",
    "STOP_ENV",
    "FAIL_ONCE_ENV",
    "FAIL_ONCE_MARKER_ENV",
    "SKIP_ENV",
    "crash_point",
    "COMMIT_STEPS",
}


def _trees() -> dict[str, ast.Module]:
    return {
        str(path.relative_to(PACKAGE.parent)): ast.parse(path.read_text(), str(path))
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def _reads_environment(node: ast.AST) -> bool:
    """`os.environ`, `environ`, `os.getenv`, `getenv` or `os.environb`, however reached."""
    if isinstance(node, ast.Attribute):
        return node.attr in {"environ", "environb", "getenv"}
    return isinstance(node, ast.Name) and node.id in {"environ", "environb", "getenv"}


def _named(node: ast.AST) -> set[str]:
    """The names a node uses, defines or imports."""
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    if isinstance(node, ast.alias):
        return {node.name.rpartition(".")[2], node.asname or ""}
    if isinstance(node, ast.FunctionDef | ast.ClassDef):
        return {node.name}
    return set()


def test_no_module_of_the_package_reads_or_names_a_fault_variable():
    found = []
    for path, tree in _trees().items():
        for node in ast.walk(tree):
            line = getattr(node, "lineno", "?")
            # Every string, the literal parts of f-strings included.
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found += [f"{path}:{line}: {v}" for v in sorted(FAULT_VARIABLES) if v in node.value]
            found += [f"{path}:{line}: {n}" for n in sorted(_named(node) & RETIRED)]
    assert found == []


def test_the_seam_reads_no_environment():
    tree = _trees()["strata/faults.py"]
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {m.split(".")[0] for m in modules} <= {
        "__future__",
        "collections",
        "types",
        "typing",
        "pyarrow",
    }
    assert not any(_reads_environment(node) for node in ast.walk(tree))


def _points_reached() -> list[tuple[str, ast.expr]]:
    """Every `faults.reached(...)` call in the package, with its argument."""
    calls = []
    for path, tree in _trees().items():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "reached"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "faults"
            ):
                [arg] = node.args
                calls.append((f"{path}:{node.lineno}", arg))
    return calls


def _faults_name(node: ast.expr) -> str | None:
    """`X` of `faults.X`; None for anything else."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.attr if node.value.id == "faults" else None
    return None


def test_each_point_is_named_by_the_seam_and_reached_somewhere():
    reached: set[str] = set()
    for where, arg in _points_reached():
        name = _faults_name(arg.value if isinstance(arg, ast.Subscript) else arg)
        # A string literal would be a point no test can find by its name.
        assert name is not None, f"{where}: faults.reached takes a name of strata.faults"
        value = getattr(faults, name)
        reached |= set(value.values()) if isinstance(arg, ast.Subscript) else {value}
    # A point no code reaches would let a test arm a fault that never fires.
    assert reached == faults.POINTS


class Recorder(faults.Handler):
    def __init__(self) -> None:
        self.points: list[str] = []
        self.seen: list[pa.Table] = []

    def reached(self, point: str) -> None:
        self.points.append(point)

    def delivered(self, messages):
        self.seen.append(messages)
        return pa.array([True, False])


def test_with_nothing_installed_the_seam_does_nothing():
    assert faults.install(None) is None
    faults.reached(faults.AFTER_FILES)
    assert faults.delivered(pa.table({"_offset": [1, 2]})) is None


def test_an_installed_handler_sees_each_point_and_each_chunk_until_it_is_removed():
    recorder = Recorder()
    messages = pa.table({"_offset": [1, 2]})
    with installed(recorder):
        faults.reached(faults.AFTER_FILES)
        faults.reached(faults.AFTER_COMMIT["table"])
        keep = faults.delivered(messages)
        assert keep is not None and keep.to_pylist() == [True, False]
    faults.reached(faults.AFTER_LEDGER)
    assert faults.delivered(messages) is None
    assert recorder.points == ["after_files", "after_data_commit"]
    assert recorder.seen == [messages]


def test_install_returns_the_handler_it_replaces():
    first, second = Recorder(), Recorder()
    assert faults.install(first) is None
    try:
        assert faults.install(second) is first
    finally:
        assert faults.install(None) is second


def test_the_base_handler_keeps_every_message():
    with installed(faults.Handler()):
        faults.reached(faults.MID_READ)
        assert faults.delivered(pa.table({"_offset": [1]})) is None


def test_the_commit_points_cover_each_table():
    assert set(faults.BEFORE_COMMIT) == set(faults.AFTER_COMMIT) == {"raw", "quarantine", "table"}
    assert faults.AFTER_COMMIT["table"] == faults.AFTER_DATA_COMMIT


def test_a_once_only_failure_hits_the_first_process_only_and_names_it(tmp_path):
    marker = tmp_path / "once"
    handler = Injected(fail_once_at=faults.TASK_FILES_CLOSED, once=str(marker))
    handler.reached(faults.AFTER_FILES)
    assert not marker.exists()
    with pytest.raises(RuntimeError, match="injected failure at task_files_closed"):
        handler.reached(faults.TASK_FILES_CLOSED)
    assert marker.read_text() == f"task_files_closed {os.getpid()}"
    handler.reached(faults.TASK_FILES_CLOSED)  # the retried attempt passes


def test_the_handler_drops_exactly_the_skipped_message():
    messages = pa.table(
        {
            "_topic": ["t", "t", "u", "t"],
            "_partition": pa.array([1, 1, 1, 0], pa.int32()),
            "_offset": pa.array([56, 57, 57, 57], pa.int64()),
        }
    )
    keep = Injected(skip=("t", 1, 57)).delivered(messages)
    assert keep is not None and keep.to_pylist() == [True, False, True, True]
    assert Injected(crash_at=faults.AFTER_FILES).delivered(messages) is None


def test_faults_travel_through_the_environment_unchanged(tmp_path):
    marker = str(tmp_path / "m")
    handler = Injected(faults.AFTER_FILES, faults.MID_READ, None, marker, ("a:b", 3, 9))
    assert Injected.from_env(handler.env()) == handler
    assert Injected.from_env({"PATH": "/bin"}) is None


def test_a_misspelt_point_or_a_failure_without_a_marker_is_refused():
    with pytest.raises(ValueError, match="not a point"):
        Injected(crash_at="after_file")
    with pytest.raises(ValueError, match="marker"):
        Injected(fail_once_at=faults.AFTER_FILES)


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # From an unrelated directory, as the `strata` command and Spark's workers start.
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        cwd="/",
        timeout=60,
    )


def test_a_process_started_armed_installs_the_faults_once_it_imports_the_seam():
    env = armed(crash_at=faults.AFTER_FILES)
    # Nothing of strata at startup: Spark's daemon forks before importing libraries.
    listed = "import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in NAMES))"
    started = _python(listed.replace("NAMES", "('strata', 'tests')"), env)
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == "[]"
    code = "\n".join(
        [
            "from strata import faults",
            "faults.reached(faults.AFTER_LEDGER)",
            "print('passed after_ledger', flush=True)",
            "faults.reached(faults.AFTER_FILES)",
            "print('passed after_files')",
        ]
    )
    killed = _python(code, env)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert killed.stdout == "passed after_ledger\n"


def test_a_process_started_unarmed_runs_every_point():
    code = "from strata import faults\nfaults.reached(faults.AFTER_FILES)\nprint(faults._installed)"
    plain = _python(code, {"PYTHONPATH": armed()["PYTHONPATH"]})
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout == "None\n"
