"""The DAGs against the real broker and Spark: `dag.test()` runs land data.

That the DAG folder imports cleanly and cheaply is checked in tests/unit/test_airflow.py.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from strata import faults
from strata.store.ledger import read_ledger
from tests.conftest import ROOT, START_MS, expected_offsets, produce_clicks
from tests.faults import Injected, installed

DAGS = ROOT / "airflow_dags"


def load_dags(conf_dir: Path | str, folder: Path = DAGS):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(folder))
    assert bag.import_errors == {}
    return bag


def test_the_submitted_spark_properties_carry_no_credentials(make_pipeline, monkeypatch):
    # The spark-submit command line is logged and rendered by Airflow.
    conf = {
        "spark.archives": "s3a://artifacts/env.tar.gz#environment",
        "spark.hadoop.fs.s3a.secret.key": "canary-s3a-secret",
    }
    p = make_pipeline(
        partitions=1,
        overrides={"airflow": {"spark_mode": "spark_submit"}, "spark": {"conf": conf}},
    )
    monkeypatch.setenv("STRATA_CONF_DIR", str(p.conf_dir))
    ingest = load_dags(p.conf_dir).dags[f"strata_ingest_{p.name}"].get_task("ingest")
    assert ingest.conf == {"spark.archives": "s3a://artifacts/env.tar.gz#environment"}
    assert ingest.application.endswith("strata/jobs/ingest.py")


def states(run) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in run.get_task_instances()}


def test_ingest_dag_runs_land_batches_and_pick_up_only_new_offsets(
    make_pipeline, broker, spark, airflow_db, monkeypatch
):
    p = make_pipeline(partitions=2, overrides={"airflow": {"retry_delay": "1s"}})
    first = produce_clicks(broker, p.topic, 2, 400, malformed=2)
    monkeypatch.setenv("STRATA_CONF_DIR", str(p.conf_dir))
    dag = load_dags(p.conf_dir).dags.__getitem__(f"strata_ingest_{p.name}")

    run = dag.test()
    assert str(run.state) == "success", states(run)
    assert p.landed() == expected_offsets(first)
    plan_ti = next(ti for ti in run.get_task_instances() if ti.task_id == "plan")
    shown = plan_ti.xcom_pull(task_ids="plan")
    assert shown["batch"] == 1 and [
        (r["partition"], r["start"], r["end"]) for r in shown["ranges"]
    ] == [(q, 0, n) for q, n in sorted(first.items())]

    second = produce_clicks(broker, p.topic, 2, 200, seed=3, start_ms=START_MS + 3 * 3_600_000)
    run = dag.test()
    assert str(run.state) == "success", states(run)
    ledger = read_ledger(p.cfg().places()).to_pylist()
    assert sorted(
        (r["batch"], r["partition"], r["start_offset"]) for r in ledger if r["batch"] == 2
    ) == [(2, q, first[q]) for q in range(2)]
    assert p.landed() == expected_offsets({q: first[q] + second[q] for q in first})


def test_an_ingest_task_that_fails_once_is_retried_to_exactly_once(
    make_pipeline, broker, spark, airflow_db, monkeypatch, tmp_path
):
    p = make_pipeline(partitions=2, overrides={"airflow": {"retry_delay": "1s"}})
    per = produce_clicks(broker, p.topic, 2, 500, late=3)
    monkeypatch.setenv("STRATA_CONF_DIR", str(p.conf_dir))
    dag = load_dags(p.conf_dir).dags.__getitem__(f"strata_ingest_{p.name}")
    # `dag.test()` runs the tasks in this process: the fault is installed here.
    fails_once = Injected(fail_once_at=faults.AFTER_DATA_COMMIT, once=str(tmp_path / "failed-once"))
    with installed(fails_once):
        run = dag.test()
    assert (tmp_path / "failed-once").exists(), "the first attempt failed after the data commit"
    assert str(run.state) == "success", states(run)
    ingest = next(ti for ti in run.get_task_instances() if ti.task_id == "ingest")
    assert ingest.try_number == 2
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)


def test_the_backfill_dag_replaces_a_range_and_reads_the_raw_copy_when_kafka_lost_it(
    make_pipeline, broker, spark, airflow_db, monkeypatch
):
    p = make_pipeline(partitions=1)
    per = produce_clicks(broker, p.topic, 1, 1000, malformed=2)
    assert p.cli("run").returncode == 0
    monkeypatch.setenv("STRATA_CONF_DIR", str(p.conf_dir))
    dag = load_dags(p.conf_dir).dags.__getitem__("strata_backfill")
    conf = {
        "pipeline": p.name,
        "topic": p.topic,
        "partition": 0,
        "from_offset": 100,
        "to_offset": 400,
        "reason": "INC-1",
    }

    run = dag.test(run_conf=conf)
    assert str(run.state) == "success", states(run)
    assert p.landed() == expected_offsets(per)
    assert [
        (r["kind"], r["note"], r["start_offset"])
        for r in read_ledger(p.cfg().places()).to_pylist()
        if r["batch"] == 2
    ] == [("backfill", "INC-1", 100)]

    broker.delete_topic(p.topic)
    broker.create_topic(p.topic, 1)
    run = dag.test(run_conf={**conf, "from_offset": 500, "to_offset": 900, "reason": "INC-2"})
    assert str(run.state) == "success", states(run)
    result = next(ti for ti in run.get_task_instances() if ti.task_id == "backfill").xcom_pull(
        task_ids="backfill"
    )
    assert "read from the raw copy" in result["warnings"][0]
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)


def test_the_spark_submit_path_ships_the_job_to_spark(
    make_pipeline, broker, airflow_db, monkeypatch, tmp_path
):
    p = make_pipeline(
        partitions=2,
        overrides={"airflow": {"spark_mode": "spark_submit", "spark_conn_id": "strata_spark"}},
    )
    per = produce_clicks(broker, p.topic, 2, 600)
    monkeypatch.setenv("STRATA_CONF_DIR", str(p.conf_dir))
    # A Spark connection to a local[2] master, as a deployment would define one.
    monkeypatch.setenv("AIRFLOW_CONN_STRATA_SPARK", '{"conn_type": "spark", "host": "local[2]"}')
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.chdir(tmp_path)  # nothing may rely on the driver's working directory
    # A deployment copies the DAG files into its own DAGs folder, away from the project.
    folder = tmp_path / "dags"
    folder.mkdir()
    shutil.copy(DAGS / "strata_ingest.py", folder)
    dag = load_dags(p.conf_dir, folder).dags[f"strata_ingest_{p.name}"]
    ingest = dag.get_task("ingest")
    assert type(ingest).__name__ == "SparkSubmitOperator"
    run = dag.test()
    assert str(run.state) == "success", states(run)
    assert p.landed() == expected_offsets(per)


def test_the_maintenance_dag_compacts_checkpoints_and_vacuums_each_pipeline(
    make_pipeline, broker, spark, airflow_db, monkeypatch
):
    from deltalake import DeltaTable

    from strata.run import reprocess, run_batch
    from strata.store.ranges import OffsetRange

    p = make_pipeline(partitions=1)
    per = produce_clicks(broker, p.topic, 1, 400)
    run_batch(p.cfg(), session=lambda _: spark)
    late = produce_clicks(broker, p.topic, 1, 400, seed=3)
    per = {0: per[0] + late[0]}
    run_batch(p.cfg(), session=lambda _: spark)
    reprocess(
        p.cfg(),
        "backfill",
        [OffsetRange(p.topic, 0, 0, 200)],
        "maintenance test",
        session=lambda _: spark,
    )
    table_dir = Path(p.cfg().location("table"))
    replaced = {f.name for f in table_dir.rglob("part-b*.parquet")}
    some = next(table_dir.rglob("part-b0000000001-*.parquet"))
    # What a killed attempt of batch 1 left: never in the log, and never can be.
    orphan = some.with_name("part-b0000000001-t00007-a9-0badf00d-f000.snappy.parquet")
    orphan.write_bytes(some.read_bytes())
    monkeypatch.setenv("STRATA_CONF_DIR", str(p.conf_dir))
    # Vacuum deletes the saved plans of ingest batches older than the kept tail.
    monkeypatch.setattr("strata.batch.plan.KEPT_PLANS", 1)
    dag = load_dags(p.conf_dir).dags["strata_maintenance"]
    assert [t.task_id for t in dag.tasks if p.name in t.task_id] == [
        f"compact_{p.name}",
        f"register_{p.name}",
        f"checkpoint_{p.name}",
        f"vacuum_{p.name}",
    ]
    run = dag.test()
    assert str(run.state) == "success", states(run)
    assert any("strata.compaction" in c for c in DeltaTable(str(table_dir)).history(10))
    assert not orphan.exists()
    plans = sorted(f.name for f in p.warehouse.rglob("plans/batch-*.json"))
    assert plans == ["batch-0000000003.json"]  # the backfill's plan stays
    # What the backfill and the compaction replaced stays for readers until the retention.
    assert replaced - {orphan.name} <= {f.name for f in table_dir.rglob("part-b*.parquet")}
    assert (table_dir / "_delta_log" / "_last_checkpoint").exists()
    assert p.landed() == expected_offsets(per)


@pytest.mark.parametrize("gate", ["fail", "warn"])
def test_the_quality_task_fails_under_fail_and_passes_under_warn(
    make_pipeline, broker, spark, airflow_db, monkeypatch, gate
):
    # Latencies run up to 900 ms: the declared range fails on every batch.
    p = make_pipeline(
        partitions=2,
        overrides={
            "airflow": {"retry_delay": "1s"},
            "quality": {"gate": gate, "ranges": {"latency_ms": {"max": 500}}},
        },
    )
    per = produce_clicks(broker, p.topic, 2, 300)
    monkeypatch.setenv("STRATA_CONF_DIR", str(p.conf_dir))
    run = load_dags(p.conf_dir).dags.__getitem__(f"strata_ingest_{p.name}").test()
    tasks = states(run)
    gate_ti = next(ti for ti in run.get_task_instances() if ti.task_id == "quality_gate")
    # The batch is committed either way: quality never loses or blocks data.
    assert p.landed() == expected_offsets(per)
    assert tasks["ingest"] == "success" and tasks["register"] == "success"
    if gate == "fail":
        assert str(run.state) == "failed" and tasks["quality_gate"] == "failed"
        assert gate_ti.try_number == 1, "a failed gate is not retried"
    else:
        assert str(run.state) == "success", tasks
        shown = gate_ti.xcom_pull(task_ids="quality_gate")
        assert shown["success"] is False and shown["batch"] == 1
        assert "expect_column_values_to_be_between latency_ms" in shown["failed"]
