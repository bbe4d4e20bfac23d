"""Iceberg tables (`table_format: iceberg`): the same promise through pyiceberg's Hive catalog.

Through the real broker, Spark and the Hive Metastore; every read back is pyiceberg's
own scan, through a catalog of its own.
"""

from __future__ import annotations

import json
import signal
from datetime import UTC, datetime

import pytest
from pyiceberg.catalog.hive import HiveCatalog

from strata import faults
from strata.run import reprocess, run_batch
from strata.store.ledger import ledger_state, read_ledger
from strata.store.ranges import OffsetRange
from tests.conftest import expected_offsets, produce_clicks
from tests.faults import armed


def iceberg_pipeline(make_pipeline, metastore, partitions: int = 3, **overrides):
    """A click pipeline writing Iceberg tables, in a database of its own."""
    p = make_pipeline(
        partitions=partitions,
        overrides={
            "table_format": "iceberg",
            "metastore": {"uri": metastore.uri, "database": "ice"},
            **overrides,
        },
    )
    return p


def readers_table(p, which: str = "table"):
    cfg = p.cfg()
    catalog = HiveCatalog("readers", uri=cfg.metastore.uri)
    return catalog.load_table((cfg.metastore.database, cfg.places().table(which).name))


def test_click_events_land_in_iceberg_tables_once_each_in_its_event_hour(
    make_pipeline, broker, metastore, spark
):
    p = iceberg_pipeline(make_pipeline, metastore)
    per = produce_clicks(broker, p.topic, 3, 2000, malformed=7, late=5)

    first = run_batch(p.cfg(), session=lambda _: spark)
    assert (first.status, first.batch) == ("committed", 1)
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)

    data = readers_table(p).scan().to_arrow()
    # Each row in the hour of its event time (UTC), as the partition columns say.
    for ts, dt, hr in zip(
        data.column("ts").to_pylist(),
        data.column("dt").to_pylist(),
        data.column("hr").to_pylist(),
        strict=True,
    ):
        moment = datetime.fromtimestamp(ts / 1000, UTC)
        assert (dt, hr) == (moment.strftime("%Y-%m-%d"), moment.strftime("%H"))
    quarantined = readers_table(p, "quarantine").scan().to_arrow().to_pylist()
    assert len(quarantined) == 7
    assert all(r["reason"] for r in quarantined)

    # The metastore holds Iceberg tables, not Hive or Delta definitions of them.
    table = readers_table(p)
    assert table.metadata.properties["strata.batch." + p.name] == "1"
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary["strata.batch"] == "1"
    ranges = json.loads(snapshot.summary["strata.ranges"])
    assert sum(r["rows"] for r in ranges) == data.num_rows
    spec = [(f.name, str(f.transform)) for f in table.spec().fields]
    assert spec == [("dt", "identity"), ("hr", "identity")]

    # A second batch appends a snapshot of its own; a run with nothing new adds none.
    more = produce_clicks(broker, p.topic, 3, 600, seed=11)
    second = run_batch(p.cfg(), session=lambda _: spark)
    assert (second.status, second.batch) == ("committed", 2)
    total = {q: per[q] + more[q] for q in per}
    assert p.landed() == expected_offsets(total)
    snapshots = readers_table(p).snapshots()
    idle = run_batch(p.cfg(), session=lambda _: spark)
    assert idle.status == "idle"
    assert len(readers_table(p).snapshots()) == len(snapshots)


STEPS = [
    faults.AFTER_FILES,
    faults.AFTER_RAW_COMMIT,
    faults.AFTER_QUARANTINE_COMMIT,
    faults.AFTER_DATA_COMMIT,
    faults.AFTER_LEDGER,
]


@pytest.mark.parametrize("step", STEPS)
def test_a_kill_at_each_commit_step_then_a_rerun_lands_each_message_once(
    make_pipeline, broker, metastore, spark, step
):
    p = iceberg_pipeline(make_pipeline, metastore)
    per = produce_clicks(broker, p.topic, 3, 1500, malformed=5, late=5)

    crashed = p.cli("run", env=p.env(**armed(crash_at=step)))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr

    rerun = run_batch(p.cfg(), session=lambda _: spark)
    assert (rerun.status, rerun.batch) == (
        ("idle", None) if step == faults.AFTER_LEDGER else ("resumed", 1)
    )
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)
    ledger = read_ledger(p.cfg().places()).to_pylist()
    assert sorted((r["batch"], r["partition"]) for r in ledger) == [(1, q) for q in range(3)]
    assert sum(r["quarantined"] for r in ledger) == 5
    # Each table holds one snapshot of the batch's files, whichever run committed it.
    for which in ("table", "raw", "quarantine"):
        batches = [
            s.summary["strata.batch"]
            for s in readers_table(p, which).snapshots()
            if s.summary is not None and "strata.batch" in s.summary
        ]
        assert batches == ["1"], which


def strata_snapshots(p, which: str) -> list[dict[str, str]]:
    """The summaries of a table's snapshots that a Strata commit or edit wrote."""
    return [
        {**s.summary.additional_properties, "operation": s.summary.operation.value}
        for s in readers_table(p, which).snapshots()
        if s.summary is not None and ("strata.batch" in s.summary or "strata.fence" in s.summary)
    ]


def test_a_backfill_replaces_the_range_in_one_commit_and_reads_the_raw_copy_kafka_lost(
    make_pipeline, broker, metastore, spark
):
    p = iceberg_pipeline(make_pipeline, metastore, partitions=2)
    per = produce_clicks(broker, p.topic, 2, 1600, malformed=4)
    run_batch(p.cfg(), session=lambda _: spark)
    before = {
        (r["_partition"], r["_offset"]): r["event_id"]
        for r in p.table_rows("table", ["_partition", "_offset", "event_id"]).to_pylist()
    }

    outcome = reprocess(
        p.cfg(),
        "backfill",
        [OffsetRange(p.topic, 0, 100, 600)],
        "decoder fix",
        session=lambda _: spark,
    )
    assert outcome.status == "backfilled" and outcome.batch == 2 and not outcome.warnings
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)
    rows = p.table_rows("table", ["_partition", "_offset", "_batch", "event_id"]).to_pylist()
    for r in rows:
        key = (r["_partition"], r["_offset"])
        inside = key[0] == 0 and 100 <= key[1] < 600
        assert r["_batch"] == (2 if inside else 1), key
        assert r["event_id"] == before[key]
    # The range's old rows went and its new rows came in one metadata commit: the data
    # table's batch 2 is a delete and an append, both recording the batch.
    batch2 = [s for s in strata_snapshots(p, "table") if s.get("strata.batch") == "2"]
    assert sorted(s["operation"] for s in batch2) in (["append", "delete"], ["append", "overwrite"])

    # Kafka loses the topic: the next backfill of committed offsets reads the raw copy,
    # whose files the driver lists for the tasks.
    broker.delete_topic(p.topic)
    broker.create_topic(p.topic, 2)
    produce_clicks(broker, p.topic, 2, 1700, seed=9)
    again = reprocess(
        p.cfg(), "backfill", [OffsetRange(p.topic, 1, 0, 500)], "again", session=lambda _: spark
    )
    assert again.batch == 3 and "read from the raw copy" in again.warnings[0]
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)
    batches = {
        r["_batch"]
        for r in p.table_rows("table", ["_partition", "_offset", "_batch"]).to_pylist()
        if r["_partition"] == 1 and r["_offset"] < 500
    }
    assert batches == {3}
    assert ledger_state(p.cfg().places()).committed == {(p.topic, 0): per[0], (p.topic, 1): per[1]}


def test_a_forced_drop_removes_what_the_batch_committed_and_fences_the_rest(
    make_pipeline, broker, metastore, spark
):
    p = iceberg_pipeline(make_pipeline, metastore, partitions=2)
    per = produce_clicks(broker, p.topic, 2, 1200, malformed=3)
    crashed = p.cli("run", env=p.env(**armed(crash_at=faults.AFTER_RAW_COMMIT)))
    assert crashed.returncode == -signal.SIGKILL
    assert p.raw_copies() == expected_offsets(per)

    refused = p.cli("plan", "drop", "--batch", "1", "--reason", "poison")
    assert refused.returncode == 1 and "--force" in refused.stderr
    dropped = p.cli("plan", "drop", "--batch", "1", "--force", "--reason", "poison")
    assert dropped.returncode == 0, dropped.stderr
    # The raw copy's files of the batch went; every table holds the batch's number, so a
    # runner still holding the plan commits nothing of it.
    assert p.raw_copies() == {}
    for which in ("raw", "quarantine", "table"):
        assert readers_table(p, which).metadata.properties["strata.batch." + p.name] == "1"

    assert run_batch(p.cfg(), session=lambda _: spark).batch == 2
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)


def test_a_seek_fences_the_iceberg_tables_with_its_batch(make_pipeline, broker, metastore, spark):
    p = iceberg_pipeline(make_pipeline, metastore, partitions=1)
    first = produce_clicks(broker, p.topic, 1, 100)
    assert run_batch(p.cfg(), session=lambda _: spark).batch == 1
    produce_clicks(broker, p.topic, 1, 300, seed=2)
    forward = p.cli("ledger", "seek", "--topic", p.topic, "--to", "350", "--reason", "skip")
    assert forward.returncode == 0, forward.stderr
    for which in ("raw", "quarantine", "table"):
        assert readers_table(p, which).metadata.properties["strata.batch." + p.name] == "2"
        fences = [s for s in strata_snapshots(p, which) if "strata.fence" in s]
        assert [f["strata.batch"] for f in fences] == ["2"]
    more = produce_clicks(broker, p.topic, 1, 10, seed=3)
    done = run_batch(p.cfg(), session=lambda _: spark)
    assert done.batch == 3
    end = first[0] + 301 + more[0]
    landed = p.landed()
    assert sorted(o for _, o in landed) == list(range(first[0])) + list(range(350, end))
    assert set(landed.values()) == {1}
