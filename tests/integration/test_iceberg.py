"""Iceberg tables (`table_format: iceberg`): the same promise through pyiceberg's Hive catalog.

Through the real broker, Spark and the Hive Metastore; every read back is pyiceberg's
own scan, through a catalog of its own.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from strata import faults
from strata.catalog.metastore import MetastoreClient
from strata.config import load_pipeline
from strata.local.service import free_port
from strata.local.trino import ELSEWHERE
from strata.maintenance.vacuum import vacuum
from strata.run import reprocess, run_batch
from strata.store import iceberg
from strata.store.ledger import ledger_state, read_ledger
from strata.store.parquet import WrittenFile
from strata.store.places import TableRef
from strata.store.ranges import OffsetRange
from tests.conftest import expected_offsets, iceberg_table, produce_clicks, s3_pipeline
from tests.faults import armed
from tests.integration.test_airflow import load_dags, states
from tests.integration.test_compaction import (
    compacted,
    ended,
    paused_at_its_last_check,
    small_batches,
    vacuum_once_free,
    wait_stopped,
)
from tests.integration.test_evolution import edit_schema, without_field
from tests.integration.test_recovery import last_json
from tests.integration.test_routes import _routed_tables
from tests.integration.test_runners import (
    run_once_the_lease_expires,
    second_host,
    wait_frozen,
)
from tests.trino_reads import (
    airflow_connection,
    queries_of,
    registering_settings,
    strata_counts,
    trino_counts,
    trino_rows,
)


def iceberg_pipeline(make_pipeline, metastore, partitions: int = 3, **overrides):
    """A click pipeline writing Iceberg tables in the local metastore."""
    p = make_pipeline(
        partitions=partitions,
        overrides={
            "table_format": "iceberg",
            "metastore": {"uri": metastore.uri},
            **overrides,
        },
    )
    return p


def readers_table(p, which: str = "table"):
    return iceberg_table(p.cfg(), which)


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

    # The run registered the tables: the Iceberg ones are the catalog's own entries (a
    # Hive reader sees `table_type=ICEBERG`), the ledger a Delta table; the data
    # table's completeness marks are Iceberg table properties.
    with MetastoreClient(metastore.uri, 30) as client:
        entry = client.get_table("strata", p.name)
        assert entry is not None and entry.parameters["table_type"] == "ICEBERG"
        ledger = client.get_table("strata", p.name + "_ledger")
        assert ledger is not None and ledger.parameters.get("spark.sql.sources.provider") == "delta"
    assert table.refresh().properties.get("strata.complete_before")

    # What a user reads: the status, the batch's quality checks, and Trino SQL run
    # embedded over the Iceberg tables' current snapshots.
    status = p.cli("status")
    assert status.returncode == 0 and "batch 1" in status.stdout, status.stderr
    quality = p.cli("quality", "--batch", "1", "--json")
    assert quality.returncode == 0, quality.stderr
    checks = {c["name"]: c["success"] for c in last_json(quality)["checks"]}
    # Every check reads the Iceberg table and passes, but the event-time window: the
    # test's events are a year older than the commit.
    failed = [name for name, ok in checks.items() if not ok]
    assert len(checks) > 5 and failed == ["expect_column_values_to_be_between"], checks
    assert last_json(quality)["rows"] == data.num_rows
    hourly = p.cli("sql", "query", "rows_per_hour", "--format", "json")
    assert hourly.returncode == 0, hourly.stderr
    assert sum(r["row_count"] for r in json.loads(hourly.stdout)) == data.num_rows
    reasons = p.cli("sql", "query", "quarantine_reasons", "--format", "json")
    assert reasons.returncode == 0, reasons.stderr
    assert sum(r["messages"] for r in json.loads(reasons.stdout)) == 7

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
    second = produce_clicks(broker, p.topic, 1, 300, seed=2)
    forward = p.cli("ledger", "seek", "--topic", p.topic, "--to", "350", "--reason", "skip")
    assert forward.returncode == 0, forward.stderr
    for which in ("raw", "quarantine", "table"):
        assert readers_table(p, which).metadata.properties["strata.batch." + p.name] == "2"
        fences = [s for s in strata_snapshots(p, which) if "strata.fence" in s]
        assert [f["strata.batch"] for f in fences] == ["2"]
    more = produce_clicks(broker, p.topic, 1, 10, seed=3)
    done = run_batch(p.cfg(), session=lambda _: spark)
    assert done.batch == 3
    end = first[0] + second[0] + more[0]
    landed = p.landed()
    assert sorted(o for _, o in landed) == list(range(first[0])) + list(range(350, end))
    assert set(landed.values()) == {1}


def s3_iceberg(make_pipeline, metastore, s3_endpoint, tmp_path, prefix: str, **overrides):
    """An Iceberg pipeline whose tables, plans and leases are on S3 (moto)."""
    p, _ = s3_pipeline(
        make_pipeline,
        s3_endpoint,
        tmp_path,
        prefix,
        table_format="iceberg",
        metastore={"uri": metastore.uri, "database": prefix},
        **overrides,
    )
    return p


def batch_snapshots(p, which: str, batch: int) -> int:
    """How many snapshots of a table record a commit of `batch` (fences left out)."""
    return sum(
        1
        for s in strata_snapshots(p, which)
        if s.get("strata.batch") == str(batch) and "strata.fence" not in s
    )


def test_two_runs_at_once_on_s3_land_each_message_once_in_iceberg(
    make_pipeline, broker, metastore, s3_endpoint, tmp_path
):
    p = s3_iceberg(make_pipeline, metastore, s3_endpoint, tmp_path, "iceruns1")
    other = second_host(p, tmp_path)
    per = produce_clicks(broker, p.topic, 2, 8000, malformed=5)
    runs = [p.spawn("run"), other.spawn("run")]
    outcomes = [(proc.wait(300), *proc.communicate()) for proc in runs]
    codes = sorted(code for code, _, _ in outcomes)
    assert codes in ([0, 0], [0, 3]), outcomes
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)
    for which in ("table", "raw", "quarantine"):
        assert readers_table(p, which).metadata.properties["strata.batch." + p.name] == "1"
        assert batch_snapshots(p, which, 1) == 1, which


def test_a_runner_paused_past_its_lease_commits_nothing_to_iceberg_when_it_wakes(
    make_pipeline, broker, metastore, s3_endpoint, tmp_path
):
    # Runner A freezes after its lease check, just before its raw commit, long enough
    # for its lease to run out; runner B takes the lease and commits the batch. A's
    # commit, on waking, finds the batch in the table (the property, under the
    # metastore's lock) and adds nothing; its next lease check stops it.
    p = s3_iceberg(make_pipeline, metastore, s3_endpoint, tmp_path, "iceruns2", lock_lease="4s")
    other = second_host(p, tmp_path)
    per = produce_clicks(broker, p.topic, 2, 3000, malformed=3)
    a = p.spawn("run", env=p.env(**armed(stop_at=faults.BEFORE_RAW_COMMIT)))
    deadline = time.monotonic() + 240
    wait_frozen(a, deadline)
    try:
        run_once_the_lease_expires(other, deadline)
    finally:
        os.kill(a.pid, signal.SIGCONT)
    out, err = a.communicate(timeout=300)
    assert a.returncode == 3, (out, err)
    assert "lost its lease" in err, err
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)
    for which in ("table", "raw", "quarantine"):
        assert batch_snapshots(p, which, 1) == 1, which
    # Every file the raw copy holds was written by runner B (one run id in the names).
    files = [t.file.file_path for t in readers_table(p, "raw").scan().plan_files()]
    assert len({f.split("-")[-2] for f in files}) == 1, files


def files_per_hour(p) -> dict[tuple[str, str], int]:
    """The data table's current files per event hour, as pyiceberg plans a scan."""
    out: Counter = Counter()
    for task in readers_table(p).scan().plan_files():
        dt, hr = task.file.partition[0], task.file.partition[1]
        out[(dt, hr)] += 1
    return dict(out)


def all_rows(p, which: str = "table") -> list[tuple]:
    table = readers_table(p, which).scan().to_arrow()
    names = sorted(table.column_names)
    return sorted(tuple(r[n] for n in names) for r in table.select(names).to_pylist())


def test_compaction_leaves_one_file_per_settled_hour_and_vacuum_expires_and_deletes_orphans(
    make_pipeline, broker, metastore, spark
):
    p = iceberg_pipeline(make_pipeline, metastore, partitions=2)
    expected = small_batches(p, broker, spark, 3)
    before = all_rows(p)
    assert max(files_per_hour(p).values()) > 1
    # Killed right after its first partition's commit: the others are written, not committed.
    proc = p.spawn(
        "compact", "--older-than", "0s", env=p.env(**armed(crash_at=faults.AFTER_COMPACT_COMMIT))
    )
    proc.communicate(timeout=240)
    assert proc.returncode == -signal.SIGKILL
    assert all_rows(p) == before and p.landed() == expected_offsets(expected)

    report = compacted(p.cfg(), spark, older_than="0s")
    assert report.partitions and {e.outcome for e in report.partitions} == {"compacted"}
    assert set(files_per_hour(p).values()) == {1}
    assert all_rows(p) == before and all_rows(p, "raw") and p.landed() == expected_offsets(expected)
    compactions = [s for s in strata_snapshots(p, "table") if "strata.compaction" in s]
    assert compactions and all(s["operation"] == "overwrite" for s in compactions)

    # Files vacuum may and may not delete, planted beside the killed compaction's.
    cfg = p.cfg()
    table_dir = Path(cfg.location("table"))
    some = next(table_dir.rglob("part-b0000000001-*.parquet"))
    stale = some.with_name("part-b0000000001-t00099-a0-deadbeef-f000.snappy.parquet")
    future = some.with_name("part-b0000000009-t00000-a0-deadbeef-f000.snappy.parquet")
    for f in (stale, future):
        f.write_bytes(some.read_bytes())
    snapshots = len(readers_table(p).snapshots())
    # A retention of zero (below the configured floor, which only the loader enforces):
    # every snapshot but the current one goes, and with them the files they alone held.
    done = vacuum(cfg.places(), "0s", cfg.metastore)
    figures = done.tables["table"]
    assert figures.snapshots_expired == snapshots - 1
    assert len(readers_table(p).snapshots()) == 1
    assert not stale.exists() and future.exists() and len(figures.unknown_left) >= 1
    held = {t.file.file_path for t in readers_table(p).scan().plan_files()}
    on_disk = {f"file://{f}" for f in table_dir.rglob("*.parquet")}
    assert on_disk - held == {f"file://{future}"}
    assert all_rows(p) == before and p.landed() == expected_offsets(expected)
    # The merged files are what a run after it finds, and it lands on top of them.
    more = produce_clicks(broker, p.topic, 2, 200, seed=21)
    run_batch(p.cfg(), session=lambda _: spark)
    total = Counter(expected)
    total.update(more)
    assert p.landed() == expected_offsets(dict(total))


def test_a_compaction_paused_past_its_lease_commits_nothing_to_iceberg_a_vacuum_deleted(
    make_pipeline, broker, metastore, spark, s3_endpoint, tmp_path
):
    # The compaction freezes between its lease check and its commit, past its lease; a
    # vacuum takes the lease, fences each table (a snapshot of no files carrying its
    # token) and deletes the compaction's files, which no snapshot holds. Woken, the
    # compaction's commit fails its requirement, and on the table as it is now it
    # finds the higher token and stops.
    p = s3_iceberg(make_pipeline, metastore, s3_endpoint, tmp_path, "icefence", lock_lease="6s")
    expected = small_batches(p, broker, spark, 3)
    cfg = p.cfg()
    before = all_rows(p)
    proc = paused_at_its_last_check(p, tmp_path)
    try:
        wait_stopped(proc)
        done = vacuum_once_free(cfg)
        assert done.tables["table"].never_committed > 0
        os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=240)
    finally:
        ended(proc)
    assert proc.returncode == 3, (out, err)
    assert "lost its lease" in err, err
    for which in ("table", "raw", "quarantine"):
        summaries = strata_snapshots(p, which)
        assert not [s for s in summaries if "strata.compaction" in s], which
        assert readers_table(p, which).metadata.properties["strata.maintenance." + p.name]
    # Every file the current snapshot holds is there, and every row reads as before.
    assert all_rows(p) == before and p.landed() == expected_offsets(expected)
    # The next compaction, holding a later token, does the work.
    report = compacted(cfg, spark, older_than="0s")
    assert report.partitions and {e.outcome for e in report.partitions} == {"compacted"}
    assert set(files_per_hour(p).values()) == {1}
    assert all_rows(p) == before


def test_an_added_field_gets_a_new_iceberg_column_id_and_old_rows_read_it_as_null(
    make_pipeline, broker, metastore, spark
):
    p = iceberg_pipeline(make_pipeline, metastore, partitions=2)
    edit_schema(p, without_field("country"))
    first = produce_clicks(broker, p.topic, 2, 300)
    run_batch(p.cfg(), session=lambda _: spark)
    schema = readers_table(p).schema()
    assert "country" not in {f.name for f in schema.fields}
    ids = {f.name: f.field_id for f in schema.fields}
    old_files = {t.file.file_path for t in readers_table(p).scan().plan_files()}

    edit_schema(p, lambda fields: fields + [{"name": "country", "type": ["null", "string"]}])
    second = produce_clicks(broker, p.topic, 2, 300, seed=11)
    outcome = run_batch(p.cfg(), session=lambda _: spark)
    assert outcome.status == "committed"
    assert any("the schema gained `country`" in w for w in outcome.warnings), outcome.warnings

    table = readers_table(p)
    evolved = {f.name: f.field_id for f in table.schema().fields}
    # The new column takes an id of its own; the others keep theirs.
    assert evolved["country"] not in ids.values() and {k: evolved[k] for k in ids} == ids
    assert json.loads(table.properties["schema.name-mapping.default"])[-1]["names"] == ["country"]
    assert old_files <= {t.file.file_path for t in table.scan().plan_files()}
    rows = table.scan(selected_fields=("_batch", "country")).to_arrow().to_pylist()
    by_batch = Counter((r["_batch"], r["country"] is None) for r in rows)
    assert by_batch[(1, False)] == 0 and by_batch[(1, True)] == sum(first.values())
    assert by_batch[(2, False)] > by_batch[(2, True)] > 0
    assert p.landed() == expected_offsets({q: first[q] + second[q] for q in first})


def test_topics_routed_to_iceberg_tables_land_each_in_its_own(make_pipeline, broker, metastore):
    p = iceberg_pipeline(make_pipeline, metastore, partitions=2)
    topics, counts = _routed_tables(p, broker, "kind")
    cfg = load_pipeline(p.name, p.conf_dir)
    tables = [cfg.table_for(t) for t in topics]
    done = p.cli("run", "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout.strip().splitlines()[-1])
    assert {t: b["status"] for t, b in body["tables"].items()} == dict.fromkeys(tables, "committed")
    for topic, table in zip(topics, tables, strict=True):
        child = cfg.route(table)
        rows = Counter()
        for which in ("table", "quarantine"):
            t = (
                iceberg_table(child, which)
                .scan(selected_fields=("_topic", "_partition", "_offset"))
                .to_arrow()
            )
            rows.update(zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True))
        assert rows == Counter(
            {(topic, q, o): 1 for q, n in counts[topic].items() for o in range(n)}
        )
        assert iceberg_table(child, "table").properties["strata.batch." + table] == "1"


def test_the_ingest_replay_and_maintenance_dags_run_on_iceberg_tables(
    make_pipeline, broker, metastore, trino, spark, airflow_db, monkeypatch
):
    # Registration through the Airflow connection, in the session's Trino's catalogs on
    # a metastore of its own, where each table must be registered to be read.
    user = "airflow_" + uuid.uuid4().hex[:6]
    p = make_pipeline(
        partitions=2,
        overrides={
            "table_format": "iceberg",
            "metastore": {"uri": metastore.uri, "database": user},
            "airflow": {"trino_conn_id": "strata_trino"},
            "trino": registering_settings("iceberg"),
        },
    )
    # A run's registration calls register_table alone: the schemas are made once, as
    # `strata sql ddl` prints them, before the first run.
    for catalog in ("delta", "iceberg"):
        trino.query(f'CREATE SCHEMA IF NOT EXISTS "{catalog}{ELSEWHERE}"."{user}"')
    per = produce_clicks(broker, p.topic, 2, 300, malformed=2)
    monkeypatch.setenv("STRATA_CONF_DIR", str(p.conf_dir))
    monkeypatch.setenv("AIRFLOW_CONN_STRATA_TRINO", airflow_connection(trino, user))
    dags = load_dags(p.conf_dir).dags
    cfg = p.cfg()
    batches = "SELECT _batch, count(*) FROM {table} GROUP BY _batch ORDER BY _batch"

    run = dags[f"strata_ingest_{p.name}"].test()
    assert str(run.state) == "success", states(run)
    assert p.landed() == expected_offsets(per)
    ingested = queries_of(trino, user)
    # The ingest DAG's registration registers the three Iceberg tables in the Iceberg
    # catalog and the ledger in Delta's (the quality table is checked after it).
    assert [(source, state) for source, state, _ in ingested] == [("airflow", "FINISHED")] * 4
    calls = [s.split(".system.register_table(")[0].split()[-1] for _, _, s in ingested]
    assert calls == ['"iceberg_elsewhere"'] * 3 + ['"delta_elsewhere"']
    registered = ("table", "raw", "quarantine", "ledger")
    counts = strata_counts(cfg, registered)
    assert trino_counts(trino, cfg, registered) == counts and all(counts.values()), counts
    assert trino_rows(trino, cfg, batches) == [(1, counts["table"])]

    run = dags["strata_replay"].test(
        run_conf={"pipeline": p.name, "from_batch": 1, "reason": "decoder fix"}
    )
    assert str(run.state) == "success", states(run)
    assert p.landed() == expected_offsets(per)
    rows = p.table_rows("table", ["_batch"]).column("_batch").to_pylist()
    assert set(rows) == {2}
    run = dags["strata_maintenance"].test()
    assert str(run.state) == "success", states(run)
    # The maintenance DAG's DDL: the two schemas, there already, the four tables, there
    # already (Trino answers ALREADY_EXISTS, which is skipped), and the quality table, new.
    # Each Iceberg table Trino reads at an older snapshot (the data table, replayed) is
    # re-pointed at the current one, unregistered and registered again; none other is.
    maintained = queries_of(trino, user)[len(ingested) :]
    assert {source for source, _, _ in maintained} == {"airflow"}
    refused = {s for _, state, s in maintained if state != "FINISHED"}
    assert refused and all(".system.register_table(" in s for s in refused), refused
    unregistered = [s for _, _, s in maintained if ".system.unregister_table(" in s]
    assert unregistered and all('"iceberg_elsewhere"' in s for s in unregistered)
    assert any(f"table_name => '{p.name}'" in s for s in unregistered), unregistered
    quality = [s for _, state, s in maintained if f"{p.name}_quality" in s and state == "FINISHED"]
    assert len(quality) == 1 and '"delta_elsewhere"' in quality[0]
    # Every table answers in Trino with the rows Strata's readers read: the Iceberg
    # tables the replay's rows, the ledger (Delta, read from its log) the replay's batch.
    counts = strata_counts(cfg)
    assert trino_counts(trino, cfg) == counts and all(counts.values()), counts
    assert trino_rows(trino, cfg, batches) == [(2, counts["table"])]
    ledger = cfg.places().table("ledger").name
    in_ledger = f'SELECT DISTINCT batch FROM "delta{ELSEWHERE}"."{user}"."{ledger}" ORDER BY 1'
    assert trino.query(in_ledger) == [(1,), (2,)]
    assert p.landed() == expected_offsets(per)


def test_a_kill_inside_the_metastore_lock_holds_the_next_commit_until_the_lock_expires(
    make_pipeline, broker, metastore, spark
):
    # Killed with the table lock held and the new metadata written, before the table's
    # entry points at it: the commit did not happen, and the lock outlives the process.
    # The next run waits for the metastore to give the dead holder's lock up
    # (`hive.txn.timeout`), then commits the batch once.
    p = iceberg_pipeline(make_pipeline, metastore, partitions=2)
    first = produce_clicks(broker, p.topic, 2, 400)
    run_batch(p.cfg(), session=lambda _: spark)
    second = produce_clicks(broker, p.topic, 2, 400, seed=5)
    crashed = p.cli("run", env=p.env(**armed(crash_at=faults.ICEBERG_METADATA_WRITTEN)))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert batch_snapshots(p, "raw", 2) == 0
    began = time.monotonic()
    rerun = run_batch(p.cfg(), session=lambda _: spark)
    assert (rerun.status, rerun.batch) == ("resumed", 2)
    assert time.monotonic() - began > 5  # it did wait for the lock
    assert p.landed() == expected_offsets({q: first[q] + second[q] for q in first})
    assert p.raw_copies() == expected_offsets({q: first[q] + second[q] for q in first})
    for which in ("table", "raw", "quarantine"):
        assert batch_snapshots(p, which, 2) == 1, which


def test_a_metastore_out_of_reach_stops_the_run_naming_it_and_nothing_is_committed(
    make_pipeline, broker, metastore, spark
):
    p = iceberg_pipeline(make_pipeline, metastore, partitions=1)
    per = produce_clicks(broker, p.topic, 1, 200)
    gone = f"thrift://127.0.0.1:{free_port()}"
    path = p.conf_dir / "pipelines" / f"{p.name}.yaml"
    body = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**body, "metastore": {"uri": gone}}))
    stopped = p.cli("run", "--json")
    assert stopped.returncode == 1, stopped.stderr
    error = last_json(stopped)["error"]
    assert f"the metastore at {gone} could not" in error and p.name in error, error
    assert "immutable" not in stopped.stderr
    # Back in reach, the batch's saved plan is finished once.
    path.write_text(yaml.safe_dump(body))
    assert run_batch(p.cfg(), session=lambda _: spark).batch == 1
    assert p.landed() == expected_offsets(per)


def test_a_task_retried_by_spark_commits_only_its_successful_attempt_and_vacuum_takes_the_other(
    make_pipeline, broker, metastore, tmp_path
):
    # A task attempt fails after its files are complete (a lost executor); Spark retries
    # it. Only the files the successful attempts reported are committed; the failed
    # attempt's stay on storage, in no snapshot, until vacuum deletes them.
    p = iceberg_pipeline(make_pipeline, metastore, partitions=2)
    per = produce_clicks(broker, p.topic, 2, 2000, malformed=3)
    marker = tmp_path / "failed-once"
    done = p.cli("run", env=p.env(**armed(fail_once_at=faults.TASK_FILES_CLOSED, once=marker)))
    assert done.returncode == 0, done.stderr
    assert marker.exists(), "no task attempt failed: the test proves nothing"
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)
    run_ids = set()
    for which in ("table", "raw", "quarantine"):
        committed = {t.file.file_path for t in readers_table(p, which).scan().plan_files()}
        attempts: dict[str, set[str]] = {}
        for path in committed:
            task, attempt = path.rsplit("/", 1)[-1].split("-")[2:4]
            attempts.setdefault(task, set()).add(attempt)
        assert attempts and all(len(a) == 1 for a in attempts.values()), (which, attempts)
        [summary] = [s for s in strata_snapshots(p, which) if s.get("strata.batch") == "1"]
        run_ids.add(summary["strata.run"])
        on_disk = {f"file://{f}" for f in Path(p.cfg().location(which)).rglob("part-*.parquet")}
        # The failed attempt's files are there, unread (it may have had no quarantined row).
        assert committed < on_disk if which != "quarantine" else committed <= on_disk, which
    assert len(run_ids) == 1
    vacuum(p.cfg().places(), "1h", p.cfg().metastore)
    for which in ("table", "raw", "quarantine"):
        committed = {t.file.file_path for t in readers_table(p, which).scan().plan_files()}
        on_disk = {f"file://{f}" for f in Path(p.cfg().location(which)).rglob("part-*.parquet")}
        assert committed == on_disk, which
    assert p.landed() == expected_offsets(per)


def test_manifests_stay_few_after_more_batches_than_the_merge_count(metastore, tmp_path):
    # Each batch's commit adds a manifest; every scan, and finding a batch's files,
    # reads all of the current snapshot's. Folded once there are 100, they stay few.
    ref = TableRef(str(tmp_path / "many"), "iceberg", {}, "many_batches", (metastore.uri, "many"))
    schema = pa.schema([("_batch", pa.int64()), ("v", pa.string()), ("dt", pa.string())])
    table = iceberg.create_table(ref, schema, ["dt"])
    for batch in range(1, 121):
        rel = f"dt=2026-01-01/part-b{batch:010d}-t00000-a0-run-f000.parquet"
        path = tmp_path / "many" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"_batch": [batch], "v": [str(batch)]}), path)
        stats = json.dumps({"minValues": {"_batch": batch}, "maxValues": {"_batch": batch}})
        written = WrittenFile(rel, path.stat().st_size, {"dt": "2026-01-01"}, 1, stats)
        committed = iceberg.commit_batch(ref, "many", table, [written], batch, {})
        assert committed is not None
    loaded = iceberg.open_table(ref)
    assert loaded is not None
    snapshot = loaded.current_snapshot()
    assert snapshot is not None
    assert len(snapshot.manifests(loaded.io)) <= 25
    assert loaded.scan().to_arrow().num_rows == 120
    assert [r["_batch"] for r in loaded.scan(row_filter="_batch = 77").to_arrow().to_pylist()] == [
        77
    ]
    assert len(iceberg.batch_files(loaded, 77)) == 1
