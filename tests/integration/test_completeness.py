"""Partition completeness through the real run: broker, Spark, metastore, Airflow."""

from __future__ import annotations

import json
from pathlib import Path

from strata.completeness import MARKER, completeness, publish_completeness
from strata.metastore import MetastoreClient
from strata.run import run_batch
from tests.conftest import START_MS, produce_clicks
from tests.integration.test_airflow import load_dags, states

HOUR_MS = 3_600_000
# START_MS is 2025-11-22T10:00Z: the hour the tests complete.
HOUR = "dt=2025-11-22/hr=10"
LATER = "dt=2025-11-22/hr=12"


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
    publish_completeness(p.cfg(), 1)
    found = completeness(p.cfg())
    assert found.watermark == "2025-11-22T10:59:59.999000Z"
    assert [(s.partition, s.complete) for s in found.partitions] == [(HOUR, False)]
    assert "strata.complete" not in partition_parameters(metastore, p)[HOUR]
    assert not (table / HOUR / MARKER).exists()

    # Events of 12:00-13:00 on both partitions: 10:00-11:00 is now over by more than 1h.
    second = produce_clicks(broker, p.topic, 2, 40, hours=1, start_ms=START_MS + 2 * HOUR_MS)
    outcome = run_batch(p.cfg(), session=lambda _: spark)
    assert outcome.register_error is None and "1 partitions marked complete" in outcome.registered
    done, problems = publish_completeness(p.cfg(), 2)
    assert problems == [] and done is not None and done.completed == [HOUR]
    params = partition_parameters(metastore, p)
    assert params[HOUR]["strata.complete"] == "true"
    assert params[HOUR]["strata.completed_batch"] == "2"
    assert params[HOUR]["strata.watermark"] == "2025-11-22T12:59:59.999000Z"
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


def test_the_ingest_dag_emits_an_asset_event_only_when_an_hour_completes(
    make_pipeline, broker, spark, airflow_db, monkeypatch
):
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session

    p = make_pipeline(partitions=2, overrides={"completeness": {"lateness": "30m"}})
    monkeypatch.setenv("STRATA_CONF_DIR", str(p.conf_dir))
    dag = load_dags(p.conf_dir).dags[f"strata_ingest_{p.name}"]

    def events() -> list[tuple[str, dict]]:
        with create_session() as session:
            found = session.query(AssetEvent).filter(AssetEvent.source_dag_id == dag.dag_id)
            return [(e.asset.uri, e.extra) for e in found.order_by(AssetEvent.id)]

    produce_clicks(broker, p.topic, 2, 100, hours=1)
    run = dag.test()
    assert str(run.state) == "success", states(run)
    assert states(run)["complete"] == "skipped" and events() == []

    produce_clicks(broker, p.topic, 2, 40, hours=1, start_ms=START_MS + 2 * HOUR_MS)
    run = dag.test()
    assert str(run.state) == "success", states(run)
    assert states(run)["complete"] == "success"
    assert events() == [
        (
            f"strata://{p.name}/{p.name}",
            {
                "batch": 2,
                "completed": [HOUR],
                "watermark": "2025-11-22T12:59:59.999000Z",
                "late": {},
            },
        )
    ]
