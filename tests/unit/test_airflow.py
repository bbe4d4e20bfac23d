"""The DAGs: they import cleanly and cheaply, with no broker or Spark.

Real `dag.test()` runs are in tests/integration/test_airflow.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

DAGS = ROOT / "airflow_dags"


def load_dags(conf_dir: Path | str, folder: Path = DAGS):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(folder))
    assert bag.import_errors == {}
    return bag


def test_the_dag_folder_imports_without_errors(monkeypatch):
    monkeypatch.setenv("STRATA_CONF_DIR", str(ROOT / "conf"))
    bag = load_dags(ROOT / "conf")
    assert sorted(bag.dag_ids) == ["strata_backfill", "strata_ingest_clicks", "strata_maintenance"]
    dag = bag.dags.__getitem__("strata_ingest_clicks")
    assert [t.task_id for t in dag.topological_sort()] == [
        "plan",
        "ingest",
        "register",
        "quality_gate",
        "complete",
    ]
    assert [a.uri for a in dag.get_task("complete").outlets] == ["strata://clicks/clicks"]
    assert dag.max_active_runs == 1 and dag.catchup is False and "strata" in dag.tags
    assert dag.doc_md and dag.default_args["retries"] == 2


def test_dag_files_are_airflow3_clean_and_cheap_to_import():
    lint = subprocess.run(
        [str(Path(sys.executable).parent / "ruff"), "check", "--select", "AIR3", str(DAGS)],
        capture_output=True,
        text=True,
    )
    assert lint.returncode == 0, lint.stdout
    probe = (
        "import runpy, sys\n"
        f"for f in {[str(p) for p in sorted(DAGS.glob('*.py'))]!r}: runpy.run_path(f)\n"
        "heavy = ('pyspark', 'confluent_kafka', 'deltalake', 'pyarrow')\n"
        "heavy = [m for m in heavy if m in sys.modules]\n"
        "print(heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
