"""Compaction and table maintenance on real tables written by real runs.

Every test breaks or races real processes: the compaction runs as the `strata`
command where it must be killed or frozen, while ingest runs in this process.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlparse
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from deltalake import DeltaTable

from strata import faults
from strata.catalog.metastore import MetastoreClient
from strata.catalog.register import location_uri, register_tables
from strata.edge import registration, status_settings
from strata.errors import LockBusy
from strata.maintenance.compact import small_bytes
from strata.maintenance.vacuum import checkpoint, never_committed, sweep_moved, table_health, vacuum
from strata.operations.status import pipeline_status, render_status
from strata.run import run_batch
from strata.store.files import filesystem
from strata.store.locations import (
    current_files,
    current_locations,
    mark,
    marker_uri,
    new_stamp,
    read_markers,
    visible_files,
    void,
)
from strata.store.lock import run_lock
from tests.conftest import expected_offsets, produce_clicks, s3_landed, s3_pipeline
from tests.faults import armed
from tests.locking import s3_options
from tests.maintenance_runs import (
    compacted,
    ended,
    parquet_with_leases,
    paused_at_its_last_check,
    small_batches,
    vacuum_once_free,
    wait_stopped,
)


def rows(p, which: str = "table") -> list[tuple]:
    table = DeltaTable(p.cfg().location(which)).to_pyarrow_table()
    names = sorted(table.column_names)
    return sorted(tuple(r[n] for n in names) for r in table.select(names).to_pylist())


def files_per_partition(p) -> dict[tuple[str, str], list[int]]:
    adds = pa.table(DeltaTable(p.cfg().location("table")).get_add_actions(flatten=True))
    out: dict[tuple[str, str], list[int]] = {}
    for a in adds.to_pylist():
        out.setdefault((a["partition.dt"], a["partition.hr"]), []).append(a["size_bytes"])
    return out


def test_compaction_merges_late_hours_small_files_and_changes_no_row(make_pipeline, broker, spark):
    p = make_pipeline(partitions=2)
    small_batches(p, broker, spark, 4)
    cfg = p.cfg()
    before_rows, before_raw = rows(p), rows(p, "raw")
    before_files = files_per_partition(p)
    assert all(len(sizes) >= 4 for sizes in before_files.values()), before_files
    tables = ("table", "raw", "quarantine", "ledger")
    versions = {t: DeltaTable(cfg.location(t)).version() for t in tables}

    dry = compacted(cfg, spark, older_than="0s", dry_run=True)
    assert dry.dry_run and {e.table for e in dry.partitions} == {"table", "raw", "ledger"}
    assert {t: DeltaTable(cfg.location(t)).version() for t in tables} == versions
    assert files_per_partition(p) == before_files

    report = compacted(cfg, spark, older_than="0s")
    assert {e.outcome for e in report.partitions} == {"compacted"}
    after_files = files_per_partition(p)
    target = cfg.limits.target_file_mb << 20
    for key, sizes in after_files.items():
        assert len(sizes) == math.ceil(sum(sizes) / target), (key, sizes)
        assert len(sizes) < len(before_files[key])
    assert rows(p) == before_rows and rows(p, "raw") == before_raw
    assert set(p.landed().values()) == {1}
    # The commits are no data change: nothing a streaming reader would take for new rows.
    history = DeltaTable(cfg.location("table")).history(1)[0]
    assert history["operation"] == "WRITE" and "strata.compaction" in history
    # The ledger still answers: the next plan starts where the last batch ended.
    assert run_batch(cfg, session=lambda _: spark).batch is None

    health = table_health(cfg.places(), small_bytes(cfg.maintenance, cfg.limits))
    assert health["table"]["files"] == sum(len(s) for s in after_files.values())
    shown = pipeline_status(cfg.places(), status_settings(cfg))
    assert shown["tables"] == health
    header, line = [x for x in render_status(shown).splitlines() if x.split()[:1] == ["table"]]
    assert "small" in header and line.split()[1] == str(health["table"]["files"])
    assert health["ledger"]["files"] == 1 and health["ledger"]["log_since_checkpoint"] > 0
    done = checkpoint(cfg.places())
    # Every batch commits to every table, the quarantine too (with no files).
    assert {w for w, t in done.tables.items() if t.version is not None} == {
        "table",
        "raw",
        "quarantine",
        "ledger",
    }
    assert all(
        t["log_since_checkpoint"] == 0
        for t in table_health(cfg.places(), small_bytes(cfg.maintenance, cfg.limits)).values()
    )


def test_an_ingest_committing_during_compaction_loses_nothing(make_pipeline, broker, spark):
    p = make_pipeline(partitions=2)
    expected = small_batches(p, broker, spark, 3)
    # Frozen after writing its merged files, before committing any of them.
    proc = p.spawn(
        "compact", "--older-than", "0s", env=p.env(**armed(stop_at=faults.AFTER_COMPACT_FILES))
    )
    try:
        wait_stopped(proc)
        # Late events into the very hours being compacted, committed meanwhile.
        late = produce_clicks(broker, p.topic, 2, 150, seed=99, hours=3)
        assert run_batch(p.cfg(), session=lambda _: spark).status == "committed"
        for part, count in late.items():
            expected[part] += count
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert "compacted" in out
    assert p.landed() == expected_offsets(expected)
    # The compaction committed after the ingest, on top of it, not instead of it.
    history = DeltaTable(p.cfg().location("table")).history(10)
    ingest = [h["version"] for h in history if str(h.get("strata.batch")) == "4"]
    merged = [h["version"] for h in history if "strata.compaction" in h]
    assert ingest and merged and min(merged) > ingest[0]


def test_a_killed_compaction_leaves_a_readable_table_a_rerun_finishes_it_and_vacuum_tidies(
    make_pipeline, broker, spark
):
    p = make_pipeline(partitions=2)
    expected = small_batches(p, broker, spark, 3)
    cfg = p.cfg()
    before = rows(p)
    # Killed right after its first partition's commit: the others are written, not committed.
    proc = p.spawn(
        "compact", "--older-than", "0s", env=p.env(**armed(crash_at=faults.AFTER_COMPACT_COMMIT))
    )
    proc.communicate(timeout=240)
    assert proc.returncode == -signal.SIGKILL
    assert rows(p) == before and p.landed() == expected_offsets(expected)
    orphans, _ = never_committed(cfg.places(), "table")
    assert orphans and all("/part-c" in f"/{o}" for o in orphans), orphans

    report = compacted(cfg, spark, older_than="0s")
    assert report.partitions and {e.outcome for e in report.partitions} == {"compacted"}
    assert all(len(s) == 1 for s in files_per_partition(p).values())
    assert rows(p) == before

    # Files vacuum may and may not delete, planted beside the killed compaction's.
    table_dir = Path(cfg.location("table"))
    some = next(table_dir.rglob("part-b0000000001-*.parquet"))
    stale = some.with_name("part-b0000000001-t00099-a0-deadbeef-f000.snappy.parquet")
    future = some.with_name("part-b0000000009-t00000-a0-deadbeef-f000.snappy.parquet")
    foreign = some.with_name("notes.parquet")
    for f in (stale, future, foreign):
        f.write_bytes(some.read_bytes())
    replaced = {f.name for f in table_dir.rglob("part-b*.parquet")} - {stale.name, future.name}
    done = vacuum(cfg.places(), cfg.maintenance.vacuum_retention, cfg.metastore)
    assert done.retention_hours == 168
    assert not stale.exists() and future.exists() and foreign.exists()
    # The killed compaction's files are gone; the rerun's, which the log holds, stay.
    merged = {str(f.relative_to(table_dir)) for f in table_dir.rglob("part-c*")}
    active = pa.table(DeltaTable(str(table_dir)).get_add_actions()).column("path").to_pylist()
    assert merged and merged == {a for a in active if "/part-c" in f"/{a}"}
    # Files the compaction replaced stay for readers until the retention has passed.
    assert replaced <= {f.name for f in table_dir.rglob("part-b*.parquet")}
    assert rows(p) == before


def test_plain_parquet_compaction_carries_late_rows_and_survives_a_kill(
    make_pipeline, broker, spark, metastore
):
    p = make_pipeline(
        partitions=2, overrides={"table_format": "parquet", "metastore": {"uri": metastore.uri}}
    )
    expected = small_batches(p, broker, spark, 3)
    cfg = p.cfg()
    fs, root = filesystem(cfg.location("table"), cfg.storage_options)
    # Frozen after writing the merged files, before moving any partition; then, once
    # woken, killed right after moving the first one.
    env = p.env(**armed(stop_at=faults.AFTER_COMPACT_FILES, crash_at=faults.AFTER_COMPACT_MOVE))
    proc = p.spawn("compact", "--older-than", "0s", env=env)
    try:
        wait_stopped(proc)
        # Late events into the very hours being compacted: written to the old directories.
        late = produce_clicks(broker, p.topic, 2, 150, seed=99, hours=3)
        assert run_batch(cfg, session=lambda _: spark).status == "committed"
        for part, count in late.items():
            expected[part] += count
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    proc.communicate(timeout=240)
    assert proc.returncode == -signal.SIGKILL
    # The moved partition took the late rows along; the others are still where they were.
    moved = current_locations(fs, root)
    assert len(moved) == 1
    assert p.landed() == expected_offsets(expected)
    # The metastore was not told before the kill: registration puts it right.
    fixed = register_tables(registration(cfg))
    assert fixed.partitions_moved == list(moved)
    with MetastoreClient(metastore.uri, 30) as client:
        [part] = client.partitions_by_names(cfg.metastore.database, cfg.name, list(moved))
    assert part.sd.location.endswith("/" + next(iter(moved.values())))

    report = compacted(cfg, spark, older_than="0s")
    assert report.partitions and {e.outcome for e in report.partitions} == {"compacted"}
    assert len(current_locations(fs, root)) == 3
    by_partition = Counter(f.partition for f in current_files(fs, root))
    assert set(by_partition.values()) == {1}, by_partition
    assert p.landed() == expected_offsets(expected)
    # The killed run's new directories, never moved to, go at once; the old ones stay
    # for the grace period.
    done = vacuum(cfg.places(), cfg.maintenance.vacuum_retention, cfg.metastore).tables["table"]
    assert done.never_committed > 0 and done.removed_files == 0
    generations = {f.directory for f in visible_files(fs, root) if f.directory != f.partition}
    assert generations == set(current_locations(fs, root).values()) | set(moved.values())
    assert p.landed() == expected_offsets(expected)


def test_a_partition_settles_at_the_end_of_its_hour_in_the_partition_zone(
    make_pipeline, broker, spark
):
    # Kiritimati is 14 hours ahead: its hours, read as UTC, would end half a day late.
    field = {"name": "device", "values": ["mobile"], "other": "rest"}
    p = make_pipeline(
        partitions=2,
        overrides={"partitioning": {"timezone": "Pacific/Kiritimati", "field": field}},
    )
    hour = int(time.time()) // 3600 * 3600 * 1000
    start = hour - 3 * 3_600_000  # events of one hour that ended two to three hours ago
    for seed in (1, 2):
        produce_clicks(broker, p.topic, 2, 60, start_ms=start, hours=1, seed=seed)
        run_batch(p.cfg(), session=lambda _: spark)
    cfg = p.cfg()
    before = rows(p)
    adds = pa.table(DeltaTable(cfg.location("table")).get_add_actions(flatten=True)).to_pylist()
    keys = {(a["partition.dt"], a["partition.hr"], a["partition.p_device"]) for a in adds}
    local = datetime.fromtimestamp(start / 1000, ZoneInfo("Pacific/Kiritimati"))
    assert keys == {(f"{local:%Y-%m-%d}", f"{local:%H}", d) for d in ("mobile", "rest")}

    # Its end is two to three hours past (up to four, should the clock pass an hour).
    early = compacted(cfg, spark, older_than="4h", dry_run=True)
    assert [e for e in early.partitions if e.table == "table"] == []
    report = compacted(cfg, spark, older_than="1h")
    merged = sorted(e.partition for e in report.partitions if e.table == "table")
    assert merged == sorted(
        f"dt={local:%Y-%m-%d}/hr={local:%H}/p_device={d}" for d in ("mobile", "rest")
    )
    assert {e.outcome for e in report.partitions if e.table == "table"} == {"compacted"}
    assert rows(p) == before and set(p.landed().values()) == {1}


def metastore_rows(cfg, metastore) -> Counter:
    """Each (partition, offset) a Hive-style reader finds through the metastore: the
    visible files of the directory each registered partition's location names."""
    with MetastoreClient(metastore.uri, 30) as client:
        names = client.partition_names(cfg.metastore.database, cfg.name)
        parts = client.partitions_by_names(cfg.metastore.database, cfg.name, names)
    fs = pafs.LocalFileSystem()
    counts: Counter = Counter()
    for part in parts:
        listed = fs.get_file_info(pafs.FileSelector(urlparse(part.sd.location).path))
        files = [
            f.path
            for f in listed
            if f.type == pafs.FileType.File and not f.base_name.startswith(("_", "."))
        ]
        rows = ds.dataset(files, format="parquet", filesystem=fs).to_table(
            columns=["_partition", "_offset"]
        )
        counts.update(zip(rows["_partition"].to_pylist(), rows["_offset"].to_pylist(), strict=True))
    return counts


def test_a_compaction_paused_past_its_lease_commits_nothing_a_vacuum_deleted(
    make_pipeline, broker, spark, s3_endpoint, tmp_path
):
    # The compaction freezes between its lease check and its Delta commit, long enough
    # for its lease to run out; a vacuum takes the lease and deletes the compaction's
    # files, which no commit lists. Woken, the compaction must not commit them.
    p, options = s3_pipeline(make_pipeline, s3_endpoint, tmp_path, "fence1", lock_lease="6s")
    expected = small_batches(p, broker, spark, 3)
    cfg = p.cfg()
    assert cfg.lock_path is None  # runs hold leases in the store

    def table(which: str) -> DeltaTable:
        return DeltaTable(
            cfg.location(which), storage_options={**options, "conditional_put": "etag"}
        )

    raw_before = table("raw").to_pyarrow_table(columns=["_partition", "_offset"]).num_rows
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

    # No table names a deleted file, and every row reads as before.
    fs, _ = filesystem(cfg.location("table"), cfg.storage_options)
    for which in ("table", "raw", "ledger"):
        root = filesystem(cfg.location(which), cfg.storage_options)[1]
        paths = pa.table(table(which).get_add_actions(flatten=True)).column("path").to_pylist()
        missing = [
            path for path in paths if fs.get_file_info(f"{root}/{path}").type != pafs.FileType.File
        ]
        assert missing == [], which
        history = table(which).history()
        assert not [c for c in history if "strata.compaction" in c], which
        assert any("strata.maintenance_fence" in c for c in history), which
    assert s3_landed(p, options) == expected_offsets(expected)
    assert table("raw").to_pyarrow_table(columns=["_offset"]).num_rows == raw_before
    # Refused by the commit itself (the fence landed after its snapshot), then stopped.
    assert "compaction commit retried" in err and "lost its lease" in err, err
    # The next compaction, holding a later token, does the work.
    report = compacted(cfg, spark, older_than="0s")
    assert report.partitions and {e.outcome for e in report.partitions} == {"compacted"}
    assert s3_landed(p, options) == expected_offsets(expected)


def test_a_parquet_compaction_paused_past_its_lease_moves_nothing_a_vacuum_deleted(
    make_pipeline, broker, spark, metastore, s3_endpoint, tmp_path
):
    p = parquet_with_leases(make_pipeline, metastore, s3_endpoint, tmp_path)
    expected = small_batches(p, broker, spark, 3)
    cfg = p.cfg()
    assert cfg.lock_path is None
    fs, root = filesystem(cfg.location("table"), cfg.storage_options)
    through_metastore = metastore_rows(cfg, metastore)
    assert sum(through_metastore.values()) > 0

    proc = paused_at_its_last_check(p, tmp_path)
    try:
        wait_stopped(proc)
        new = {f.directory for f in visible_files(fs, root) if f.directory != f.partition}
        assert new, "the compaction wrote no new directory before its check"
        done = vacuum_once_free(cfg).tables["table"]
        assert done.never_committed > 0
        assert not new & {f.directory for f in visible_files(fs, root)}
        os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=240)
    finally:
        ended(proc)
    assert proc.returncode == 3, (out, err)

    # Its late marker moved nothing: every partition is read where its rows are.
    assert current_locations(fs, root) == {}
    assert p.landed() == expected_offsets(expected)
    # The next run registers again, and the metastore stays on the intact directories.
    register_tables(registration(cfg))
    assert metastore_rows(cfg, metastore) == through_metastore
    assert {d.rsplit("/", 1)[-1] for d in new} <= {
        f"_c{s}" for stamps in read_markers(fs, root).void.values() for s in stamps
    }
    assert "lost its lease" in err and "voided" in err, err


def run_once_free(cfg, spark):
    """Run a batch as soon as the run lease a paused compaction holds has expired."""
    deadline = time.monotonic() + 120
    while True:
        try:
            return run_batch(cfg, session=lambda _: spark)
        except LockBusy as exc:
            assert "another run is in flight" in str(exc)
            assert time.monotonic() < deadline, "the paused compaction's lease never expired"
            time.sleep(0.5)


def test_a_parquet_compaction_paused_past_its_lease_never_moves_away_from_a_runs_late_rows(
    make_pipeline, broker, spark, metastore, s3_endpoint, tmp_path
):
    # The compaction freezes under the run lock, between its check and its marker; its
    # leases run out and an ingest takes the run lease over, adding late rows to the
    # partitions' directories in use. Woken, the compaction must not move them away.
    p = parquet_with_leases(make_pipeline, metastore, s3_endpoint, tmp_path)
    expected = small_batches(p, broker, spark, 3)
    cfg = p.cfg()
    fs, root = filesystem(cfg.location("table"), cfg.storage_options)
    proc = paused_at_its_last_check(p, tmp_path)
    try:
        wait_stopped(proc)
        late = produce_clicks(broker, p.topic, 2, 60, seed=9, hours=3)
        assert run_once_free(cfg, spark).status == "committed"
        for part, count in late.items():
            expected[part] += count
        os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=240)
    finally:
        ended(proc)
    # Every row, the run's late ones included, is where readers look for it.
    assert p.landed() == expected_offsets(expected)
    assert current_locations(fs, root) == {}
    register_tables(registration(cfg))
    assert metastore_rows(cfg, metastore) == p.landed()
    assert proc.returncode == 3, (out, err)
    assert "lost its lease" in err and "voided" in err, err
    # The next compaction moves every partition with all its rows.
    report = compacted(cfg, spark, older_than="0s")
    assert {e.outcome for e in report.partitions} == {"compacted"}
    assert p.landed() == expected_offsets(expected)
    assert metastore_rows(cfg, metastore) == p.landed()


def test_vacuum_keeps_a_directory_the_metastore_still_points_at(
    make_pipeline, broker, spark, metastore
):
    p = make_pipeline(
        partitions=2,
        overrides={
            "table_format": "parquet",
            "metastore": {"uri": metastore.uri},
            "maintenance": {"vacuum_retention": "1h"},
        },
    )
    small_batches(p, broker, spark, 3)
    cfg = p.cfg()
    fs, root = filesystem(cfg.location("table"), cfg.storage_options)
    through_metastore = metastore_rows(cfg, metastore)
    report = compacted(cfg, spark, older_than="0s")
    assert {e.outcome for e in report.partitions} == {"compacted"}
    moved = current_locations(fs, root)
    assert len(moved) == 3 and metastore_rows(cfg, metastore) == through_metastore
    # A registration that failed after the move: the metastore lists the old directory.
    stuck = sorted(moved)[0]
    database = cfg.metastore.database
    with MetastoreClient(metastore.uri, 30) as client:
        [part] = client.partitions_by_names(database, cfg.name, [stuck])
        part.sd.location = f"{location_uri(cfg.location('table'))}/{stuck}"
        client.alter_partitions(database, cfg.name, [part])

    with run_lock(cfg.places(), "maintenance") as lock:
        swept = sweep_moved(cfg.places(), cfg.metastore, timedelta(0), lock)
    assert metastore_rows(cfg, metastore) == through_metastore
    own = {f.directory for f in visible_files(fs, root) if f.directory == f.partition}
    assert own == {stuck}
    assert swept.kept_for_metastore == [stuck]
    assert f"strata register --pipeline {cfg.name}" in swept.warnings[0]

    # Past the grace period, counted from the marker's write time, the command says so.
    aged = (datetime.now(UTC) - timedelta(hours=2)).timestamp()
    os.utime(marker_uri(root, stuck, moved[stuck].rsplit("/_c", 1)[1]), (aged, aged))
    shown = p.cli("vacuum")
    assert shown.returncode == 0, shown.stderr
    assert "warning:" in shown.stdout and f"strata register --pipeline {cfg.name}" in shown.stdout
    assert metastore_rows(cfg, metastore) == through_metastore

    # The way out: registration points the partition at its directory in use; the
    # next vacuum deletes the old one.
    assert register_tables(registration(cfg), full=True).partitions_moved == [stuck]
    done = p.cli("vacuum", "--json")
    assert done.returncode == 0, done.stderr
    assert not {f.directory for f in visible_files(fs, root) if f.directory == f.partition}
    assert metastore_rows(cfg, metastore) == through_metastore


def test_markers_on_s3_are_created_once_and_carry_their_write_time(s3_endpoint, tmp_path):
    # The rules plain Parquet compaction and vacuum stand on, on a real S3 endpoint:
    # create-if-absent decides between a marker and a void, and the listing gives the
    # marker's write time, from which vacuum's grace period counts.
    location, options = f"s3://lake/markers-{tmp_path.name}/table", s3_options(s3_endpoint)
    fs, root = filesystem(location, options)
    partition = "dt=2026-01-01/hr=01"
    moved, voided = new_stamp(datetime.now(UTC) - timedelta(hours=3)), new_stamp()
    before = datetime.now(UTC) - timedelta(minutes=1)
    assert mark(location, options, partition, moved)
    assert mark(location, options, partition, moved)  # a retried request finds its own
    assert not void(location, options, partition, moved, "voided by a test")
    assert void(location, options, partition, voided, "voided by a test")
    assert not mark(location, options, partition, voided)
    found = read_markers(fs, root)
    assert found.stamps == {partition: [moved]} and found.void == {partition: {voided}}
    written = found.written[(partition, moved)]
    # The write time, not the (three hours older) stamp the compaction planned with.
    assert written is not None and before <= written <= datetime.now(UTC) + timedelta(minutes=1)
    assert current_locations(fs, root) == {partition: f"{partition}/_c{moved}"}
