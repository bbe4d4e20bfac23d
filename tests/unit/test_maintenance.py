"""Compaction's and vacuum's decisions, on real files and real Delta tables (no Spark)."""

from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction, Transaction

from strata.batch.write import PartitionedWriter
from strata.config import PipelineConfig, load_pipeline
from strata.errors import ConfigError, LeaseLost, LockBusy, MaintenanceError
from strata.maintenance.compact import (
    Compaction,
    pack,
    parse_partition,
    partition_end,
    plan_directory,
)
from strata.maintenance.vacuum import never_committed, retention_hours, sweep_moved, vacuum
from strata.store.delta import (
    FENCE_INFO_KEY,
    commit_files,
    commit_removes,
    ensure_table,
    fence_maintenance,
    maintenance_transactions,
)
from strata.store.fencing import Fence
from strata.store.lease import hold_lease
from strata.store.locations import (
    current_locations,
    mark,
    marker_uri,
    new_stamp,
    read_markers,
    visible_files,
    void,
)
from strata.store.lock import run_lock
from strata.store.parquet import WrittenFile, write_file, write_sized
from strata.store.places import Places, TableRef
from strata.store.tables import read
from tests.locking import pipeline_body
from tests.unit.test_config import GOOD, _project


def test_a_vacuum_retention_under_the_floor_is_refused_at_load(tmp_path):
    conf = _project(tmp_path, {**GOOD, "maintenance": {"vacuum_retention": "30m"}})
    with pytest.raises(ConfigError) as err:
        load_pipeline("clicks", conf)
    text = str(err.value)
    assert "clicks.yaml" in text and "maintenance.vacuum_retention" in text
    assert "floor" in text and "at least 1h" in text


def test_the_old_vacuum_key_names_where_it_moved(tmp_path):
    conf = _project(tmp_path, {**GOOD, "airflow": {"vacuum_retention": "7d"}})
    with pytest.raises(ConfigError, match=r"moved to maintenance\.vacuum_retention"):
        load_pipeline("clicks", conf)


def test_retention_hours_round_up_never_down(tmp_path):
    body = pipeline_body(str(tmp_path), maintenance={"vacuum_retention": "90m"})
    assert retention_hours(PipelineConfig.model_validate(body).maintenance.vacuum_retention) == 2


def test_partitions_parse_in_column_order_and_end_with_their_span():
    assert parse_partition("dt=2026-01-02/hr=03", ["dt", "hr"]) == {"dt": "2026-01-02", "hr": "03"}
    assert parse_partition("dt=2026-01-02", ["dt", "hr"]) == {"dt": "2026-01-02"}
    for bad in ("hr=03", "dt=2026-01-02/x=1", "2026-01-02"):
        with pytest.raises(MaintenanceError):
            parse_partition(bad, ["dt", "hr"])
    end = partition_end({"dt": "2026-01-02", "hr": "03"})
    assert end is not None and end.isoformat() == "2026-01-02T04:00:00+00:00"
    day = partition_end({"dt": "2026-01-02"})
    assert day is not None and day.isoformat() == "2026-01-03T00:00:00+00:00"
    assert partition_end({"dt": "not-a-day"}) is None


def test_packing_keeps_neighbours_together_and_never_rewrites_a_lone_file():
    files = [{"path": str(i), "size_bytes": s} for i, s in enumerate([40, 40, 40, 30, 90])]
    bins = pack(files, 100)
    assert [[f["path"] for f in b] for b in bins] == [["0", "1"], ["2", "3"]]
    assert pack([{"path": "a", "size_bytes": 10}], 100) == []


def test_compaction_settings_are_read_from_the_pipelines_sections(tmp_path):
    body = pipeline_body(
        str(tmp_path),
        limits={"target_file_mb": 64},
        maintenance={"settle": "3h", "min_small_files": 4},
        partitioning={"by": "dt", "timezone": "Europe/Berlin"},
    )
    cfg = PipelineConfig.model_validate(body)
    settings = Compaction.of(cfg.maintenance, cfg.limits, cfg.partitioning)
    # Small is half the target unless set; merged files are cut at the target.
    assert (settings.small_bytes, settings.target_bytes) == (32 << 20, 64 << 20)
    assert (settings.settle, settings.min_small_files) == ("3h", 4)
    assert (settings.partition_by, settings.zone) == (("dt",), "Europe/Berlin")
    assert settings.row_group_rows == cfg.limits.row_group_rows


def test_merged_rows_are_cut_into_target_sized_files_in_their_order(tmp_path):
    n = 200_000
    rows = pa.table({"_offset": pa.array(range(n), pa.int64()), "v": [f"x{i}" for i in range(n)]})
    fs = pafs.LocalFileSystem()
    target = 400_000
    files = write_sized(
        fs, str(tmp_path), "dt=2026-01-01/part-cX", rows, {"dt": "2026-01-01"}, target, 2_000
    )
    total = sum(f.size for f in files)
    # Closed before a row group would pass the target: never one file per row group.
    assert 1 < len(files) <= math.ceil(total / target) + 1
    assert all(f.size <= target for f in files)
    back = pa.concat_tables(pq.read_table(tmp_path / f.path) for f in files)
    assert back.column("_offset").to_pylist() == list(range(n))
    assert all(f.partition_values == {"dt": "2026-01-01"} for f in files)


def test_vacuum_takes_only_files_that_can_never_be_committed(tmp_path):
    uri = str(tmp_path / "t")
    schema = pa.schema([("_batch", pa.int64()), ("dt", pa.string())])
    table = ensure_table(uri, schema, ["dt"], {}, "t")
    fs = pafs.LocalFileSystem()

    def write(name: str, batch: int):
        return write_file(fs, uri, f"dt=d/{name}", pa.table({"_batch": [batch]}), {"dt": "d"})

    one = write("part-b0000000001-t00000-a0-r1-f000.snappy.parquet", 1)
    commit_files(table, schema, ["dt"], [one], "p", 1, {})
    two = write("part-b0000000002-t00000-a0-r1-f000.snappy.parquet", 2)
    commit_files(DeltaTable(uri), schema, ["dt"], [two], "p", 2, {})
    # Batch 1's file removed (a backfill replaced it): a tombstone, not an orphan.
    now = int(time.time() * 1000)
    commit_removes(
        DeltaTable(uri),
        schema,
        ["dt"],
        [RemoveAction(one.path, True, now, one.size, {"dt": "d"})],
        3,
        {},
    )
    lost = write("part-b0000000002-t00001-a1-r0-f000.snappy.parquet", 2).path
    killed = write("part-c20261123000000deadbeef-0000-f000.snappy.parquet", 1).path
    pending = write("part-b0000000003-t00000-a0-r2-f000.snappy.parquet", 3).path
    foreign = write("export.parquet", 0).path
    cfg = PipelineConfig.model_validate(pipeline_body(str(tmp_path), name="p", table=uri))
    final, unknown = never_committed(cfg.places(), "table")
    assert sorted(final) == sorted([lost, killed])
    # Batch 3 is not in the table yet: a run may still commit that file.
    assert sorted(unknown) == sorted([pending, foreign])
    assert Path(uri, one.path).exists()


def test_the_maintenance_lock_is_apart_from_the_run_lock(tmp_path):
    cfg = PipelineConfig.model_validate(pipeline_body(str(tmp_path / "wh")))
    with run_lock(cfg.places(), "maintenance"):
        with run_lock(cfg.places()):
            pass
        with pytest.raises(LockBusy, match="another maintenance is in flight"):
            with run_lock(cfg.places(), "maintenance"):
                pass


def test_a_table_holding_an_unfinished_batch_keeps_its_log(tmp_path):
    from strata.maintenance.vacuum import checkpoint
    from strata.store.ledger import LEDGER_SCHEMA

    cfg = PipelineConfig.model_validate(pipeline_body(str(tmp_path), name="p"))
    short = {"delta.logRetentionDuration": "interval 0 seconds"}
    schema = pa.schema([("_batch", pa.int64())])
    DeltaTable.create(cfg.location("table"), schema=schema, configuration=short)
    DeltaTable.create(cfg.location("ledger"), schema=LEDGER_SCHEMA, configuration=short)
    for batch in (1, 2):
        commit_files(DeltaTable(cfg.location("table")), schema, [], [], "p", batch, {})
    commit_files(DeltaTable(cfg.location("ledger")), LEDGER_SCHEMA, [], [], "p", 1, {})
    # Batch 2 stands in the data table and not in the ledger: finishing or dropping it
    # reads its commit, which log cleanup would delete.
    kept = checkpoint(cfg.places()).tables["table"]
    assert not kept.log_cleaned and kept.log_files_after == kept.log_files_before + 2
    commit_files(DeltaTable(cfg.location("ledger")), LEDGER_SCHEMA, [], [], "p", 2, {})
    cleaned = checkpoint(cfg.places()).tables["table"]
    assert cleaned.log_cleaned and cleaned.log_files_after < cleaned.log_files_before


def _parquet_file(path: Path, values: list[int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"_offset": pa.array(values, pa.int64())}), path)


def test_a_plain_parquet_partition_is_read_from_its_newest_marked_directory(tmp_path):
    fs, root = pafs.LocalFileSystem(), str(tmp_path)
    hour1, hour2 = tmp_path / "dt=2026-01-01/hr=01", tmp_path / "dt=2026-01-01/hr=02"
    first, second = new_stamp(), new_stamp(datetime.now(UTC) + timedelta(seconds=1))
    _parquet_file(hour1 / "part-b0000000001-x.parquet", [1, 2])
    _parquet_file(hour1 / f"_c{first}/part-c-merged.parquet", [1, 2, 3])
    _parquet_file(hour1 / f"_c{second}/part-c-newer.parquet", [1, 2, 3, 4])
    _parquet_file(hour1 / ".part-b0000000002-y.parquet.tmp-1", [9])
    _parquet_file(hour2 / "part-b0000000001-z.parquet", [7])
    _parquet_file(tmp_path / "_strata/other.parquet", [8])
    ref = TableRef(root, "parquet")

    def rows() -> list[tuple[str, int]]:
        table = read(ref, ["hr", "_offset"])
        return sorted(zip(table["hr"].to_pylist(), table["_offset"].to_pylist(), strict=True))

    # No marker: every partition is its own directory; hidden names are never rows.
    assert current_locations(fs, root) == {}
    assert rows() == [(1, 1), (1, 2), (2, 7)]
    # A marker moves one partition; the newest of several wins; an unmarked one is unused.
    assert mark(root, {}, "dt=2026-01-01/hr=01", first)
    assert rows() == [(1, 1), (1, 2), (1, 3), (2, 7)]
    assert mark(root, {}, "dt=2026-01-01/hr=01", second)
    assert current_locations(fs, root) == {"dt=2026-01-01/hr=01": f"dt=2026-01-01/hr=01/_c{second}"}
    assert rows() == [(1, 1), (1, 2), (1, 3), (1, 4), (2, 7)]
    visible = {f.directory for f in visible_files(fs, root)}
    assert visible == {
        "dt=2026-01-01/hr=01",
        f"dt=2026-01-01/hr=01/_c{first}",
        f"dt=2026-01-01/hr=01/_c{second}",
        "dt=2026-01-01/hr=02",
    }
    # The writer puts a moved partition's late rows into its directory in use.
    writer = PartitionedWriter(
        fs,
        root,
        pa.schema([("_offset", pa.int64()), ("dt", pa.string()), ("hr", pa.string())]),
        ["dt", "hr"],
        3,
        "t00000",
        1 << 20,
        100,
        locations=current_locations(fs, root),
    )
    writer.write(pa.table({"_offset": [5, 6], "dt": ["2026-01-01"] * 2, "hr": ["01", "02"]}))
    placed = sorted(f.path.rsplit("/", 1)[0] for f in writer.close())
    assert placed == [f"dt=2026-01-01/hr=01/_c{second}", "dt=2026-01-01/hr=02"]
    assert rows() == [(1, 1), (1, 2), (1, 3), (1, 4), (1, 5), (2, 6), (2, 7)]


def _marked(root: str, partition: str, stamp: str, written: datetime) -> None:
    """Move a partition to a generation as if its marker had been written at `written`."""
    # An empty file is a marker, whatever wrote it.
    marker = Path(marker_uri(root, partition, stamp))
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_bytes(b"")
    when = written.timestamp()
    os.utime(marker, (when, when))


def test_vacuum_keeps_a_left_directory_for_the_grace_period_and_never_used_ones_go(tmp_path):
    cfg = PipelineConfig.model_validate(pipeline_body(str(tmp_path), table_format="parquet"))
    fs, root = pafs.LocalFileSystem(), cfg.location("table")
    hour = Path(root) / "dt=2026-01-01/hr=01"
    now = datetime.now(UTC)
    oldest, middle, newest, unused = (new_stamp(now - timedelta(hours=h)) for h in (3, 2, 0.5, 0.1))
    _parquet_file(hour / "part-b0000000001-x.parquet", [1])
    for stamp, moved in zip((oldest, middle, newest), (3, 2, 0.5), strict=True):
        _parquet_file(hour / f"_c{stamp}/part-c-{stamp}.parquet", [1])
        _marked(root, "dt=2026-01-01/hr=01", stamp, now - timedelta(hours=moved))
    _parquet_file(hour / f"_c{unused}/part-c-unused.parquet", [1])
    _parquet_file(Path(root) / "dt=2026-01-01/hr=02/part-b0000000001-y.parquet", [2])

    def left() -> set[str]:
        return {f.path for f in visible_files(fs, root)}

    before = left()
    counted = sweep_moved(cfg.places(), cfg.metastore, timedelta(hours=1), None)
    assert counted.removed_files == 2 and counted.never_committed == 1
    assert left() == before  # a dry run deletes nothing
    with run_lock(cfg.places(), "maintenance") as lock:
        sweep_moved(cfg.places(), cfg.metastore, timedelta(hours=1), lock)
    # Left 3h and 2h ago: gone. Left 30 min ago, or in use: kept. Never used: gone.
    assert left() == {
        f"dt=2026-01-01/hr=01/_c{middle}/part-c-{middle}.parquet",
        f"dt=2026-01-01/hr=01/_c{newest}/part-c-{newest}.parquet",
        "dt=2026-01-01/hr=02/part-b0000000001-y.parquet",
    }
    assert read_markers(fs, root).stamps == {"dt=2026-01-01/hr=01": [middle, newest]}
    assert read(TableRef(root, "parquet"), ["_offset"]).num_rows == 2


def test_grace_counts_from_when_the_move_became_visible_not_from_the_plan(tmp_path):
    # A compaction planned three hours ago (a long rewrite, a wait for the run lock)
    # and moved the partition just now: queries listed the old directory until now.
    cfg = PipelineConfig.model_validate(pipeline_body(str(tmp_path), table_format="parquet"))
    fs, root = pafs.LocalFileSystem(), cfg.location("table")
    partition = "dt=2026-01-01/hr=01"
    now = datetime.now(UTC)
    planned = new_stamp(now - timedelta(hours=3))
    _parquet_file(Path(root, partition, "part-b0000000001-x.parquet"), [1])
    _parquet_file(Path(root, partition, f"_c{planned}", "part-c-merged.parquet"), [1])
    _marked(root, partition, planned, now)

    with run_lock(cfg.places(), "maintenance") as lock:
        kept = sweep_moved(cfg.places(), cfg.metastore, timedelta(hours=1), lock)
    assert kept.removed_files == 0
    assert Path(root, partition, "part-b0000000001-x.parquet").exists()
    # Once the marker itself is older than the grace period, the old directory goes.
    _marked(root, partition, planned, now - timedelta(hours=2))
    with run_lock(cfg.places(), "maintenance") as lock:
        swept = sweep_moved(cfg.places(), cfg.metastore, timedelta(hours=1), lock)
    assert swept.removed_files == 1
    assert {f.directory for f in visible_files(fs, root)} == {f"{partition}/_c{planned}"}
    assert read(TableRef(root, "parquet"), ["_offset"]).num_rows == 1


def test_a_void_generation_refuses_a_late_marker_and_a_marker_first_refuses_the_void(tmp_path):
    cfg = PipelineConfig.model_validate(pipeline_body(str(tmp_path), table_format="parquet"))
    fs, root = pafs.LocalFileSystem(), cfg.location("table")
    partition = "dt=2026-01-01/hr=01"
    paused, later = new_stamp(), new_stamp(datetime.now(UTC) + timedelta(seconds=1))
    _parquet_file(Path(root, partition, "part-b0000000001-x.parquet"), [1, 2])
    # A compaction wrote its new directory, then was paused before its marker.
    _parquet_file(Path(root, partition, f"_c{paused}", "part-c-merged.parquet"), [1])

    def offsets() -> list[int]:
        return sorted(read(TableRef(root, "parquet"), ["_offset"])["_offset"].to_pylist())

    with run_lock(cfg.places(), "maintenance") as lock:
        swept = sweep_moved(cfg.places(), cfg.metastore, timedelta(hours=1), lock)
    assert swept.never_committed == 1
    assert not Path(root, partition, f"_c{paused}").exists() or not any(
        Path(root, partition, f"_c{paused}").iterdir()
    )
    found = read_markers(fs, root)
    assert found.stamps == {} and found.void == {partition: {paused}}
    # It wakes and writes its marker: refused, the partition stays where its rows are.
    assert not mark(root, {}, partition, paused)
    assert current_locations(fs, root) == {} and offsets() == [1, 2]
    # Woken earlier in its work, it may write files into the void directory again:
    # the next vacuum takes them, and the void marker stays.
    _parquet_file(Path(root, partition, f"_c{paused}", "part-c-late.parquet"), [1])
    with run_lock(cfg.places(), "maintenance") as lock:
        assert (
            sweep_moved(cfg.places(), cfg.metastore, timedelta(hours=1), lock).never_committed == 1
        )
    assert read_markers(fs, root).void == {partition: {paused}}

    # The other order: the marker lands first, and the move stands.
    _parquet_file(Path(root, partition, f"_c{later}", "part-c-merged.parquet"), [1, 2, 3])
    assert mark(root, {}, partition, later)
    assert not void(root, {}, partition, later, "voided by a test")
    assert current_locations(fs, root) == {partition: f"{partition}/_c{later}"}
    assert offsets() == [1, 2, 3]
    # A marker written twice (a retried request) still moves the partition.
    assert mark(root, {}, partition, later)


def _delta_with_a_batch(uri: str) -> tuple[pa.Schema, WrittenFile]:
    schema = pa.schema([("_batch", pa.int64()), ("dt", pa.string())])
    table = ensure_table(uri, schema, ["dt"], {}, "p")
    one = write_file(
        pafs.LocalFileSystem(),
        uri,
        "dt=d/part-b0000000001-t00000-a0-r1-f000.snappy.parquet",
        pa.table({"_batch": [1]}),
        {"dt": "d"},
    )
    assert commit_files(table, schema, ["dt"], [one], "p", 1, {})
    return schema, one


def _compaction_commit(
    table: DeltaTable, removed: WrittenFile, added: WrittenFile, token: int
) -> None:
    """What a compaction commits: its merged file for the file it merged, with its token."""
    now = int(time.time() * 1000)
    table.create_write_transaction(
        [
            RemoveAction(removed.path, False, now, removed.size, {"dt": "d"}),
            AddAction(added.path, added.size, {"dt": "d"}, now, False, added.stats),
        ],
        mode="append",
        schema=table.schema(),
        partition_by=["dt"],
        commit_properties=CommitProperties(app_transactions=[Transaction("p.maintenance", token)]),
    )


def test_a_fence_refuses_an_older_tokens_commit_built_before_it_and_lets_ingest_through(
    tmp_path,
):
    uri = str(tmp_path / "t")
    schema, one = _delta_with_a_batch(uri)
    merged = write_file(
        pafs.LocalFileSystem(),
        uri,
        "dt=d/part-c20261123000000deadbeef-0000-f000.snappy.parquet",
        pa.table({"_batch": [1]}),
        {"dt": "d"},
    )
    # Snapshots read before the fence: a paused compaction's, holding token 4, and an
    # ingest run's.
    compaction, ingest = DeltaTable(uri), DeltaTable(uri)
    [txn] = maintenance_transactions(compaction, "p", Fence(4, "paused"))
    assert (txn.app_id, txn.version) == ("p.maintenance", 4)
    fence_maintenance(DeltaTable(uri), "p", Fence(5, "vacuum-run"), "vacuum")
    # delta-rs refuses a commit carrying an app id committed after its snapshot...
    with pytest.raises(CommitFailedError):
        _compaction_commit(compaction, one, merged, 4)
    # ...and on a snapshot holding the fence, the token is seen to be outranked.
    with pytest.raises(LeaseLost, match="fence 5 .*, above this run's fencing token 4"):
        maintenance_transactions(DeltaTable(uri), "p", Fence(4, "paused"))
    with pytest.raises(LeaseLost):
        fence_maintenance(DeltaTable(uri), "p", Fence(4, "paused"), "vacuum")
    # Another app id, only adds: the ingest run commits beside the fence.
    two = write_file(
        pafs.LocalFileSystem(),
        uri,
        "dt=d/part-b0000000002-t00000-a0-r1-f000.snappy.parquet",
        pa.table({"_batch": [2]}),
        {"dt": "d"},
    )
    assert commit_files(ingest, schema, ["dt"], [two], "p", 2, {})
    table = DeltaTable(uri)
    assert table.transaction_version("p") == 2 and table.transaction_version("p.maintenance") == 5
    assert sorted(table.to_pyarrow_table()["_batch"].to_pylist()) == [1, 2]
    # The fence is no batch: no `strata.batch`, and fencing again adds no commit.
    fence = next(c for c in table.history() if FENCE_INFO_KEY in c)
    assert "strata.batch" not in fence
    version = table.version()
    fence_maintenance(DeltaTable(uri), "p", Fence(5, "vacuum-run"), "vacuum")
    assert DeltaTable(uri).version() == version
    # The holder of the fence's token, or a later one, commits.
    _compaction_commit(DeltaTable(uri), one, merged, 6)
    assert DeltaTable(uri).to_pyarrow_table()["_batch"].to_pylist() == [1, 2]
    assert maintenance_transactions(DeltaTable(uri), "p", None) == []


def _leased(where: Path):
    """`run_lock` for an object-store state location, with the lease on a local folder.

    The lease is the real one (`strata.store.lease`); only its store differs from S3's, which
    the integration tier uses.
    """

    @contextmanager
    def run_lock(places: Places, what: str = "run", floor=None):
        with hold_lease(str(where / what), {}, places.pipeline, 600, what, floor) as lease:
            yield lease

    return run_lock


def test_vacuum_fences_a_table_before_it_deletes_a_paused_compactions_files(tmp_path, monkeypatch):
    uri = str(tmp_path / "t")
    _, one = _delta_with_a_batch(uri)
    cfg = PipelineConfig.model_validate(pipeline_body(str(tmp_path), name="p", table=uri))
    leased = _leased(tmp_path / "lease")
    monkeypatch.setattr("strata.store.lock.run_lock", leased)
    with leased(cfg.places(), "maintenance") as paused_lease:
        token = paused_lease.token
    assert token is not None
    # A compaction holding that token wrote its merged file and read its snapshot,
    # then was paused past its lease.
    merged = write_file(
        pafs.LocalFileSystem(),
        uri,
        "dt=d/part-c20261123000000deadbeef-0000-f000.snappy.parquet",
        pa.table({"_batch": [1]}),
        {"dt": "d"},
    )
    snapshot = DeltaTable(uri)
    done = vacuum(cfg.places(), cfg.maintenance.vacuum_retention, cfg.metastore)
    assert done.tables["table"].never_committed == 1
    assert not Path(uri, merged.path).exists()
    # Woken, it commits on its old snapshot: refused, so no commit names a deleted file.
    with pytest.raises(CommitFailedError):
        _compaction_commit(snapshot, one, merged, token)
    table = DeltaTable(uri)
    # The vacuum's fence: its token is the epoch after the paused holder's and its end.
    assert table.transaction_version("p.maintenance") == token + 2
    active = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
    assert active == [one.path] and all(Path(uri, a).exists() for a in active)
    assert table.to_pyarrow_table()["_batch"].to_pylist() == [1]


def test_a_fence_of_this_runs_token_written_by_another_run_lets_neither_pass_as_the_other(
    tmp_path,
):
    # Two runs given one token: only if the lease's folder was removed while one of them
    # was in flight. The table's fence is the first one's; the second must not take it
    # for its own (and so delete files as if it had fenced), nor commit with it.
    uri = str(tmp_path / "t")
    _delta_with_a_batch(uri)
    first = Fence(5, "first-run")
    fence_maintenance(DeltaTable(uri), "p", first, "vacuum")
    version = DeltaTable(uri).version()
    with pytest.raises(LeaseLost, match="equal to this run's fencing token 5") as refused:
        fence_maintenance(DeltaTable(uri), "p", Fence(5, "second-run"), "vacuum")
    assert "left by vacuum run first-run" in str(refused.value)
    with pytest.raises(LeaseLost, match="equal to this run's fencing token 5"):
        maintenance_transactions(DeltaTable(uri), "p", Fence(5, "second-run"))
    assert DeltaTable(uri).version() == version
    # The run that wrote it, asking again (a reply it lost), finds its own fence there.
    fence_maintenance(DeltaTable(uri), "p", Fence(5, "first-run"), "vacuum")
    [txn] = maintenance_transactions(DeltaTable(uri), "p", first)
    assert (txn.version, DeltaTable(uri).version()) == (5, version)


def test_a_compaction_after_one_on_a_host_whose_clock_runs_ahead_still_moves_the_partition(
    tmp_path,
):
    # A host an hour ahead compacted the partition: its generation is stamped an hour in
    # the future. A compaction planned after it, on a host whose clock is right, must
    # move the partition to its own directory, or its merge would be for nothing and
    # its marker would never be the one in use.
    fs, root = pafs.LocalFileSystem(), str(tmp_path / "t")
    partition = "dt=2026-01-01/hr=01"
    ahead = new_stamp(datetime.now(UTC) + timedelta(hours=1))
    for n in (1, 2):
        _parquet_file(Path(root, partition, f"_c{ahead}", f"part-b000000000{n}-x.parquet"), [n])
    assert mark(root, {}, partition, ahead)
    settings = Compaction("0s", 1 << 20, 2, 64 << 20, 1000, ("dt", "hr"), "UTC")
    settled = datetime(2026, 1, 2, tzinfo=UTC)
    [picked] = plan_directory(TableRef(root, "parquet"), settings, settled, None, "tok", 2)
    assert picked.merged == {f"{partition}/_c{ahead}/part-b000000000{n}-x.parquet" for n in (1, 2)}
    assert picked.stamp > ahead
    _parquet_file(Path(root, picked.directory, "part-ctok-0000-a0-f000.parquet"), [1, 2])
    assert mark(root, {}, partition, picked.stamp)
    assert current_locations(fs, root) == {partition: picked.directory}
    assert read(TableRef(root, "parquet"), ["_offset"])["_offset"].to_pylist() == [1, 2]


def test_vacuum_deletes_void_markers_a_move_stands_above_and_keeps_those_still_guarding(tmp_path):
    cfg = PipelineConfig.model_validate(pipeline_body(str(tmp_path), table_format="parquet"))
    fs, root = pafs.LocalFileSystem(), cfg.location("table")
    partition, other = "dt=2026-01-01/hr=01", "dt=2026-01-01/hr=02"
    now = datetime.now(UTC)
    voided, moved, guarding = (new_stamp(now - timedelta(minutes=m)) for m in (30, 20, 10))
    _parquet_file(Path(root, partition, "part-b0000000001-x.parquet"), [1])
    _parquet_file(Path(root, other, "part-b0000000001-y.parquet"), [2])
    # A compaction voided before its move, then one that moved the partition; in the
    # other partition, a void no move stands above: a paused compaction's marker would
    # still move it.
    assert void(root, {}, partition, voided, "voided by a test")
    _parquet_file(Path(root, partition, f"_c{moved}", "part-c-merged.parquet"), [1])
    _marked(root, partition, moved, now - timedelta(minutes=20))
    assert void(root, {}, other, guarding, "voided by a test")
    with run_lock(cfg.places(), "maintenance") as lock:
        swept = sweep_moved(cfg.places(), cfg.metastore, timedelta(hours=1), lock)
    assert swept.metadata_files == 1
    found = read_markers(fs, root)
    assert found.void == {other: {guarding}} and found.stamps == {partition: [moved]}
    # The voided compaction wakes and writes its marker in the freed name: below the
    # move that stands, it moves nothing.
    assert mark(root, {}, partition, voided)
    assert current_locations(fs, root) == {partition: f"{partition}/_c{moved}"}
    assert not mark(root, {}, other, guarding)
    assert sorted(read(TableRef(root, "parquet"), ["_offset"])["_offset"].to_pylist()) == [1, 2]
