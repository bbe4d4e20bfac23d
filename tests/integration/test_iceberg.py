"""Iceberg tables (`table_format: iceberg`): the same promise through pyiceberg's Hive catalog.

Through the real broker, Spark and the Hive Metastore; every read back is pyiceberg's
own scan, through a catalog of its own.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from strata import faults
from strata.maintenance.vacuum import vacuum
from strata.run import reprocess, run_batch
from strata.store.ledger import ledger_state, read_ledger
from strata.store.ranges import OffsetRange
from tests.conftest import expected_offsets, iceberg_table, produce_clicks, s3_pipeline
from tests.faults import armed
from tests.integration.test_compaction import (
    compacted,
    ended,
    paused_at_its_last_check,
    small_batches,
    vacuum_once_free,
    wait_stopped,
)
from tests.integration.test_runners import second_host, wait_frozen


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
        while True:
            b = other.cli("run", "--json")
            if b.returncode == 0:
                break
            assert b.returncode == 3 and "another run is in flight" in b.stderr, b.stderr
            assert time.monotonic() < deadline, "the lease of the frozen runner never expired"
            time.sleep(1)
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
    figures = done["tables"]["table"]
    assert figures["snapshots_expired"] == snapshots - 1
    assert len(readers_table(p).snapshots()) == 1
    assert not stale.exists() and future.exists() and figures["unknown_left"] >= 1
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
        assert done["tables"]["table"]["data_files_deleted"] > 0
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
