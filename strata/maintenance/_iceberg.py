"""Iceberg tables' maintenance: compaction's commit, expiring snapshots, deleting orphans.

- **Compaction** picks files as for Delta (`plan_table`, from each current file's
  manifest entry: its size, partition, `_batch` bounds and when its snapshot landed),
  merges them in Spark tasks, and swaps a partition's merged files for the new ones in
  one `overwrite` snapshot (`strata.store.iceberg_swap.replace_files`). Where the lock is
  a lease, the commit records the run's fencing token and is refused once a later run
  fenced the table.
- **Vacuum** deletes only files it can tell are this table's own, at a place holding no
  other table's metadata (`strata.maintenance._ownership`). It fences each table with
  its token first (a snapshot with no files, which fails the commit of any compaction
  built before it), then expires the snapshots older than
  `maintenance.vacuum_retention` (the current one always stays), then deletes the
  files under the table's location no snapshot left holds: a data file a snapshot of
  this table named (one a commit removed); by the same rule as for Delta, a data file
  of a batch the table holds, or a compaction's, which can never be committed again;
  and metadata files (manifests, manifest lists, old metadata) no snapshot or
  metadata log holds, once older than the retention (a commit in flight writes its own
  before it lands). Any other file (an unfinished batch's, one no snapshot of this
  table ever named) is left and listed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs
from pyiceberg.conversions import from_bytes

from strata import faults
from strata.errors import MetastoreError
from strata.maintenance.report import TableVacuum
from strata.store import iceberg, iceberg_entries, iceberg_swap
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

    summary: dict[str, Any] = {
        COMPACTION_KEY: {"partition": picked.name, "removed": len(old), "added": len(new)}
    }
    held = lock.fence
    if held is not None:
        summary[iceberg_swap.FENCE_INFO_KEY] = held.record("compaction")
    iceberg_swap.replace_files(
        ref, table, chosen, new, summary, None if held is None else (pipeline, held)
    )
    return left or "compacted"


def _tasks(table: Table) -> list[Any]:
    if table.current_snapshot() is None:
        return []
    return list(table.scan().plan_files())


def vacuum_table(
    ref: TableRef,
    table: Table | None,
    pipeline: str,
    retention: timedelta,
    ledger_batch: int,
    lock: RunLock | None,
    dry_run: bool,
) -> TableVacuum:
    """Fence the table, expire old snapshots, and delete the files no snapshot holds.

    Args:
        ref: The table.
        table: The table, opened; None where the catalog has none.
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
    if table is None:
        return TableVacuum(skipped="no table yet")
    fence = None if lock is None else lock.fence
    if fence is not None:
        # Before anything is listed: a file listed after the fence is one no compaction
        # holding an older token can still commit.
        iceberg_swap.fence_maintenance(table, pipeline, fence, "vacuum")
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
    # What every snapshot names, read before any expires: a data file one of them named
    # is this table's, whichever snapshot removed it.
    named = _named(table)
    if old and not dry_run:
        table.maintenance.expire_snapshots().by_ids(old).commit()
        table = table.refresh()
    kept = [n for sid, n in named.items() if sid not in old]
    held_data = {path for n in kept for path in n.data}
    held_meta = {table.metadata_location} | {e.metadata_file for e in table.metadata.metadata_log}
    held_meta |= {path for n in kept for path in n.metadata}
    ever_named = {path for n in named.values() for path in n.data}
    stands = iceberg.committed_batch(table, pipeline) or 0
    fs, root = ref.filesystem()
    base = iceberg.location(ref.uri).rstrip("/")
    figures = TableVacuum(snapshots_expired=len(old))
    doomed: list[str] = []
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
        if info.type != pafs.FileType.File:
            continue
        rel = info.path[len(root) :].lstrip("/")
        uri = f"{base}/{rel}"
        if uri in held_data or uri in held_meta:
            continue
        name = rel.rsplit("/", 1)[-1]
        batch = file_batch(name)
        if rel.startswith("metadata/"):
            # A commit in flight wrote it and has not landed yet, unless it is that old.
            # No other table's metadata is at this place (`_ownership`): it is this one's.
            if info.mtime is not None and info.mtime.timestamp() * 1000 < cutoff_ms:
                doomed.append(rel)
                figures.metadata_files += 1
            continue
        if uri in ever_named:
            # Named by a snapshot of this table's, and by none left: a commit removed it.
            figures.removed_files += 1
        elif (batch is not None and batch <= stands) or is_compaction_file(name):
            # A batch the table holds can never be committed again, and a compaction's
            # files can no longer be, past the fence: an attempt's that another attempt
            # beat, or a compaction's that was killed or lost its lease.
            figures.never_committed += 1
        else:
            # An unfinished batch's, or a file no snapshot of this table ever named.
            figures.unknown_left.append(rel)
            continue
        doomed.append(rel)
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


@dataclass
class _Named:
    """The files one snapshot names: its data files, its manifest list and manifests."""

    data: set[str] = field(default_factory=set)
    metadata: set[str] = field(default_factory=set)


def _named(table: Table) -> dict[int, _Named]:
    """Per snapshot of the table, the files it names (each manifest read once)."""
    read: dict[str, set[str]] = {}
    out: dict[int, _Named] = {}
    for snapshot in table.snapshots():
        named = out[snapshot.snapshot_id] = _Named()
        named.metadata.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            path = manifest.manifest_path
            named.metadata.add(path)
            if path not in read:
                entries = manifest.fetch_manifest_entry(table.io, discard_deleted=True)
                read[path] = {entry.data_file.file_path for entry in entries}
            named.data |= read[path]
    return out


def metadata_names(fs: pafs.FileSystem, root: str) -> list[str]:
    """The Iceberg metadata files at a place (`metadata/*.metadata.json`), relative to it."""
    selector = pafs.FileSelector(f"{root}/metadata", allow_not_found=True)
    return sorted(
        info.path[len(root) :].lstrip("/")
        for info in fs.get_file_info(selector)
        if info.type == pafs.FileType.File and info.base_name.endswith(".metadata.json")
    )


def foreign_metadata(ref: TableRef, table: Table) -> str | None:
    """Why the table's place holds another Iceberg table's metadata, in words; or None.

    The metadata files this table's metadata log lists are its own; any other is read
    for its `table-uuid`: the same as this table's (a failed commit's, or one the log
    let go) is this table's too.

    Args:
        ref: The table's reference (its place).
        table: The table the catalog names.
    """
    place = iceberg.location(ref.uri).rstrip("/")
    if iceberg.location(table.metadata.location).rstrip("/") != place:
        return (
            f"is not the place of the metastore's table `{'.'.join(table.name())}`, which "
            f"lives at {table.metadata.location}: another table took its name"
        )
    fs, root = ref.filesystem()
    own = {table.metadata_location} | {e.metadata_file for e in table.metadata.metadata_log}
    uuid = str(table.metadata.table_uuid)
    others: dict[str, list[str]] = {}
    for rel in metadata_names(fs, root):
        if f"{place}/{rel}" in own:
            continue
        theirs = _table_uuid(fs, f"{root}/{rel}")
        if theirs is not None and theirs != uuid:
            others.setdefault(theirs, []).append(rel)
    if not others:
        return None
    # Each other table by its uuid and its newest metadata file (names sort by version).
    shown = "; ".join(
        f"table uuid {theirs}: {files[-1]}" + (f" and {len(files) - 1} more" if files[1:] else "")
        for theirs, files in sorted(others.items())
    )
    try:
        names = iceberg_entries.named_elsewhere(ref)
    except MetastoreError:
        names = []
    known = f"; in the metastore as {', '.join(names)} now" if names else ""
    return (
        f"(Iceberg table `{'.'.join(table.name())}`, uuid {uuid}) also holds another Iceberg "
        f"table's metadata ({shown}){known}: a table renamed or dropped in the metastore "
        "keeps its files at its place"
    )


def _table_uuid(fs: pafs.FileSystem, path: str) -> str | None:
    """The `table-uuid` a metadata file records; None if it cannot be read as one."""
    try:
        with fs.open_input_stream(path) as stream:
            body = json.loads(stream.read())
    except (OSError, ValueError):
        return None
    found = body.get("table-uuid") if isinstance(body, dict) else None
    return None if found is None else str(found)


def data_sizes(table: Table) -> list[int]:
    """The current data files' sizes (for table health)."""
    return [t.file.file_size_in_bytes for t in _tasks(table)]
