"""Compaction and table maintenance on real tables written by real runs.

Every test breaks or races real processes: the compaction runs as the `strata`
command where it must be killed or frozen, while ingest runs in this process.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pyarrow as pa
from deltalake import DeltaTable

from strata.compact import compact
from strata.locations import current_files, current_locations, visible_files
from strata.maintain import checkpoint, never_committed, table_health, vacuum
from strata.metastore import MetastoreClient
from strata.register import register_tables
from strata.run import run_batch
from strata.status import pipeline_status, render_status
from strata.storage import filesystem
from tests.conftest import expected_offsets, produce_clicks


def small_batches(p, broker, spark, batches: int, partitions: int = 2) -> Counter:
    """Several small batches over the same three event hours: late data piles up files."""
    expected: Counter = Counter()
    for n in range(batches):
        per = produce_clicks(broker, p.topic, partitions, 120, seed=n + 1, hours=3)
        for part, count in per.items():
            expected[part] += count
        run_batch(p.cfg(), session=lambda _: spark)
    return expected


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

    dry = compact(cfg, older_than="0s", dry_run=True)
    assert dry.dry_run and {e.table for e in dry.partitions} == {"table", "raw", "ledger"}
    assert {t: DeltaTable(cfg.location(t)).version() for t in tables} == versions
    assert files_per_partition(p) == before_files

    report = compact(cfg, older_than="0s", session=lambda _: spark)
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

    health = table_health(cfg)
    assert health["table"]["files"] == sum(len(s) for s in after_files.values())
    shown = pipeline_status(cfg)
    assert shown["tables"] == health
    header, line = [x for x in render_status(shown).splitlines() if x.split()[:1] == ["table"]]
    assert "small" in header and line.split()[1] == str(health["table"]["files"])
    assert health["ledger"]["files"] == 1 and health["ledger"]["log_since_checkpoint"] > 0
    done = checkpoint(cfg)
    # Every batch commits to every table, the quarantine too (with no files).
    assert set(done["tables"]) == {"table", "raw", "quarantine", "ledger"}
    assert all(t["log_since_checkpoint"] == 0 for t in table_health(cfg).values())


def wait_stopped(proc: subprocess.Popen[str], timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = Path(f"/proc/{proc.pid}/stat").read_text().split()[2]
        if state == "T":
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    raise AssertionError("the compaction never reached its commit")


def test_an_ingest_committing_during_compaction_loses_nothing(make_pipeline, broker, spark):
    p = make_pipeline(partitions=2)
    expected = small_batches(p, broker, spark, 3)
    # Frozen after writing its merged files, before committing any of them.
    proc = p.spawn("compact", "--older-than", "0s", env=p.env(STRATA_STOP_AT="after_compact_files"))
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
        "compact", "--older-than", "0s", env=p.env(STRATA_CRASH_AT="after_compact_commit")
    )
    proc.communicate(timeout=240)
    assert proc.returncode == -signal.SIGKILL
    assert rows(p) == before and p.landed() == expected_offsets(expected)
    orphans, _ = never_committed(cfg, "table")
    assert orphans and all("/part-c" in f"/{o}" for o in orphans), orphans

    report = compact(cfg, older_than="0s", session=lambda _: spark)
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
    done = vacuum(cfg)
    assert done["retention_hours"] == 168
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
    env = p.env(STRATA_STOP_AT="after_compact_files", STRATA_CRASH_AT="after_compact_move")
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
    fixed = register_tables(cfg)
    assert fixed.partitions_moved == list(moved)
    with MetastoreClient(metastore.uri, 30) as client:
        [part] = client.partitions_by_names(cfg.metastore.database, cfg.name, list(moved))
    assert part.sd.location.endswith("/" + next(iter(moved.values())))

    report = compact(cfg, older_than="0s", session=lambda _: spark)
    assert report.partitions and {e.outcome for e in report.partitions} == {"compacted"}
    assert len(current_locations(fs, root)) == 3
    by_partition = Counter(f.partition for f in current_files(fs, root))
    assert set(by_partition.values()) == {1}, by_partition
    assert p.landed() == expected_offsets(expected)
    # The killed run's new directories, never moved to, go at once; the old ones stay
    # for the grace period.
    done = vacuum(cfg)["tables"]["table"]
    assert done["never_moved_to"] > 0 and done["left_by_compaction"] == 0
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
    early = compact(cfg, older_than="4h", dry_run=True)
    assert [e for e in early.partitions if e.table == "table"] == []
    report = compact(cfg, older_than="1h", session=lambda _: spark)
    merged = sorted(e.partition for e in report.partitions if e.table == "table")
    assert merged == sorted(
        f"dt={local:%Y-%m-%d}/hr={local:%H}/p_device={d}" for d in ("mobile", "rest")
    )
    assert {e.outcome for e in report.partitions if e.table == "table"} == {"compacted"}
    assert rows(p) == before and set(p.landed().values()) == {1}
