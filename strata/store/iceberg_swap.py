"""Swapping an Iceberg table's files in one snapshot: a compaction's, a dropped batch's.

A maintenance run holding a lease records its fencing token in the table property
`strata.maintenance.<pipeline>` with each commit, and vacuum fences a table first with
a snapshot of no files carrying its own, higher token (`fence_maintenance`). The
fence moves the branch, so a compaction built on an earlier snapshot fails its
commit's requirement; on the table as it is now it sees the higher token and stops.
So a compaction paused past its lease never commits files a vacuum deleted. Each
fenced snapshot's summary records the token, what fenced and the run
(`strata.maintenance_fence`): a token equal to the one the table holds passes only for
the run that wrote it (`strata.store.fencing.Fence.admit`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from pyiceberg.conversions import to_bytes

from strata.store.fencing import Fence, FenceRecord
from strata.store.iceberg import (
    data_file,
    location,
    open_table,
    retry_commits,
    summary_properties,
)
from strata.store.parquet import WrittenFile

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table
    from pyiceberg.types import PrimitiveType

    from strata.store.places import TableRef

# The table property holding the fencing token of the newest maintenance run to commit.
_MAINTENANCE_PROPERTY = "strata.maintenance.{pipeline}"
# The snapshot summary key of a fenced maintenance commit: the token, what fenced, the run.
FENCE_INFO_KEY = "strata.maintenance_fence"


def only_batch(table: Table, data: DataFile, batch: int) -> bool:
    """Whether a data file holds rows of `batch` alone (its `_batch` bounds say so)."""
    column = table.schema().find_field("_batch")
    kind = cast("PrimitiveType", column.field_type)
    lows, highs = data.lower_bounds or {}, data.upper_bounds or {}
    low, high = lows.get(column.field_id), highs.get(column.field_id)
    return low is not None and high is not None and low == high == to_bytes(kind, batch)


def maintenance_token(table: Table, pipeline: str) -> int | None:
    """The fencing token of the newest maintenance run that committed to the table."""
    value = table.properties.get(_MAINTENANCE_PROPERTY.format(pipeline=pipeline))
    return None if value is None else int(value)


def fence_record(table: Table) -> FenceRecord | None:
    """What the table's newest fenced snapshot recorded (its token, what fenced, its run)."""
    for snapshot in reversed(table.snapshots()):
        text = None if snapshot.summary is None else snapshot.summary.get(FENCE_INFO_KEY)
        if text is not None:
            return FenceRecord.of(text, snapshot.timestamp_ms)
    return None


def _admit(table: Table, pipeline: str, fence: Fence) -> None:
    """Stop a maintenance run the table's fence outranks (`strata.store.fencing.Fence.admit`)."""
    stands = maintenance_token(table, pipeline)
    fence.admit(pipeline, _where(table), stands, lambda: fence_record(table))


def fence_maintenance(table: Table, pipeline: str, fence: Fence, what: str) -> None:
    """Commit a maintenance run's token to the table in a snapshot with no files: a fence.

    The snapshot moves the branch: a compaction built on an earlier snapshot fails its
    commit's requirement, and on the table as it is now sees the higher token and stops.
    So files a compaction paused past its lease wrote can be deleted: it will never
    commit them. The token is above every fence the table held when the lease was taken
    (`strata.store.lease`), so the fence is always this run's own, written now.

    Raises:
        LeaseLost: If the table holds a higher token, or this run's token written by
            another run.
        CommitFailedException: If concurrent commits beat the fence on every try.
    """
    key = _MAINTENANCE_PROPERTY.format(pipeline=pipeline)

    def attempt(current: Table) -> None:
        _admit(current, pipeline, fence)
        where = _where(current)
        if fence.wrote(where):
            return  # an attempt whose reply was lost landed after all
        note = {FENCE_INFO_KEY: json.dumps(fence.record(what))}
        with current.transaction() as tx:
            tx.set_properties({key: str(fence.token)})
            with tx.update_snapshot(snapshot_properties=note).fast_append():
                pass
        fence.landed(where)

    retry_commits(table, attempt)


def _where(table: Table) -> str:
    """The table as a fence's message names it, and as its holder remembers it."""
    return ".".join(table.name())


def replace_files(
    ref: TableRef,
    table: Table,
    chosen: Callable[[Table], list[DataFile]],
    added: list[WrittenFile],
    summary: Mapping[str, Any],
    fence: tuple[str, Fence] | None = None,
) -> int:
    """Swap files of the current snapshot for others, in one snapshot; how many went.

    Args:
        ref: The table.
        table: The table; it is reloaded before each try.
        chosen: The files to remove, chosen on the table as loaded for the try.
        added: Files to add in their place (a compaction's), relative to the root.
        summary: What the snapshot's summary records (a fenced commit's record among it).
        fence: `(pipeline, fence)` of a maintenance run holding a lease: the commit
            records the token, and is refused once a later run fenced the table.

    Returns:
        How many files were removed (0: nothing was committed).

    Raises:
        LeaseLost: If a later maintenance run fenced the table.
    """
    root = location(ref.uri).rstrip("/")

    def swap(current: Table) -> int:
        if fence is not None:
            _admit(current, *fence)
        doomed = chosen(current)
        if not doomed:
            return 0
        entries = [data_file(current, root, f) for f in added]
        with current.transaction() as tx:
            if fence is not None:
                pipeline, held = fence
                key = _MAINTENANCE_PROPERTY.format(pipeline=pipeline)
                tx.set_properties({key: str(held.token)})
            props = summary_properties(summary)
            with tx.update_snapshot(snapshot_properties=props).overwrite() as change:
                for gone in doomed:
                    change.delete_data_file(gone)
                for entry in entries:
                    change.append_data_file(entry)
        if fence is not None:
            fence[1].landed(_where(current))
        return len(doomed)

    return retry_commits(table, swap)


def remove_batch(ref: TableRef, batch: int, summary: Mapping[str, Any]) -> int:
    """Remove an ingest batch's own files (holding its rows alone); how many went."""
    table = open_table(ref)
    if table is None or table.current_snapshot() is None:
        return 0

    def own(current: Table) -> list[DataFile]:
        scan = current.scan(row_filter=f"_batch = {int(batch)}")
        return [t.file for t in scan.plan_files() if only_batch(current, t.file, batch)]

    return replace_files(ref, table, own, [], summary)
