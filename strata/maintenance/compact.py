"""Compaction: merge a table's small files into a few large ones, disturbing nobody.

Each batch writes at most one file per task and event hour, which is right for the
batch, but hourly runs and late events pile small files into every partition. A
compaction run picks the settled partitions holding small files, rewrites them in
Spark tasks into files of `limits.target_file_mb` (rows sorted by the keys the writer
wrote them in, so row-group statistics keep pruning), and commits each partition in a
Delta transaction of its own whose removes and adds are marked `dataChange=false`.

Who may run beside it:

- An ingest only appends: Delta lands its commit beside the compaction's (the two
  touch different files), so no ingest ever waits for or fails on a compaction. Only
  files of batches the ledger holds are picked: an unfinished batch's files are left
  to the run that finishes (or drops) it.
- A backfill or replay rewrites files, and vacuum deletes them: each takes the
  maintenance lock, as compaction does, so none of them runs beside it.
- A schema change landing meanwhile fails the compaction's commit; it is retried on
  the new snapshot, with the same files (old rows read a new column as null).

A compaction killed at any step leaves the table as it was, or with some partitions
done: files it wrote but did not commit are never read, vacuum removes them, and the
next compaction picks the partitions left. One paused past its lease (on an object
store) and woken after another maintenance run took over acts on nothing: its Delta
commits carry its fencing token, which a later vacuum's fence outranks (see
`strata.store.delta`), and its plain Parquet marker is refused once vacuum has voided the
new directory (see `strata.store.locations`).

A plain Parquet data table has no log: a partition's directory is the partition. Its
merged files, and copies of the files the merge leaves, go into a new directory of the
partition's, and one marker, created only if absent, moves the partition there (see
`strata.store.locations`); the metastore's partition location follows at once. The move
happens under the run lock, after copying the files a run added since the merge began,
so late rows are never left behind; the old files stay for queries that listed them
until vacuum's grace period.
Such tables need a metastore: an engine that finds partitions by directory name would
not see the move. Unpartitioned plain Parquet tables (raw copy, quarantine, ledger) are
left alone: their location is the table's own, which other catalogs may hold.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction

from strata import faults
from strata.batch.write import (
    WrittenFile,
    file_batch,
    is_compaction_file,
    partition_path,
    write_sized,
)
from strata.config import LimitsConfig, Location, MaintenanceConfig, PipelineConfig
from strata.durations import parse_duration_ms
from strata.errors import LeaseLost, MaintenanceError, MetastoreError
from strata.log import get_logger
from strata.schema.avro import table_layout
from strata.schema.partitions import partition_span
from strata.store.delta import committed_batch, maintenance_transactions, open_table
from strata.store.files import filesystem
from strata.store.locations import (
    TableFile,
    announce_moves,
    current_files,
    generation_dir,
    mark,
    new_stamp,
    withdraw_moves,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from strata.store.lock import RunLock

logger = get_logger(__name__)

COMPACTION_KEY = "strata.compaction"
# Every table Strata owns, in the order they are maintained.
MAINTAINED: tuple[Location, ...] = ("table", "raw", "quarantine", "ledger")
# The keys each table's rows are written in: compacted files keep that order.
_SORT_KEYS = {
    "ledger": ["batch", "topic", "partition"],
    "other": ["_topic", "_partition", "_offset"],
}
# A commit beaten by a schema change is retried this often on the new snapshot.
_COMMIT_TRIES = 5


@dataclass(frozen=True)
class Bin:
    """Small files of one partition that one Spark task merges.

    Attributes:
        uri: The table's location.
        options: Storage options.
        paths: The files, relative to the table root.
        partition_values: Their partition values.
        stem: The merged files' path, relative to the root, without the file number.
        sort_by: The columns the merged rows are sorted by.
        target_bytes: Size at which a merged file is closed.
        row_group_rows: Rows per row group.
    """

    uri: str
    options: dict[str, str] = field(repr=False)
    paths: list[str]
    partition_values: dict[str, str]
    stem: str
    sort_by: list[str]
    target_bytes: int
    row_group_rows: int


@dataclass
class PartitionCompaction:
    """What compaction did (or, in a dry run, would do) to one partition.

    Attributes:
        table: `table`, `raw`, `quarantine` or `ledger`.
        partition: `dt=…/hr=…`, or `` for an unpartitioned table.
        files_before: The partition's files before.
        bytes_before: Their bytes.
        files_after: The partition's files after (in a dry run, the estimate).
        bytes_after: Their bytes (in a dry run, as before).
        merged: Files merged.
        seconds: Time the rewrite and the commit took.
        outcome: `compacted`, `planned` (dry run), or why it was left as it was.
    """

    table: str
    partition: str
    files_before: int
    bytes_before: int
    files_after: int
    bytes_after: int
    merged: int
    seconds: float = 0.0
    outcome: str = "planned"


@dataclass
class CompactionReport:
    """What a compaction run did, per partition.

    Attributes:
        pipeline: The pipeline.
        dry_run: Whether nothing was changed.
        partitions: One entry per partition picked.
        skipped: Tables left alone, with why.
        seconds: The whole run's time.
    """

    pipeline: str
    dry_run: bool
    partitions: list[PartitionCompaction] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values."""
        return asdict(self)


@dataclass
class _Picked:
    """One partition's plan: its files now, and the bins its small files go into.

    For a plain Parquet partition, `directory` is the new directory the merged files go
    to, and `stamp` the marker that moves the partition there.
    """

    table: Location
    values: dict[str, str]
    files: list[dict[str, Any]]
    bins: list[Bin]
    directory: str = ""
    stamp: str = ""

    @property
    def name(self) -> str:
        """`dt=…/hr=…`, or `` for an unpartitioned table."""
        return partition_path(list(self.values), list(self.values.values()))

    @property
    def merged(self) -> set[str]:
        """The paths of the files its bins merge."""
        return {path for b in self.bins for path in b.paths}


def parse_partition(text: str, columns: list[str]) -> dict[str, str]:
    """`dt=2026-01-01/hr=03` (or a prefix of the partition columns) as values.

    Raises:
        MaintenanceError: If it names other columns than the table's, or out of order.
    """
    values: dict[str, str] = {}
    for part in text.strip("/").split("/"):
        name, eq, value = part.partition("=")
        if not eq or not value:
            raise MaintenanceError(f"--partition {text!r}: write it as dt=YYYY-MM-DD[/hr=HH]")
        values[name] = value
    if list(values) != columns[: len(values)]:
        raise MaintenanceError(
            f"--partition {text!r}: the data table is partitioned by "
            f"{'/'.join(columns)}; name those columns, in that order"
        )
    return values


def partition_end(values: dict[str, str], zone: str = "UTC") -> datetime | None:
    """When an event-time partition's time span ends; None if the values are not times.

    Args:
        values: The partition's values (`dt`, maybe `hr` and a field's).
        zone: The zone the values are local times of (`partitioning.timezone`).
    """
    span = partition_span(values["dt"], values.get("hr"), zone) if "dt" in values else None
    return None if span is None else span[1]


def small_bytes(maintenance: MaintenanceConfig, limits: LimitsConfig) -> int:
    """Files under this many bytes count as small."""
    mb = maintenance.small_file_mb or max(1, limits.target_file_mb // 2)
    return mb << 20


def pack(files: list[dict[str, Any]], target: int) -> list[list[dict[str, Any]]]:
    """Consecutive files grouped into bins of about `target` bytes; single files dropped.

    Files come sorted by where their rows start, so a bin holds neighbouring rows and
    the merged files' statistics stay narrow.
    """
    bins: list[list[dict[str, Any]]] = [[]]
    size = 0
    for f in files:
        if bins[-1] and size + f["size_bytes"] > target:
            bins.append([])
            size = 0
        bins[-1].append(f)
        size += f["size_bytes"]
    return [b for b in bins if len(b) > 1]


def plan_table(
    cfg: PipelineConfig,
    which: Location,
    table: DeltaTable,
    settled_before: datetime,
    only: dict[str, str] | None,
    token: str,
    last: int,
) -> list[_Picked]:
    """The partitions of one Delta table to compact, with their bins.

    A file is picked when it is small and every row in it belongs to a batch the ledger
    holds (its `_batch`, or for the ledger `batch`, statistics say so: at most `last`);
    a partition when it is settled and holds at least `min_small_files` such files.
    """
    batch_column = "batch" if which == "ledger" else "_batch"
    partition_by = list(table.metadata().partition_columns)
    small = small_bytes(cfg.maintenance, cfg.limits)
    adds = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    by_key: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for add in adds:
        key = tuple(str(add[f"partition.{c}"]) for c in partition_by)
        by_key.setdefault(key, []).append(add)
    sort_by = _SORT_KEYS["ledger" if which == "ledger" else "other"]
    picked = []
    for key, files in sorted(by_key.items()):
        values = dict(zip(partition_by, key, strict=True))
        if not _wanted(values, only, settled_before, cfg.partitioning.timezone):
            continue
        mergeable = [
            f
            for f in files
            if f["size_bytes"] < small
            and f.get(f"max.{batch_column}") is not None
            and f[f"max.{batch_column}"] <= last
            # An unpartitioned table has no event hours: its newest files settle first.
            and (partition_by or _modified(f) <= settled_before)
        ]
        if len(mergeable) < cfg.maintenance.min_small_files:
            continue
        # Statistics of one column share a type across files; a missing one sorts last.
        mergeable.sort(
            key=lambda f: (
                tuple((f.get(f"min.{c}") is None, f.get(f"min.{c}")) for c in sort_by)
                + (f["path"],)
            )
        )
        bins = _bins(cfg, which, mergeable, values, partition_path(partition_by, key), token)
        if bins:
            picked.append(_Picked(which, values, files, bins))
    return picked


def _wanted(
    values: dict[str, str], only: dict[str, str] | None, settled_before: datetime, zone: str
) -> bool:
    """Whether a partition is asked for (`--partition`) and settled (an unpartitioned
    table's files settle one by one instead); its values are local times of `zone`."""
    if only is not None and any(values.get(k) != v for k, v in only.items()):
        return False
    if not values:
        return True
    end = partition_end(values, zone)
    return end is not None and end <= settled_before


def _bins(
    cfg: PipelineConfig,
    which: Location,
    mergeable: list[dict[str, Any]],
    values: dict[str, str],
    directory: str,
    token: str,
) -> list[Bin]:
    """The bins a partition's mergeable files go into, merged files written to `directory`."""
    target = cfg.limits.target_file_mb << 20
    return [
        Bin(
            cfg.location(which),
            cfg.storage_options,
            [f["path"] for f in group],
            values,
            f"{directory}/part-c{token}-{number:04d}".lstrip("/"),
            _SORT_KEYS["ledger" if which == "ledger" else "other"],
            target,
            cfg.limits.row_group_rows,
        )
        for number, group in enumerate(pack(mergeable, target))
    ]


def plan_directory(
    cfg: PipelineConfig,
    settled_before: datetime,
    only: dict[str, str] | None,
    token: str,
    last: int,
) -> list[_Picked]:
    """The partitions of a plain Parquet data table to compact, with their bins.

    The same rules as `plan_table`, with the batch read from each file's name: a batch's
    file is committed once the ledger holds the batch, a compaction's once its partition
    was moved to it.
    """
    _, partition_by = table_layout(cfg.schemas(), "table")
    fs, root = filesystem(cfg.location("table"), cfg.storage_options)
    small = small_bytes(cfg.maintenance, cfg.limits)
    by_partition: dict[str, list[TableFile]] = {}
    for f in current_files(fs, root):
        by_partition.setdefault(f.partition, []).append(f)
    stamp = new_stamp()
    picked = []
    for name, found in sorted(by_partition.items()):
        values = dict(part.split("=", 1) for part in name.split("/") if part)
        wanted = _wanted(values, only, settled_before, cfg.partitioning.timezone)
        if list(values) != partition_by or not wanted:
            continue
        files: list[dict[str, Any]] = [
            {"path": f.path, "size_bytes": f.size} for f in sorted(found, key=_by_name)
        ]
        mergeable = [f for f in files if f["size_bytes"] < small and _committed(f["path"], last)]
        if len(mergeable) < cfg.maintenance.min_small_files:
            continue
        directory = generation_dir(name, stamp)
        bins = _bins(cfg, "table", mergeable, values, directory, token)
        if bins:
            picked.append(_Picked("table", values, files, bins, directory, stamp))
    return picked


def _by_name(f: TableFile) -> str:
    # Batch files are named by batch number first: name order is offset order.
    return f.path.rsplit("/", 1)[-1]


def _committed(path: str, last: int) -> bool:
    """Whether a plain Parquet file's rows stand: its batch is in the ledger, or it is a
    compaction's (found in a partition's directory in use), or it is no batch's at all
    (put there by hand, and read as the table's like any other file)."""
    batch = file_batch(path)
    return batch is None or batch <= last or is_compaction_file(path)


def _modified(add: dict[str, Any]) -> datetime:
    """When a file was written (its add action's `modification_time`, epoch ms)."""
    return datetime.fromtimestamp(add["modification_time"] / 1000, UTC)


def rewrite_bin(job: Bin) -> tuple[list[WrittenFile], float]:
    """Merge one bin's files into sorted, target-sized files (runs in a Spark task).

    Files written before a column was added lack it: the bin is read with the union of
    its files' schemas, so their rows read it as null, as the table shows them.

    Returns:
        The files written, and the seconds it took.
    """
    from strata.batch.task import task_attempt

    began = time.monotonic()
    fs, root = filesystem(job.uri, job.options)
    paths = [f"{root}/{p}" for p in job.paths]
    schema = pa.unify_schemas([pq.read_schema(p, filesystem=fs) for p in paths])
    rows = ds.dataset(paths, schema=schema, format="parquet", filesystem=fs).to_table()
    keys = [(c, "ascending") for c in job.sort_by if c in schema.names]
    if keys:
        rows = rows.sort_by(keys)
    # Names of this attempt's own: a speculative or retried attempt never writes over
    # a file another attempt may have reported.
    stem = f"{job.stem}-a{task_attempt()}"
    files = write_sized(
        fs, root, stem, rows, job.partition_values, job.target_bytes, job.row_group_rows
    )
    return files, time.monotonic() - began


def compact(
    cfg: PipelineConfig,
    partition: str | None = None,
    older_than: str | None = None,
    dry_run: bool = False,
    session: Callable[[PipelineConfig], SparkSession] | None = None,
) -> CompactionReport:
    """Compact a pipeline's tables: all four under Delta; plain Parquet's data table.

    Args:
        cfg: The pipeline configuration.
        partition: Only this partition of the data table (`dt=…[/hr=…]`).
        older_than: Settle time overriding `maintenance.settle`.
        dry_run: Report what would be merged; change nothing and start no JVM.
        session: Builds the Spark session (tests pass a shared one).

    Returns:
        What was merged, per partition.

    Raises:
        LockBusy: If a backfill, a replay, vacuum or another compaction is in flight; for
            plain Parquet, also if a run still holds the run lock after 10 minutes.
        MaintenanceError: If `partition` does not name the data table's columns.
    """
    from strata.schema.avro import partition_columns
    from strata.store.lock import run_lock

    began = time.monotonic()
    report = CompactionReport(cfg.name, dry_run)
    try:
        settle_ms = parse_duration_ms(older_than or cfg.maintenance.settle)
    except ValueError as exc:
        raise MaintenanceError(f"--older-than {older_than!r}: {exc}") from None
    settled_before = datetime.now(UTC) - timedelta(milliseconds=settle_ms)
    only = (
        None
        if partition is None
        else parse_partition(partition, partition_columns(cfg.partitioning))
    )
    token = datetime.now(UTC).strftime("%Y%m%d%H%M%S") + uuid.uuid4().hex[:8]
    if dry_run:
        _plan_all(cfg, settled_before, only, token, report)
        report.seconds = time.monotonic() - began
        return report
    with run_lock(cfg.places(), "maintenance") as lock:
        picked = _plan_all(cfg, settled_before, only, token, report)
        if picked:
            _rewrite_and_commit(cfg, picked, report, session, lock)
    report.seconds = time.monotonic() - began
    return report


def _plan_all(
    cfg: PipelineConfig,
    settled_before: datetime,
    only: dict[str, str] | None,
    token: str,
    report: CompactionReport,
) -> list[_Picked]:
    picked: list[_Picked] = []
    last = committed_batch(cfg.location("ledger"), cfg.name, cfg.storage_options) or 0
    for which in MAINTAINED if only is None else ("table",):
        if cfg.table_format != "delta":
            skipped = _parquet_skip(cfg, which)
            if skipped:
                report.skipped[which] = skipped
                continue
            found = plan_directory(cfg, settled_before, only, token, last)
        else:
            table = open_table(cfg.location(which), cfg.storage_options)
            if table is None:
                report.skipped[which] = "no table yet"
                continue
            found = plan_table(cfg, which, table, settled_before, only, token, last)
        picked += found
        for p in found:
            merged = p.merged
            merged_bytes = sum(f["size_bytes"] for f in p.files if f["path"] in merged)
            estimate = -(-merged_bytes // (cfg.limits.target_file_mb << 20))
            size = sum(f["size_bytes"] for f in p.files)
            report.partitions.append(
                PartitionCompaction(
                    which,
                    p.name,
                    len(p.files),
                    size,
                    len(p.files) - len(merged) + max(estimate, len(p.bins)),
                    size,
                    len(merged),
                )
            )
    return picked


def _parquet_skip(cfg: PipelineConfig, which: Location) -> str | None:
    """Why a plain Parquet pipeline's table is not compacted, or None if it is."""
    if which != "table":
        # The ledger too: it is registered for SQL as a plain Parquet directory.
        return (
            "unpartitioned plain Parquet: its location is the table's own, which catalogs "
            "other than Strata's may hold (see the README)"
        )
    if not cfg.metastore.uri:
        return (
            "plain Parquet without a metastore: engines that find partitions by directory "
            "would not see a compacted partition's new location; set metastore.uri"
        )
    return None


def _rewrite_and_commit(
    cfg: PipelineConfig,
    picked: list[_Picked],
    report: CompactionReport,
    session: Callable[[PipelineConfig], SparkSession] | None,
    lock: RunLock,
) -> None:
    from strata.spark.session import build_session, run_each

    jobs = [b for p in picked for b in p.bins]
    spark = (session or build_session)(cfg)
    written = run_each(spark, rewrite_bin, jobs, f"{cfg.name} compaction of {len(jobs)} bins")
    faults.reached(faults.AFTER_COMPACT_FILES)
    by_bin = {(job.uri, job.stem): out for job, out in zip(jobs, written, strict=True)}
    entries = {(e.table, e.partition): e for e in report.partitions}
    moved: dict[str, str] = {}
    if cfg.table_format == "parquet":
        began = time.monotonic()
        moved = _move_partitions(cfg, picked, lock)
        logger.info(
            "%s: %s partitions moved in %.1fs", cfg.name, len(moved), time.monotonic() - began
        )
    for p in picked:
        entry = entries[(p.table, p.name)]
        began = time.monotonic()
        outs = [by_bin[(b.uri, b.stem)] for b in p.bins]
        new = [f for files, _ in outs for f in files]
        old = p.merged
        if cfg.table_format == "parquet":
            entry.outcome = moved[p.name]
        else:
            entry.outcome = _commit_partition(cfg, p, old, new, lock)
        kept = [f for f in p.files if f["path"] not in old]
        if entry.outcome == "compacted":
            entry.files_after = len(kept) + len(new)
            entry.bytes_after = sum(f["size_bytes"] for f in kept) + sum(f.size for f in new)
        else:
            # Its files are left for vacuum, which deletes a compaction's uncommitted
            # files: deleting them here could take ones a commit whose reply was lost holds.
            entry.files_after, entry.bytes_after = entry.files_before, entry.bytes_before
        entry.seconds = sum(took for _, took in outs) + time.monotonic() - began
        logger.info(
            "%s %s %s: %s files -> %s (%s)",
            cfg.name,
            p.table,
            entry.partition or "(whole table)",
            entry.files_before,
            entry.files_after,
            entry.outcome,
        )
        faults.reached(faults.AFTER_COMPACT_COMMIT)


def _move_partitions(cfg: PipelineConfig, picked: list[_Picked], lock: RunLock) -> dict[str, str]:
    """Move each plain Parquet partition to its new directory, then the metastore too.

    The files the merge left are copied into the new directory first (committed files
    never change). Then, under the run lock, so no batch writes meanwhile: the files a
    run added since the partition was listed are copied too, the ledger is read again
    to tell them committed, and the marker is written. Files of a batch the ledger does
    not hold are not carried: the run that finishes that batch deletes and rewrites them,
    in the partition's directory in use.

    Returns:
        Per partition, `compacted` or why it was left as it was.
    """
    from strata.catalog.register import register_tables
    from strata.store.lock import BothLocks, lock_when_free

    fs, root = filesystem(cfg.location("table"), cfg.storage_options)
    last = committed_batch(cfg.location("ledger"), cfg.name, cfg.storage_options) or 0
    carried: dict[str, set[str]] = {}
    for p in picked:
        carried[p.name] = set()
        for f in p.files:
            if f["path"] not in p.merged and _committed(f["path"], last):
                _carry(fs, root, f["path"], p.directory)
                carried[p.name].add(f["path"])
    outcome: dict[str, str] = {}
    location = cfg.location("table")
    with lock_when_free(cfg.places(), "run", _RUN_LOCK_WAIT_S) as run:
        both = BothLocks(lock, run)
        # Before any check that a marker follows: a run that takes the run lock over
        # from this one (paused past its lease) voids the moves not made yet.
        stamps = {p.stamp for p in picked}
        announced = [
            announce_moves(location, cfg.storage_options, stamp, [p.name for p in picked])
            for stamp in sorted(stamps)
        ]
        last = committed_batch(cfg.location("ledger"), cfg.name, cfg.storage_options) or 0
        now: dict[str, set[str]] = {}
        for listed in current_files(fs, root):
            now.setdefault(listed.partition, set()).add(listed.path)
        for p in picked:
            there = now.get(p.name, set())
            if not p.merged <= there:
                outcome[p.name] = "left: files to merge were removed meanwhile"
                continue
            for path in sorted(there - p.merged - carried[p.name]):
                if _committed(path, last):
                    _carry(fs, root, path, p.directory)
            # A compaction that lost its lease must not move anything: vacuum may run.
            both.check()
            faults.reached(faults.AFTER_COMPACT_CHECK)
            # The check above can be stale by the time the marker lands (a pause right
            # here): the marker is created only if vacuum has not voided the directory.
            if not mark(location, cfg.storage_options, p.name, p.stamp):
                raise LeaseLost(
                    f"pipeline {cfg.name}: this compaction lost its lease before it moved "
                    f"{p.name}: a vacuum or a run that took over voided its new directory "
                    f"{p.directory}, so the partition stays where it was. Partitions it "
                    "moved before stay moved (the next run, or `strata register --pipeline "
                    f"{cfg.name}`, points the metastore at them); the next compaction picks "
                    "the others."
                )
            outcome[p.name] = "compacted"
            faults.reached(faults.AFTER_COMPACT_MOVE)
        for uri in announced:
            withdraw_moves(uri, cfg.storage_options)
        if any(o == "compacted" for o in outcome.values()):
            try:
                register_tables(cfg)
            except MetastoreError as exc:
                note = (
                    f"compacted; the metastore still lists the old location ({exc}); the "
                    f"next run, or `strata register --pipeline {cfg.name}`, moves it"
                )
                outcome = {k: note if v == "compacted" else v for k, v in outcome.items()}
    return outcome


# How long a compaction waits for a run in flight before moving its partitions.
_RUN_LOCK_WAIT_S = 600.0


def _carry(fs: pafs.FileSystem, root: str, path: str, directory: str) -> None:
    """Copy a file, under its own name, into a partition's new directory."""
    fs.copy_file(f"{root}/{path}", f"{root}/{directory}/{path.rsplit('/', 1)[-1]}")


def _commit_partition(
    cfg: PipelineConfig, picked: _Picked, old: set[str], new: list[WrittenFile], lock: RunLock
) -> str:
    """Swap a partition's merged files for the new ones in one transaction.

    Where the maintenance lock has a fencing token (a lease), the commit carries it: a
    vacuum that took the lease over fenced the table with a higher one, and then this
    commit fails, whether or not the fence is in the snapshot it is built on.

    Returns:
        `compacted`, or why not: a file to be removed is no longer in the table (only a
        run that broke the maintenance lock's rule could cause that; the partition is
        left as it is, its new files to vacuum).

    Raises:
        LeaseLost: If this compaction lost its lease, or a later maintenance run fenced
            the table.
    """
    uri = cfg.location(picked.table)
    info = {f["path"]: f for f in picked.files}
    for attempt in range(_COMMIT_TRIES):
        table = open_table(uri, cfg.storage_options)
        if table is None:
            raise MaintenanceError(f"{uri}: the table disappeared during compaction")
        active = set(pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist())
        if new and {f.path for f in new} <= active:
            # An attempt whose reply was lost landed after all.
            return "compacted"
        if not old <= active:
            return "left: files to merge were removed meanwhile"
        now = int(time.time() * 1000)
        values: dict[str, str | None] | None = dict(picked.values) or None
        actions: list[AddAction | RemoveAction] = [
            RemoveAction(path, False, now, info[path]["size_bytes"], values) for path in sorted(old)
        ]
        actions += [AddAction(f.path, f.size, f.partition_values, now, False, f.stats) for f in new]
        # A compaction that lost its lease must not commit: vacuum may run by now.
        lock.check()
        fence = maintenance_transactions(table, cfg.name, lock.token)
        faults.reached(faults.AFTER_COMPACT_CHECK)
        summary = {
            "partition": picked.name,
            "removed": len(old),
            "added": len(new),
        }
        try:
            table.create_write_transaction(
                actions,
                mode="append",
                schema=table.schema(),
                partition_by=list(table.metadata().partition_columns) or None,
                commit_properties=CommitProperties(
                    custom_metadata={COMPACTION_KEY: json.dumps(summary)},
                    app_transactions=fence,
                ),
            )
        except CommitFailedError as exc:
            # A schema change, or a vacuum's fence, landed after this snapshot: look
            # again on the new one, where a fence shows as a token above this run's.
            logger.info("%s: compaction commit retried (%s), attempt %s", uri, exc, attempt + 1)
            continue
        return "compacted"
    return f"left: {_COMMIT_TRIES} commits were beaten by concurrent changes"


def render_compaction(report: CompactionReport) -> str:
    """The report as lines an operator reads."""
    verb = "would merge" if report.dry_run else "merged"
    lines = [f"pipeline {report.pipeline}: compaction{' (dry run)' if report.dry_run else ''}"]
    for which, why in report.skipped.items():
        lines.append(f"  {which}: skipped, {why}")
    if not report.partitions:
        lines.append("  nothing to compact: no settled partition holds enough small files")
    for p in report.partitions:
        where = f"{p.table} {p.partition}" if p.partition else f"{p.table} (whole table)"
        lines.append(
            f"  {where}: {verb} {p.merged} files; {p.files_before} files "
            f"{p.bytes_before / 1e6:.1f} MB -> {p.files_after} files "
            f"{p.bytes_after / 1e6:.1f} MB, {p.seconds:.1f}s, {p.outcome}"
        )
    lines.append(f"  took {report.seconds:.1f}s")
    return "\n".join(lines)
