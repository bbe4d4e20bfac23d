"""The replay and maintenance DAGs under `dag.test()`, against the real broker and Spark.

Trino cannot be installed here: its calls go to tests/fake_trino.py, over https.
"""

from __future__ import annotations

import base64
import json

from strata.catalog.sql import ddl_statements
from strata.run import run_batch
from strata.store.ledger import read_ledger
from tests.conftest import expected_offsets, produce_clicks
from tests.fake_trino import FakeTrino, self_signed_certificate
from tests.integration.test_airflow import load_dags, states
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


def test_the_maintenance_dag_runs_the_ddl_through_the_airflow_trino_connection(
    make_pipeline, broker, spark, airflow_db, monkeypatch, tmp_path, capfd, caplog
):
    password = "conn-pw-Vb81"
    p = make_pipeline(
        partitions=1,
        overrides={
            "airflow": {"trino_conn_id": "strata_trino"},
            "trino": {"register_delta_tables": True},
        },
    )
    per = produce_clicks(broker, p.topic, 1, 200)
    run_batch(p.cfg(), session=lambda _: spark)
    cert, key = self_signed_certificate(tmp_path)
    # requests lets these win over a connection's own `verify`; a worker must not set them.
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    with FakeTrino((cert, key)) as fake:
        connection = {
            "conn_type": "trino",
            "host": "127.0.0.1",
            "port": fake.port,
            "login": "airflow",
            "password": password,
            "extra": {"protocol": "https", "verify": str(cert)},
        }
        monkeypatch.setenv("AIRFLOW_CONN_STRATA_TRINO", json.dumps(connection))
        monkeypatch.setenv("STRATA_CONF_DIR", str(p.conf_dir))
        run = load_dags(p.conf_dir).dags["strata_maintenance"].test()
    assert str(run.state) == "success", states(run)

    cfg = p.cfg()
    wanted = ddl_statements(
        cfg.places(), cfg.schemas(), cfg.metastore, cfg.trino.delta_catalog, cfg.trino.hive_catalog
    )
    signed = "Basic " + base64.b64encode(f"airflow:{password}".encode()).decode()
    assert fake.requests == [("airflow", signed, s) for s in wanted]
    register = next(ti for ti in run.get_task_instances() if ti.task_id == f"register_{p.name}")
    shown = register.xcom_pull(task_ids=f"register_{p.name}")
    assert shown["trino"] == {"conn_id": "strata_trino", "ran": wanted}
    seen = capfd.readouterr()
    logs = seen.out + seen.err + caplog.text
    assert f"register_{p.name}" in logs, "the task logs were captured"
    assert password not in json.dumps(shown) + logs
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
