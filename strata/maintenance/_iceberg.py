"""Iceberg tables' maintenance: compaction's commit, expiring snapshots, deleting orphans.

- **Compaction** picks files as for Delta (`plan_table`, from each current file's
  manifest entry: its size, partition, `_batch` bounds and when its snapshot landed),
  merges them in Spark tasks, and swaps a partition's merged files for the new ones in
  one `overwrite` snapshot (`strata.store.iceberg_swap.replace_files`). Where the lock is
  a lease, the commit records the run's fencing token and is refused once a later run
  fenced the table.
- **Vacuum** fences each table with its token first (a snapshot with no files, which
  fails the commit of any compaction built before it), then expires the snapshots
  older than `maintenance.vacuum_retention` (the current one always stays), then
  deletes the files under the table's location no snapshot left holds, by the same
  rule as for Delta: a data file of a batch the table holds, or a compaction's, can
  never be committed again; any other (an unfinished batch's) is left and counted.
  Metadata files (manifests, manifest lists, old metadata) no snapshot or metadata
  log holds go once older than the retention: a commit in flight writes its own
  before it lands.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs
from pyiceberg.conversions import from_bytes

from strata import faults
from strata.store import iceberg, iceberg_swap
from strata.store.parquet import WrittenFile, file_batch, is_compaction_file

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table
    from pyiceberg.types import PrimitiveType

    from strata.maintenance._bins import Picked
    from strata.store.lock import RunLock
    from strata.store.places import TableRef

COMPACTION_KEY = "strata.compaction"


def table_files(ref: TableRef, table: Table) -> list[dict[str, Any]]:
    """The current data files, each as compaction's planning reads a Delta add action.

    Keys: `path` (relative to the root), `size_bytes`, `modification_time` (epoch ms
    of the snapshot that added it), `partition.<column>`, `min._batch`, `max._batch`.
    """
    snapshot = table.current_snapshot()
    if snapshot is None:
        return []
    schema, spec = table.schema(), table.spec()
    names = [schema.find_column_name(f.source_id) for f in spec.fields]
    batch = schema.find_field("_batch") if "_batch" in {f.name for f in schema.fields} else None
    out = []
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            data = entry.data_file
            added = table.snapshot_by_id(entry.snapshot_id or snapshot.snapshot_id)
            row: dict[str, Any] = {
                "path": iceberg.relative(ref, data.file_path),
                "size_bytes": data.file_size_in_bytes,
                "modification_time": (added or snapshot).timestamp_ms,
            }
            for i, name in enumerate(names):
                row[f"partition.{name}"] = data.partition[i]
            if batch is not None:
                kind: PrimitiveType = batch.field_type  # type: ignore[assignment]
                for key, bounds in (("min", data.lower_bounds), ("max", data.upper_bounds)):
                    raw = (bounds or {}).get(batch.field_id)
                    row[f"{key}._batch"] = None if raw is None else from_bytes(kind, raw)
            out.append(row)
    return out


def commit_partition(
    ref: TableRef,
    pipeline: str,
    picked: Picked,
    old: set[str],
    new: list[WrittenFile],
    lock: RunLock,
) -> str:
    """Swap a partition's merged files for the new ones in one Iceberg snapshot.

    Returns:
        `compacted`, or why not: a file to be removed is no longer in the table.

    Raises:
        LeaseLost: If this compaction lost its lease, or a later maintenance run fenced
            the table.
    """
    table = iceberg.open_table(ref)
    if table is None:
        return "left: the table disappeared during compaction"
    left = ""

    def chosen(current: Table) -> list[DataFile]:
        nonlocal left
        files = {iceberg.relative(ref, t.file.file_path): t.file for t in _tasks(current)}
        if new and {f.path for f in new} <= files.keys():
            return []  # an attempt whose reply was lost landed after all
        if not old <= files.keys():
            left = "left: files to merge were removed meanwhile"
            return []
        # A compaction that lost its lease must not commit: vacuum may run by now.
        lock.check()
        faults.reached(faults.AFTER_COMPACT_CHECK)
        return [files[path] for path in sorted(old)]

    summary = {COMPACTION_KEY: {"partition": picked.name, "removed": len(old), "added": len(new)}}
    fence = None if lock.token is None else (pipeline, lock.token)
    iceberg_swap.replace_files(ref, table, chosen, new, summary, fence)
    return left or "compacted"


def _tasks(table: Table) -> list[Any]:
    if table.current_snapshot() is None:
        return []
    return list(table.scan().plan_files())


def vacuum_table(
    ref: TableRef,
    pipeline: str,
    retention: timedelta,
    ledger_batch: int,
    lock: RunLock | None,
    dry_run: bool,
) -> dict[str, Any]:
    """Fence the table, expire old snapshots, and delete the files no snapshot holds.

    Args:
        ref: The table.
        pipeline: The pipeline (whose batches and fence the table holds).
        retention: Snapshots older than this are expired, and unheld metadata files
            older than this deleted.
        ledger_batch: The newest batch the ledger holds: snapshots of later batches
            (unfinished ones) are kept.
        lock: The maintenance lock held; None for a dry run.
        dry_run: Count what would go; change nothing.

    Returns:
        Snapshots expired, files deleted (removed data files, never-committed files,
        metadata), and unheld files left.
    """
    table = iceberg.open_table(ref)
    if table is None:
        return {"skipped": "no table yet"}
    if lock is not None and lock.token is not None:
        # Before anything is listed: a file listed after the fence is one no compaction
        # holding an older token can still commit.
        iceberg_swap.fence_maintenance(table, pipeline, lock.token, "vacuum")
        table = table.refresh()
    cutoff_ms = int((datetime.now(UTC) - retention).timestamp() * 1000)
    current = table.current_snapshot()
    old = [
        s.snapshot_id
        for s in table.snapshots()
        if s.timestamp_ms < cutoff_ms
        and current is not None
        and s.snapshot_id != current.snapshot_id
        # What a batch the ledger does not hold yet recorded is read when it is resumed
        # or dropped (its ranges, its kind): its snapshots stay until then.
        and _batch_of(s.summary) <= ledger_batch
    ]
    if old and not dry_run:
        table.maintenance.expire_snapshots().by_ids(old).commit()
        table = table.refresh()
    held_data, held_meta = _held(table)
    stands = iceberg.committed_batch(table, pipeline) or 0
    fs, root = ref.filesystem()
    base = iceberg.location(ref.uri).rstrip("/")
    figures = {"snapshots_expired": len(old), "data_files_deleted": 0}
    figures |= {"metadata_files_deleted": 0, "unknown_left": 0}
    doomed: list[str] = []
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
        if info.type != pafs.FileType.File:
            continue
        rel = info.path[len(root) :].lstrip("/")
        if f"{base}/{rel}" in held_data or f"{base}/{rel}" in held_meta:
            continue
        name = rel.rsplit("/", 1)[-1]
        batch = file_batch(name)
        old_enough = info.mtime is not None and info.mtime.timestamp() * 1000 < cutoff_ms
        if rel.startswith("metadata/"):
            # A commit in flight wrote it and has not landed yet, unless it is that old.
            if old_enough:
                doomed.append(rel)
                figures["metadata_files_deleted"] += 1
            continue
        if (batch is not None and batch <= stands) or is_compaction_file(name):
            # A batch the table holds can never be committed again, and a compaction's
            # files can no longer be, past the fence: committed once and removed since,
            # or an attempt's that another attempt beat.
            doomed.append(rel)
        elif batch is None and old_enough:
            # Not Strata's name: pyiceberg's rewrite of a backfill's files, from a
            # commit that failed (or held once and expired).
            doomed.append(rel)
        else:
            figures["unknown_left"] += 1
            continue
        figures["data_files_deleted"] += 1
    if not dry_run:
        for rel in doomed:
            if lock is not None:
                # A vacuum that lost its lease must stop: a compaction may hold it now,
                # with files written and not yet committed.
                lock.check()
            fs.delete_file(f"{root}/{rel}")
    return figures


def _batch_of(summary: Any) -> int:  # noqa: ANN401 - pyiceberg's Summary, or None
    """The batch a snapshot's summary records, or 0."""
    value = None if summary is None else summary.get(iceberg.SUMMARY_BATCH)
    return 0 if value is None else int(value)


def _held(table: Table) -> tuple[set[str], set[str]]:
    """The data files and metadata files the table's snapshots and metadata log hold."""
    data: set[str] = set()
    meta: set[str] = {table.metadata_location}
    meta |= {entry.metadata_file for entry in table.metadata.metadata_log}
    for snapshot in table.snapshots():
        meta.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            meta.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                data.add(entry.data_file.file_path)
    return data, meta


def data_sizes(table: Table) -> list[int]:
    """The current data files' sizes (for table health)."""
    return [t.file.file_size_in_bytes for t in _tasks(table)]
