"""Partition completeness through the real run: broker, Spark, metastore, Airflow."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml
from deltalake import DeltaTable

from strata.catalog.completeness import MARKER, Completeness, completeness
from strata.catalog.metastore import MetastoreClient
from strata.catalog.register import publish_completeness
from strata.cli import main
from strata.edge import registration
from strata.run import run_batch
from strata.store.files import filesystem
from tests.conftest import ROOT, START_MS, produce_clicks, s3_pipeline
from tests.integration.test_airflow import load_dags, states

HOUR_MS = 3_600_000
# START_MS is 2025-11-22T10:00Z: the hour the tests complete.
HOUR = "dt=2025-11-22/hr=10"
LATER = "dt=2025-11-22/hr=12"


def publish(cfg, batch: int) -> tuple[Completeness | None, list[str]]:
    """Publish a batch's completeness with the pipeline's sections, as the entry points do."""
    return publish_completeness(registration(cfg), batch)


def completeness_now(cfg) -> Completeness:
    """Each partition's completeness, as `strata completeness` works it out."""
    return completeness(
        cfg.places(), cfg.completeness, cfg.partitioning, cfg.quality.gate, cfg.asset_uri
    )


def route(p, topics: list[str]) -> None:
    """Make the pipeline send each topic to a table named after it."""
    path = p.conf_dir / "pipelines" / f"{p.name}.yaml"
    body = yaml.safe_load(path.read_text())
    body.update(topics=topics, schema_file="{table}.avsc", routing={"table": "{topic}"})
    path.write_text(yaml.safe_dump(body))
    cfg = p.cfg()
    for topic in topics:
        schema = p.conf_dir.parent / "schemas" / f"{cfg.table_for(topic)}.avsc"
        schema.write_bytes((ROOT / "schemas" / "clicks.avsc").read_bytes())


def events(dag) -> list[tuple[str, dict]]:
    """The Asset events the DAG's runs emitted, oldest first: (URI, extra)."""
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session

    with create_session() as session:
        found = session.query(AssetEvent).filter(AssetEvent.source_dag_id == dag.dag_id)
        return [(e.asset.uri, e.extra) for e in found.order_by(AssetEvent.id)]


def partition_parameters(metastore, p) -> dict[str, dict[str, str]]:
    with MetastoreClient(metastore.uri, 30) as client:
        return {
            f"dt={part.values[0]}/hr={part.values[1]}": part.parameters
            for part in client.partitions("strata", p.name)
        }


def test_an_hour_is_complete_only_after_the_lateness_and_late_rows_are_counted(
    make_pipeline, broker, spark, metastore
):
    p = make_pipeline(
        partitions=2,
        overrides={
            "table_format": "parquet",
            "metastore": {"uri": metastore.uri},
            "completeness": {"lateness": "1h", "marker": True},
        },
    )
    table = Path(p.cfg().location("table"))
    first = produce_clicks(broker, p.topic, 2, 100, hours=1)
    run_batch(p.cfg(), session=lambda _: spark)
    publish(p.cfg(), 1)
    found = completeness_now(p.cfg())
    # The older of the partitions' newest event times: partition 0's last click (event
    # 98 of 100, 36 s apart).
    assert found.watermark == "2025-11-22T10:58:48Z"
    assert [(s.partition, s.complete) for s in found.partitions] == [(HOUR, False)]
    assert "strata.complete" not in partition_parameters(metastore, p)[HOUR]
    assert not (table / HOUR / MARKER).exists()

    # Events of 12:00-13:00 on both partitions: 10:00-11:00 is now over by more than 1h.
    second = produce_clicks(broker, p.topic, 2, 40, hours=1, start_ms=START_MS + 2 * HOUR_MS)
    # `strata run` registers, then marks what the batch completed (after its quality run).
    done = p.cli("run", "--no-quality", "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout.strip().splitlines()[-1])
    assert body["completed"] == [HOUR] and f"complete now: {HOUR}" in done.stdout
    assert "1 partitions marked complete" in body["registered"]
    params = partition_parameters(metastore, p)
    assert params[HOUR]["strata.complete"] == "true"
    assert params[HOUR]["strata.completed_batch"] == "2"
    # Partition 0's last click again (event 38 of 40, 90 s apart).
    assert params[HOUR]["strata.watermark"] == "2025-11-22T12:57:00Z"
    assert "strata.complete" not in params[LATER]
    assert json.loads((table / HOUR / MARKER).read_text())["strata.completed_batch"] == "2"
    assert not (table / LATER / MARKER).exists()
    # Readers skip the marker: Spark over the directories reads exactly the rows.
    landed = sum(first.values()) + sum(second.values())
    assert spark.read.parquet(str(table)).count() == landed

    # A producer still writing 10:00-11:00 events: they land, and are counted as late.
    late = produce_clicks(broker, p.topic, 2, 6, hours=1, seed=11)
    outcome = run_batch(p.cfg(), session=lambda _: spark)
    late_rows = sum(late.values())
    assert any(
        f"landed {late_rows} rows in 1 partitions already complete: {HOUR} ({late_rows})" in w
        for w in outcome.warnings
    ), outcome.warnings
    shown = p.cli("completeness", "--json")
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout.strip().splitlines()[-1])
    by_partition = {s["partition"]: s for s in view["partitions"]}
    assert by_partition[HOUR]["complete"] and by_partition[HOUR]["late_rows"] == late_rows
    assert not by_partition[LATER]["complete"] and view["holding"] in (
        f"{p.topic}:0",
        f"{p.topic}:1",
    )
    assert f"{HOUR}  complete since batch 2" in shown.stdout
    assert spark.read.parquet(str(table)).count() == landed + late_rows


def test_a_run_reads_its_batchs_state_and_data_files_once_for_late_rows_and_completion(
    make_pipeline, broker, spark, monkeypatch, capsys
):
    from strata.catalog import completeness as module

    p = make_pipeline(partitions=2, overrides={"completeness": {"lateness": "1h"}})
    argv = ["--pipeline", p.name, "--conf-dir", str(p.conf_dir)]
    produce_clicks(broker, p.topic, 2, 60, hours=1)
    assert main(["run", "--no-quality", *argv]) == 0
    read: list[str] = []

    def counted(name: str):
        real = getattr(module, name)
        return lambda *args, **kwargs: read.append(name) or real(*args, **kwargs)

    for name in ("batch_state", "open_table"):
        monkeypatch.setattr(module, name, counted(name))

    def run() -> dict:
        read.clear()
        capsys.readouterr()
        assert main(["run", "--no-quality", "--json", *argv]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    # A run counts its rows late after completion, then (after the gate) announces what
    # it completed: both from the state its ledger commit recorded, as it committed it
    # (never read back from the ledger), and the data table as its commit read it back.
    produce_clicks(broker, p.topic, 2, 20, hours=1, start_ms=START_MS + 2 * HOUR_MS)
    assert run()["completed"] == [HOUR]
    assert read == [], read
    late = produce_clicks(broker, p.topic, 2, 4, hours=1, seed=5)
    body = run()
    assert read == [], read
    assert any(
        f"landed {sum(late.values())} rows in 1 partitions already complete: {HOUR}" in w
        for w in body["warnings"]
    ), body["warnings"]


def test_under_a_failing_gate_an_hour_is_complete_only_once_its_batch_is_checked(
    make_pipeline, broker, spark, metastore
):
    from tests.integration.quality.test_quality import check

    p = make_pipeline(
        partitions=2,
        overrides={
            "table_format": "parquet",
            "metastore": {"uri": metastore.uri},
            "quality": {"gate": "fail"},
        },
    )
    # Three hours of events in one batch, recent enough for the checks: it writes the
    # first hour and completes it.
    start = (int(time.time() * 1000) // HOUR_MS - 4) * HOUR_MS
    first = datetime.fromtimestamp(start / 1000, UTC).strftime("dt=%Y-%m-%d/hr=%H")
    produce_clicks(broker, p.topic, 2, 90, hours=3, start_ms=start)
    run_batch(p.cfg(), session=lambda _: spark)
    # Registered before the batch's quality check ran: the check may still fail.
    state = {s.partition: s for s in completeness_now(p.cfg()).partitions}[first]
    assert not state.complete and state.held_by == [1] and state.completed_batch == 1
    assert "strata.complete" not in partition_parameters(metastore, p)[first]
    # Checked and passed: the gate lets go, and the metastore says so at once.
    assert check(p.cfg(), 1).success
    found, problems = publish(p.cfg(), 1)
    assert problems == [] and found is not None and first in found.completed
    assert partition_parameters(metastore, p)[first]["strata.complete"] == "true"


def test_the_ingest_dag_emits_an_asset_event_only_when_an_hour_completes(
    make_pipeline, broker, spark, airflow_db, monkeypatch
):
    p = make_pipeline(partitions=2, overrides={"completeness": {"lateness": "30m", "marker": True}})
    monkeypatch.setenv("STRATA_CONF_DIR", str(p.conf_dir))
    dag = load_dags(p.conf_dir).dags[f"strata_ingest_{p.name}"]
    marker = Path(p.cfg().location("table")) / HOUR / MARKER

    first = produce_clicks(broker, p.topic, 2, 100, hours=1)
    run = dag.test()
    assert str(run.state) == "success", states(run)
    assert states(run)["complete"] == "skipped" and events(dag) == []
    assert not marker.exists()

    second = produce_clicks(broker, p.topic, 2, 40, hours=1, start_ms=START_MS + 2 * HOUR_MS)
    run = dag.test()
    assert str(run.state) == "success", states(run)
    assert states(run)["complete"] == "success"
    assert events(dag) == [
        (
            f"strata://{p.name}/{p.name}",
            {
                "batch": 2,
                "completed": [HOUR],
                "watermark": "2025-11-22T12:57:00Z",
                "late": {},
            },
        )
    ]
    # The Delta table's partition directory holds the marker; its readers read the log.
    landed = sum(first.values()) + sum(second.values())
    assert marker.exists() and not (marker.parent.parent / "hr=12" / MARKER).exists()
    assert DeltaTable(p.cfg().location("table")).to_pyarrow_table().num_rows == landed

    # Late rows into the complete hour: counted in the ingest's summary, and no event.
    late = sum(produce_clicks(broker, p.topic, 2, 4, hours=1, seed=5).values())
    run = dag.test()
    assert str(run.state) == "success", states(run)
    assert states(run)["complete"] == "skipped" and len(events(dag)) == 1
    ingest = next(ti for ti in run.get_task_instances() if ti.task_id == "ingest")
    warnings = ingest.xcom_pull(task_ids="ingest")["warnings"]
    assert any(f"landed {late} rows in 1 partitions already complete" in w for w in warnings)


def test_an_hour_a_failed_run_completed_is_announced_by_the_next_run(
    make_pipeline, broker, spark, airflow_db, monkeypatch
):
    p = make_pipeline(partitions=2, overrides={"completeness": {"lateness": "30m"}})
    monkeypatch.setenv("STRATA_CONF_DIR", str(p.conf_dir))
    path = p.conf_dir / "pipelines" / f"{p.name}.yaml"
    body = yaml.safe_load(path.read_text())
    dag = load_dags(p.conf_dir).dags[f"strata_ingest_{p.name}"]
    produce_clicks(broker, p.topic, 2, 60, hours=1)
    run = dag.test()
    assert str(run.state) == "success", states(run)

    # Batch 2 completes 10:00-11:00, but its quality gate fails (every user_id is out of
    # range): the run stops before `complete`, and nothing is announced.
    path.write_text(
        yaml.safe_dump({**body, "quality": {"gate": "fail", "ranges": {"user_id": {"max": 0}}}})
    )
    produce_clicks(broker, p.topic, 2, 20, hours=1, start_ms=START_MS + 2 * HOUR_MS)
    run = dag.test()
    assert str(run.state) == "failed" and states(run)["quality_gate"] == "failed", states(run)
    assert events(dag) == []

    # The next run announces the hour, though its own batch completed nothing new (12:00
    # is held by batch 2's failed gate).
    path.write_text(yaml.safe_dump(body))
    produce_clicks(broker, p.topic, 2, 20, hours=1, start_ms=START_MS + 3 * HOUR_MS)
    run = dag.test()
    assert str(run.state) == "success", states(run)
    assert [(uri, extra["batch"], extra["completed"]) for uri, extra in events(dag)] == [
        (f"strata://{p.name}/{p.name}", 3, [HOUR])
    ]
    # Announced once: a run with nothing new announces nothing again.
    run = dag.test()
    assert states(run)["complete"] == "skipped" and len(events(dag)) == 1


def test_a_pipeline_routed_to_tables_announces_each_table_on_its_own(
    make_pipeline, broker, spark, airflow_db, monkeypatch
):
    p = make_pipeline(partitions=1, overrides={"completeness": {"lateness": "30m"}})
    topics = [f"{p.topic}.web", f"{p.topic}.app"]
    for topic in topics:
        broker.create_topic(topic, 1)
        produce_clicks(broker, topic, 1, 30, hours=1)
    route(p, topics)
    monkeypatch.setenv("STRATA_CONF_DIR", str(p.conf_dir))
    dag = load_dags(p.conf_dir).dags[f"strata_ingest_{p.name}"]
    run = dag.test()
    assert str(run.state) == "success", states(run)
    assert states(run)["complete"] == "skipped"

    # Only the web topic moves on: only its table completes 10:00-11:00.
    produce_clicks(broker, topics[0], 1, 10, hours=1, start_ms=START_MS + 2 * HOUR_MS)
    run = dag.test()
    assert str(run.state) == "success", states(run)
    web = p.cfg().table_for(topics[0])
    assert [(uri, extra["completed"]) for uri, extra in events(dag)] == [
        (f"strata://{p.name}/{web}", [HOUR])
    ]
    # The view goes over every table, as `strata status` does.
    shown = p.cli("completeness", "--json")
    assert shown.returncode == 0, shown.stderr
    tables = json.loads(shown.stdout.splitlines()[-1])["tables"]
    assert {
        name: [s["partition"] for s in body["partitions"] if s["complete"]]
        for name, body in tables.items()
    } == {web: [HOUR], p.cfg().table_for(topics[1]): []}


def test_the_marker_is_written_on_s3(make_pipeline, broker, spark, s3_endpoint, tmp_path):
    p, options = s3_pipeline(
        make_pipeline,
        s3_endpoint,
        tmp_path,
        "complete",
        completeness={"marker": True, "lateness": "30m"},
    )
    produce_clicks(broker, p.topic, 2, 50, hours=1)
    run_batch(p.cfg(), session=lambda _: spark)
    produce_clicks(broker, p.topic, 2, 20, hours=1, start_ms=START_MS + 2 * HOUR_MS)
    run_batch(p.cfg(), session=lambda _: spark)
    found, problems = publish(p.cfg(), 2)
    assert problems == [] and found is not None and found.completed == [HOUR]
    fs, root = filesystem(p.cfg().location("table"), options)
    marker = fs.get_file_info([f"{root}/{HOUR}/{MARKER}", f"{root}/{LATER}/{MARKER}"])
    assert [m.type.name for m in marker] == ["File", "NotFound"]
