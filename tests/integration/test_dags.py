"""The replay and maintenance DAGs under `dag.test()`, against the real broker and Spark.

The maintenance DAG's Trino DDL runs through an Airflow connection to the session's real
Trino (`trino`), which records the statements it ran and answers every table's rows.
"""

from __future__ import annotations

import uuid

import pytest

from strata.quality.run import run_quality
from strata.run import run_batch
from strata.store.ledger import read_ledger
from strata.store.places import TABLE_ROLES
from tests.conftest import expected_offsets, produce_clicks
from tests.integration.test_airflow import load_dags, states
from tests.trino_reads import (
    airflow_connection,
    queries_of,
    registering_settings,
    strata_counts,
    trino_counts,
)
from tests.unit.test_airflow import a_deployment_with_a_malformed_pipeline


def test_the_replay_dag_replays_a_batch_from_the_raw_copy(
    make_pipeline, broker, spark, airflow_db, monkeypatch
):
    p = make_pipeline(partitions=2)
    per = produce_clicks(broker, p.topic, 2, 300, malformed=2)
    run_batch(p.cfg(), session=lambda _: spark)
    monkeypatch.setenv("STRATA_CONF_DIR", str(p.conf_dir))
    dag = load_dags(p.conf_dir).dags["strata_replay"]

    run = dag.test(run_conf={"pipeline": p.name, "from_batch": 1, "reason": "decoder fix"})
    assert str(run.state) == "success", states(run)
    shown = next(ti for ti in run.get_task_instances() if ti.task_id == "replay").xcom_pull(
        task_ids="replay"
    )
    assert (shown["status"], shown["batch"]) == ("replayed", 2)
    ledger = read_ledger(p.cfg().places()).to_pylist()
    first = [r for r in ledger if r["batch"] == 1]
    assert shown["messages"] == sum(per.values())
    assert shown["quarantined"] == sum(r["quarantined"] for r in first) > 0
    assert sorted(
        (r["kind"], r["note"], r["partition"], r["start_offset"], r["end_offset"])
        for r in ledger
        if r["batch"] == 2
    ) == [("replay", "decoder fix", q, 0, n) for q, n in sorted(per.items())]
    assert p.landed() == expected_offsets(per)


@pytest.mark.parametrize("table_format", ["delta", "parquet"])
def test_the_maintenance_dag_runs_the_ddl_through_the_airflow_trino_connection(
    table_format, make_pipeline, broker, spark, metastore, trino, airflow_db, monkeypatch
):
    user = "airflow_" + uuid.uuid4().hex[:6]
    p = make_pipeline(
        partitions=1,
        overrides={
            "table_format": table_format,
            "metastore": {"uri": metastore.uri, "database": user},
            "airflow": {"trino_conn_id": "strata_trino"},
            "trino": registering_settings(table_format),
        },
    )
    per = produce_clicks(broker, p.topic, 1, 200, malformed=2)
    run_batch(p.cfg(), session=lambda _: spark)
    cfg = p.cfg()
    run_quality(cfg.places(), cfg.quality, cfg.schemas(), cfg.metastore, cfg.warehouse)
    monkeypatch.setenv("AIRFLOW_CONN_STRATA_TRINO", airflow_connection(trino, user))
    monkeypatch.setenv("STRATA_CONF_DIR", str(p.conf_dir))
    run = load_dags(p.conf_dir).dags["strata_maintenance"].test()
    assert str(run.state) == "success", states(run)

    register = next(ti for ti in run.get_task_instances() if ti.task_id == f"register_{p.name}")
    shown = register.xcom_pull(task_ids=f"register_{p.name}")
    ran = shown["trino"]["ran"]
    assert shown["trino"]["conn_id"] == "strata_trino"
    # Trino's own record: every statement of the DDL, through the Airflow hook (its
    # `source`), as the connection's user, each finished.
    assert queries_of(trino, user) == [("airflow", "FINISHED", s) for s in ran]
    catalog = '"delta_elsewhere"' if table_format == "delta" else '"hive"'
    assert ran[0] == f'CREATE SCHEMA IF NOT EXISTS {catalog}."{user}"'
    names = [cfg.places().table(which).name for which in TABLE_ROLES]
    if table_format == "delta":
        call = f"CALL {catalog}.system.register_table(schema_name => '{user}', "
        assert all(s.startswith(call) for s in ran[1:]), ran
        assert [s.split("table_name => '")[1].split("'")[0] for s in ran[1:]] == names
    else:
        created = [f'CREATE TABLE IF NOT EXISTS {catalog}."{user}"."{n}" (' for n in names]
        assert [s.split("\n")[0] for s in ran[1:-1]] == created
        assert (
            ran[-1] == f"CALL {catalog}.system.sync_partition_metadata('{user}', '{p.name}', 'ADD')"
        )
    # Every table answers there with the rows Strata's readers read, maintained.
    counts = strata_counts(cfg)
    assert all(counts.values()), counts
    assert trino_counts(trino, cfg) == counts
    assert p.landed() == expected_offsets(per)


def test_where_airflow_records_parsing_a_malformed_pipeline_leaves_the_others_scheduled(
    airflow_db, tmp_path, monkeypatch
):
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel
    from airflow.models.errors import ParseImportError
    from airflow.utils.session import create_session
    from sqlalchemy import select

    conf, folder = a_deployment_with_a_malformed_pipeline(tmp_path)
    for shared in ("strata_backfill.py", "strata_replay.py", "strata_maintenance.py"):
        (folder / shared).unlink()  # their DAG ids are the other tests' too, in one database
    monkeypatch.setenv("STRATA_CONF_DIR", str(conf))
    # What the DAG processor does with each parse: import errors and DAGs into the database.
    bundle = f"strata-{tmp_path.name}"
    with create_session() as session:
        session.add(DagBundleModel(name=bundle))
    bag = DagBag(dag_folder=str(folder), bundle_path=folder, bundle_name=bundle)
    sync_bag_to_db(bag, bundle, None)
    with create_session() as session:
        dags = {
            d.dag_id: (d.is_stale, d.has_import_errors)
            for d in session.scalars(select(DagModel).where(DagModel.bundle_name == bundle))
        }
        errors = {
            e.filename: e.stacktrace
            for e in session.scalars(
                select(ParseImportError).where(ParseImportError.bundle_name == bundle)
            )
        }
    # Airflow marks every DAG of a file with an import error stale: the good pipeline's
    # DAG is in a file of its own, so it stays scheduled.
    assert dags["strata_ingest_good"] == (False, False)
    assert "strata_ingest_bad" not in dags
    assert sorted(errors) == ["strata_config_errors.py", "strata_ingest_bad.py"]
    for error in errors.values():
        assert f"{conf / 'pipelines' / 'bad.yaml'}: key `limts`" in error
