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

import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from strata import faults
from strata.config import LimitsConfig, Location, MaintenanceConfig, PartitioningConfig
from strata.durations import parse_duration_ms
from strata.errors import MaintenanceError
from strata.log import get_logger
from strata.maintenance import _iceberg
from strata.maintenance._bins import Bin, Picked, rewrite_bin
from strata.maintenance._commit import commit_partition
from strata.maintenance._fences import held_fence
from strata.maintenance._moves import move_partitions, stands
from strata.schema.avro import partition_columns
from strata.schema.partitions import partition_span
from strata.store import iceberg
from strata.store.delta import committed_batch, open_table
from strata.store.ledger import ledger_file_batch
from strata.store.locations import (
    TableFile,
    generation_dir,
    next_stamp,
    place,
    read_markers,
    visible_files,
)
from strata.store.parquet import partition_path
from strata.store.places import Places, TableRef

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from strata.store.lock import RunLock

logger = get_logger(__name__)

# Every table Strata owns, in the order they are maintained.
MAINTAINED: tuple[Location, ...] = ("table", "raw", "quarantine", "ledger")
# The keys each table's rows are written in: compacted files keep that order.
_SORT_KEYS = {
    "ledger": ["batch", "topic", "partition"],
    "other": ["_topic", "_partition", "_offset"],
}


@dataclass(frozen=True)
class Compaction:
    """Which files a compaction merges, and into what.

    The entry points build it from the configuration's sections (`Compaction.of`).

    Attributes:
        settle: How long after its end an event-time partition is taken
            (`maintenance.settle`; `--older-than` overrides it for one run).
        small_bytes: Files under this many bytes are small (`small_bytes`).
        min_small_files: A partition is taken once it holds this many small files.
        target_bytes: Size at which a merged file is closed (`limits.target_file_mb`).
        row_group_rows: Rows per row group of the merged files.
        partition_by: The data table's partition columns.
        zone: The zone the partitions' values are local times of.
    """

    settle: str
    small_bytes: int
    min_small_files: int
    target_bytes: int
    row_group_rows: int
    partition_by: tuple[str, ...]
    zone: str

    @classmethod
    def of(
        cls,
        maintenance: MaintenanceConfig,
        limits: LimitsConfig,
        partitioning: PartitioningConfig,
    ) -> Compaction:
        """A pipeline's compaction settings, from its configuration's sections."""
        return cls(
            maintenance.settle,
            small_bytes(maintenance, limits),
            maintenance.min_small_files,
            limits.target_file_mb << 20,
            limits.row_group_rows,
            tuple(partition_columns(partitioning)),
            partitioning.timezone,
        )


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
    ref: TableRef,
    which: Location,
    partition_by: list[str],
    adds: list[dict[str, Any]],
    settings: Compaction,
    settled_before: datetime,
    only: dict[str, str] | None,
    token: str,
    last: int,
) -> list[Picked]:
    """The partitions of one Delta or Iceberg table to compact, with their bins.

    A file is picked when it is small and every row in it belongs to a batch the ledger
    holds (its `_batch`, or for the ledger `batch`, statistics say so: at most `last`);
    a partition when it is settled and holds at least `min_small_files` such files.

    Args:
        ref: The table's reference.
        which: Which of the pipeline's tables it is.
        partition_by: The table's partition columns.
        adds: Its current files, as Delta's flattened add actions show them (for
            Iceberg, `strata.maintenance._iceberg.table_files`).
        settings: What is merged, and into what.
        settled_before: Partitions (and an unpartitioned table's files) ended before
            this are settled.
        only: The data table's partition asked for (`--partition`), if any.
        token: This compaction's, in its merged files' names.
        last: The newest batch the ledger holds.
    """
    by_key: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for add in adds:
        key = tuple(str(add[f"partition.{c}"]) for c in partition_by)
        by_key.setdefault(key, []).append(add)
    sort_by = _SORT_KEYS["ledger" if which == "ledger" else "other"]
    picked = []
    for key, files in sorted(by_key.items()):
        values = dict(zip(partition_by, key, strict=True))
        if not _wanted(values, only, settled_before, settings.zone):
            continue
        mergeable = [
            f
            for f in files
            if f["size_bytes"] < settings.small_bytes
            and (newest := _newest_batch(f, which)) is not None
            and newest <= last
            # An unpartitioned table has no event hours: its newest files settle first.
            and (partition_by or _modified(f) <= settled_before)
        ]
        if len(mergeable) < settings.min_small_files:
            continue
        # Statistics of one column share a type across files; a missing one sorts last.
        mergeable.sort(
            key=lambda f: (
                tuple((f.get(f"min.{c}") is None, f.get(f"min.{c}")) for c in sort_by)
                + (f["path"],)
            )
        )
        directory = partition_path(partition_by, key)
        bins = _bins(ref, which, settings, mergeable, values, directory, token)
        if bins:
            picked.append(Picked(which, values, files, bins))
    return picked


def _newest_batch(add: dict[str, Any], which: Location) -> int | None:
    """The newest batch a file holds rows of: its statistics say, or a ledger file's name.

    A ledger file of one batch is written without statistics (`commit_ledger`).
    """
    newest = add.get("max.batch" if which == "ledger" else "max._batch")
    if newest is None and which == "ledger":
        return ledger_file_batch(add["path"])
    return None if newest is None else int(newest)


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
    ref: TableRef,
    which: Location,
    settings: Compaction,
    mergeable: list[dict[str, Any]],
    values: dict[str, str],
    directory: str,
    token: str,
) -> list[Bin]:
    """The bins a partition's mergeable files go into, merged files written to `directory`."""
    return [
        Bin(
            ref.uri,
            ref.options,
            [f["path"] for f in group],
            values,
            f"{directory}/part-c{token}-{number:04d}".lstrip("/"),
            _SORT_KEYS["ledger" if which == "ledger" else "other"],
            settings.target_bytes,
            settings.row_group_rows,
        )
        for number, group in enumerate(pack(mergeable, settings.target_bytes))
    ]


def plan_directory(
    ref: TableRef,
    settings: Compaction,
    settled_before: datetime,
    only: dict[str, str] | None,
    token: str,
    last: int,
) -> list[Picked]:
    """The partitions of a plain Parquet data table to compact, with their bins.

    The same rules as `plan_table`, with the batch read from each file's name: a batch's
    file is committed once the ledger holds the batch, a compaction's once its partition
    was moved to it.

    Args:
        ref: The data table's reference.
        settings: What is merged, and into what.
        settled_before: Partitions ended before this are settled.
        only: The partition asked for (`--partition`), if any.
        token: This compaction's, in its merged files' names.
        last: The newest batch the ledger holds.
    """
    fs, root = ref.filesystem()
    # The markers before the files, as `current_files` reads them.
    markers = read_markers(fs, root)
    listed = visible_files(fs, root)
    current = markers.current()
    by_partition: dict[str, list[TableFile]] = {}
    for f in listed:
        if f.directory == place(f.partition, current):
            by_partition.setdefault(f.partition, []).append(f)
    # After every generation the table shows, whatever this host's clock says: the
    # newest marker is the partition's directory in use.
    stamp = next_stamp(markers, listed)
    picked = []
    for name, found in sorted(by_partition.items()):
        values = dict(part.split("=", 1) for part in name.split("/") if part)
        wanted = _wanted(values, only, settled_before, settings.zone)
        if tuple(values) != settings.partition_by or not wanted:
            continue
        files: list[dict[str, Any]] = [
            {"path": f.path, "size_bytes": f.size} for f in sorted(found, key=_by_name)
        ]
        mergeable = [
            f for f in files if f["size_bytes"] < settings.small_bytes and stands(f["path"], last)
        ]
        if len(mergeable) < settings.min_small_files:
            continue
        directory = generation_dir(name, stamp)
        bins = _bins(ref, "table", settings, mergeable, values, directory, token)
        if bins:
            picked.append(Picked("table", values, files, bins, directory, stamp))
    return picked


def _by_name(f: TableFile) -> str:
    # Batch files are named by batch number first: name order is offset order.
    return f.path.rsplit("/", 1)[-1]


def _modified(add: dict[str, Any]) -> datetime:
    """When a file was written (its add action's `modification_time`, epoch ms)."""
    return datetime.fromtimestamp(add["modification_time"] / 1000, UTC)


def compact(
    places: Places,
    settings: Compaction,
    session: Callable[[], SparkSession],
    register: Callable[[], object] | None = None,
    partition: str | None = None,
    older_than: str | None = None,
    dry_run: bool = False,
) -> CompactionReport:
    """Compact a pipeline's tables: all four under Delta; plain Parquet's data table.

    Args:
        places: The pipeline's places.
        settings: What is merged, and into what (`Compaction.of`).
        session: Gives the Spark session the bins are merged on, called only when
            there is something to merge (tests pass a shared one).
        register: Points the metastore at the plain Parquet partitions moved (the
            pipeline's registration); None leaves that to the next run or
            `strata register`.
        partition: Only this partition of the data table (`dt=…[/hr=…]`).
        older_than: Settle time overriding `maintenance.settle`.
        dry_run: Report what would be merged; change nothing and start no JVM.

    Returns:
        What was merged, per partition.

    Raises:
        LockBusy: If a backfill, a replay, vacuum or another compaction is in flight; for
            plain Parquet, also if a run still holds the run lock after 10 minutes.
        MaintenanceError: If `partition` does not name the data table's columns.
    """
    from strata.store.lock import run_lock

    began = time.monotonic()
    report = CompactionReport(places.pipeline, dry_run)
    try:
        settle_ms = parse_duration_ms(older_than or settings.settle)
    except ValueError as exc:
        raise MaintenanceError(f"--older-than {older_than!r}: {exc}") from None
    settled_before = datetime.now(UTC) - timedelta(milliseconds=settle_ms)
    only = None if partition is None else parse_partition(partition, list(settings.partition_by))
    token = datetime.now(UTC).strftime("%Y%m%d%H%M%S") + uuid.uuid4().hex[:8]
    if dry_run:
        _plan_all(places, settings, settled_before, only, token, report)
        report.seconds = time.monotonic() - began
        return report
    # The lease's token starts above every fence the tables hold, whatever became of
    # the lease's folder (`strata.maintenance._fences`).
    floor = partial(held_fence, places, MAINTAINED)
    with run_lock(places, "maintenance", floor) as lock:
        picked = _plan_all(places, settings, settled_before, only, token, report)
        if picked:
            _rewrite_and_commit(places, picked, report, session, register, lock)
    report.seconds = time.monotonic() - began
    return report


def _plan_all(
    places: Places,
    settings: Compaction,
    settled_before: datetime,
    only: dict[str, str] | None,
    token: str,
    report: CompactionReport,
) -> list[Picked]:
    picked: list[Picked] = []
    last = committed_batch(places.ledger.uri, places.pipeline, places.options) or 0
    for which in MAINTAINED if only is None else ("table",):
        ref = places.table(which)
        if places.format == "parquet":
            skipped = _parquet_skip(places, which)
            if skipped:
                report.skipped[which] = skipped
                continue
            found = plan_directory(ref, settings, settled_before, only, token, last)
        else:
            files = _table_files(ref)
            if files is None:
                report.skipped[which] = "no table yet"
                continue
            partition_by, adds = files
            found = plan_table(
                ref, which, partition_by, adds, settings, settled_before, only, token, last
            )
        picked += found
        for p in found:
            merged = p.merged
            merged_bytes = sum(f["size_bytes"] for f in p.files if f["path"] in merged)
            estimate = -(-merged_bytes // settings.target_bytes)
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


def _table_files(ref: TableRef) -> tuple[list[str], list[dict[str, Any]]] | None:
    """A Delta or Iceberg table's partition columns and current files; None: no table."""
    if ref.format == "iceberg":
        found = iceberg.open_table(ref)
        if found is None:
            return None
        columns = [found.schema().find_column_name(f.source_id) for f in found.spec().fields]
        return [c for c in columns if c], _iceberg.table_files(ref, found)
    table = open_table(ref.uri, ref.options)
    if table is None:
        return None
    adds = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    return list(table.metadata().partition_columns), adds


def _parquet_skip(places: Places, which: Location) -> str | None:
    """Why a plain Parquet pipeline's table is not compacted, or None if it is."""
    if which != "table":
        # The ledger too: it is registered for SQL as a plain Parquet directory.
        return (
            "unpartitioned plain Parquet: its location is the table's own, which catalogs "
            "other than Strata's may hold (see docs/operations.md, Plain Parquet tables)"
        )
    if places.metastore is None:
        return (
            "plain Parquet without a metastore: engines that find partitions by directory "
            "would not see a compacted partition's new location; set metastore.uri"
        )
    return None


def _rewrite_and_commit(
    places: Places,
    picked: list[Picked],
    report: CompactionReport,
    session: Callable[[], SparkSession],
    register: Callable[[], object] | None,
    lock: RunLock,
) -> None:
    from strata.spark.session import run_each

    pipeline = places.pipeline
    jobs = [b for p in picked for b in p.bins]
    written = run_each(session(), rewrite_bin, jobs, f"{pipeline} compaction of {len(jobs)} bins")
    faults.reached(faults.AFTER_COMPACT_FILES)
    by_bin = {(job.uri, job.stem): out for job, out in zip(jobs, written, strict=True)}
    entries = {(e.table, e.partition): e for e in report.partitions}
    moved: dict[str, str] = {}
    if places.format == "parquet":
        began = time.monotonic()
        moved = move_partitions(places, picked, lock, register)
        logger.info(
            "%s: %s partitions moved in %.1fs", pipeline, len(moved), time.monotonic() - began
        )
    for p in picked:
        entry = entries[(p.table, p.name)]
        began = time.monotonic()
        outs = [by_bin[(b.uri, b.stem)] for b in p.bins]
        new = [f for files, _ in outs for f in files]
        old = p.merged
        ref = places.table(p.table)
        if places.format == "parquet":
            entry.outcome = moved[p.name]
        elif ref.format == "iceberg":
            entry.outcome = _iceberg.commit_partition(ref, pipeline, p, old, new, lock)
        else:
            entry.outcome = commit_partition(ref, pipeline, p, old, new, lock)
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
            pipeline,
            p.table,
            entry.partition or "(whole table)",
            entry.files_before,
            entry.files_after,
            entry.outcome,
        )
        faults.reached(faults.AFTER_COMPACT_COMMIT)


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
