"""The spark-submit entry points: the checkout's `jobs/` hands over to `strata.jobs`."""

from __future__ import annotations

import ast
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

import strata.jobs.ingest
from tests.conftest import ROOT

JOBS = sorted((ROOT / "jobs").glob("*.py"))


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_the_checkout_has_the_ingest_job():
    assert "ingest.py" in [job.name for job in JOBS]


@pytest.mark.parametrize("job", JOBS, ids=lambda job: job.name)
def test_a_checkout_job_only_calls_the_packages_job_of_its_name(job: Path):
    tree = ast.parse(job.read_text())
    assert ast.get_docstring(tree), "say what the job does and how to submit it"
    # Thin: imports and the `__main__` guard; the code lives in the package alone.
    kinds = {type(node).__name__ for node in tree.body[1:]}
    assert kinds <= {"ImportFrom", "Import", "If"}, kinds
    imported = {
        (node.module, alias.name)
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert (f"strata.jobs.{job.stem}", "main") in imported


def test_running_the_checkout_job_runs_the_packages_main_and_exits_with_its_code(monkeypatch):
    calls: list[list[str]] = []

    def main() -> int:
        calls.append(sys.argv[1:])
        return 3

    monkeypatch.setattr(strata.jobs.ingest, "main", main)
    args = ["--pipeline", "clicks", "--conf-dir", "conf", "--json"]
    monkeypatch.setattr(sys, "argv", [str(ROOT / "jobs" / "ingest.py"), *args])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(ROOT / "jobs" / "ingest.py"), run_name="__main__")
    assert done.value.code == 3
    assert calls == [args]


def test_the_checkout_job_and_the_installed_one_answer_help_alike():
    checkout = _run("jobs/ingest.py", "--help")
    installed = _run(strata.jobs.ingest.__file__, "--help")
    assert checkout.returncode == 0, checkout.stderr
    assert checkout.stdout.startswith("usage: ingest.py [-h] --pipeline PIPELINE")
    assert checkout.stdout == installed.stdout


def test_the_module_prints_the_installed_job_for_spark_submit():
    done = _run("-m", "strata.jobs", "ingest")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(Path(strata.jobs.ingest.__file__).resolve())


def test_the_module_names_the_jobs_when_asked_for_another():
    done = _run("-m", "strata.jobs", "compact")
    assert done.returncode == 2
    assert "no Strata job named 'compact'; the jobs are: ingest" in done.stderr
