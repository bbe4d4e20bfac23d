"""Builders the maintenance tests share: pipelines of each format, small batches, runs.

Compaction is run on the tests' shared Spark session where the test is not about the
command itself (`compacted`); the `strata` command is spawned where it must be frozen
or killed (`paused_at_its_last_check`).
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

from strata import faults
from strata.catalog.register import register_tables
from strata.edge import registration
from strata.errors import LockBusy
from strata.maintenance.compact import Compaction, CompactionReport, compact
from strata.maintenance.report import VacuumReport
from strata.maintenance.vacuum import vacuum
from strata.run import run_batch
from tests.conftest import ROOT, produce_clicks, s3_pipeline
from tests.faults import armed
from tests.locking import s3_options

FORMATS = ("delta", "parquet", "iceberg")
"""Every table format maintenance is tested on."""


def small_batches(p, broker, spark, batches: int, partitions: int = 2) -> Counter:
    """Several small batches over the same three event hours: late data piles up files."""
    expected: Counter = Counter()
    for n in range(batches):
        per = produce_clicks(broker, p.topic, partitions, 120, seed=n + 1, hours=3)
        for part, count in per.items():
            expected[part] += count
        run_batch(p.cfg(), session=lambda _: spark)
    return expected


def compacted(cfg, spark, **kwargs: Any) -> CompactionReport:
    """`compact` as the command calls it, on the tests' shared Spark session."""
    settings = Compaction.of(cfg.maintenance, cfg.limits, cfg.partitioning)
    register = partial(register_tables, registration(cfg))
    return compact(cfg.places(), settings, lambda: spark, register, **kwargs)


def wait_stopped(proc: subprocess.Popen[str], timeout: float = 240) -> None:
    """Wait until a process armed with `stop_at` has stopped itself there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = Path(f"/proc/{proc.pid}/stat").read_text().split()[2]
        if state == "T":
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    raise AssertionError("the compaction never reached its commit")


def paused_at_its_last_check(p, tmp_path: Path) -> subprocess.Popen[str]:
    """`strata compact`, frozen (once) right after its last lease check before it acts."""
    env = p.env(**armed(stop_at=faults.AFTER_COMPACT_CHECK, once=tmp_path / "paused"))
    return p.spawn("compact", "--older-than", "0s", env=env)


def ended(proc: subprocess.Popen[str]) -> None:
    """Kill a process a failed test left running (paused or not): SIGKILL ends both."""
    if proc.poll() is None:
        proc.kill()
        proc.communicate(timeout=30)


def vacuum_once_free(cfg) -> VacuumReport:
    """Vacuum as soon as the maintenance lease a paused run holds has expired."""
    deadline = time.monotonic() + 120
    while True:
        try:
            return vacuum(cfg.places(), cfg.maintenance.vacuum_retention, cfg.metastore)
        except LockBusy as exc:
            assert "another maintenance is in flight" in str(exc)
            assert time.monotonic() < deadline, "the paused run's lease never expired"
            time.sleep(0.5)


def parquet_with_leases(make_pipeline, metastore, s3_endpoint, tmp_path: Path, **overrides):
    """A plain Parquet pipeline whose runs hold leases: tables on local disk, which the
    test metastore can hold, and the state (plans, leases) on S3, with a short lease."""
    return make_pipeline(
        partitions=2,
        overrides={
            "table_format": "parquet",
            "metastore": {"uri": metastore.uri},
            "state_dir": f"s3://lake/{tmp_path.name}/state",
            "storage_options": s3_options(s3_endpoint),
            "lock_lease": "6s",
            **overrides,
        },
    )


def leased_pipeline(fmt: str, make_pipeline, metastore, s3_endpoint, tmp_path: Path, **overrides):
    """A pipeline of `fmt` whose maintenance holds a lease in S3.

    Delta and Iceberg tables live on S3 too (Iceberg's in the local metastore); plain
    Parquet tables stay on local disk, where the test metastore can hold their moved
    partitions (`parquet_with_leases`).
    """
    if fmt == "parquet":
        return parquet_with_leases(make_pipeline, metastore, s3_endpoint, tmp_path, **overrides)
    prefix = f"{fmt}_{uuid.uuid4().hex[:8]}"
    if fmt == "iceberg":
        overrides = {
            "table_format": "iceberg",
            "metastore": {"uri": metastore.uri, "database": prefix},
            **overrides,
        }
    p, _ = s3_pipeline(make_pipeline, s3_endpoint, tmp_path, prefix, **overrides)
    return p


def load_dags(folder: Path = ROOT / "airflow_dags"):
    """The project's DAG folder, parsed as the scheduler parses it (no import errors)."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(folder))
    assert bag.import_errors == {}
    return bag


def task_states(run) -> dict[str, str]:
    """Each task of a DAG run, and its state."""
    return {ti.task_id: str(ti.state) for ti in run.get_task_instances()}


def task_result(run, task_id: str) -> Any:  # noqa: ANN401 - what the task returned
    """What a task of a DAG run returned (its XCom)."""
    return next(ti for ti in run.get_task_instances() if ti.task_id == task_id).xcom_pull(
        task_ids=task_id
    )
