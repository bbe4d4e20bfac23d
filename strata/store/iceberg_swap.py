"""Swapping an Iceberg table's files in one snapshot: a compaction's, a dropped batch's.

A maintenance run holding a lease records its fencing token in the table property
`strata.maintenance.<pipeline>` with each commit, and vacuum fences a table first with
a snapshot of no files carrying its own, higher token (`fence_maintenance`). The
fence moves the branch, so a compaction built on an earlier snapshot fails its
commit's requirement; on the table as it is now it sees the higher token and stops.
So a compaction paused past its lease never commits files a vacuum deleted.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from pyiceberg.conversions import to_bytes

from strata.errors import LeaseLost
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
# The snapshot summary key of a maintenance fence: the token, and what fenced.
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


def _check_token(table: Table, pipeline: str, token: int | None) -> None:
    """Stop a maintenance run whose lease a later one took over (its token is higher)."""
    stands = maintenance_token(table, pipeline)
    if token is not None and stands is not None and stands > token:
        raise LeaseLost(
            f"pipeline {pipeline}: this maintenance run lost its lease: a later one (fencing "
            f"token {stands}, this run's is {token}) fenced {table.name()}. Nothing more "
            "was committed by it; what it left is picked up by the next compaction, and its "
            "files are deleted by vacuum. Run the command again."
        )


def fence_maintenance(table: Table, pipeline: str, token: int, what: str) -> None:
    """Commit a maintenance run's token to the table in a snapshot with no files: a fence.

    The snapshot moves the branch: a compaction built on an earlier snapshot fails its
    commit's requirement, and on the table as it is now sees the higher token and stops.
    So files a compaction paused past its lease wrote can be deleted: it will never
    commit them.

    Raises:
        LeaseLost: If the table holds a higher token: a later maintenance run fenced it.
        CommitFailedException: If concurrent commits beat the fence on every try.
    """
    key = _MAINTENANCE_PROPERTY.format(pipeline=pipeline)

    def fence(current: Table) -> None:
        _check_token(current, pipeline, token)
        if maintenance_token(current, pipeline) == token:
            return  # an attempt whose reply was lost landed after all
        note = {FENCE_INFO_KEY: json.dumps({"token": token, "by": what})}
        with current.transaction() as tx:
            tx.set_properties({key: str(token)})
            with tx.update_snapshot(snapshot_properties=note).fast_append():
                pass

    retry_commits(table, fence)


def replace_files(
    ref: TableRef,
    table: Table,
    chosen: Callable[[Table], list[DataFile]],
    added: list[WrittenFile],
    summary: Mapping[str, Any],
    fence: tuple[str, int] | None = None,
) -> int:
    """Swap files of the current snapshot for others, in one snapshot; how many went.

    Args:
        ref: The table.
        table: The table; it is reloaded before each try.
        chosen: The files to remove, chosen on the table as loaded for the try.
        added: Files to add in their place (a compaction's), relative to the root.
        summary: What the snapshot's summary records.
        fence: `(pipeline, token)` of a maintenance run holding a lease: the commit
            records the token, and is refused once a later run fenced the table.

    Returns:
        How many files were removed (0: nothing was committed).

    Raises:
        LeaseLost: If a later maintenance run fenced the table.
    """
    root = location(ref.uri).rstrip("/")

    def swap(current: Table) -> int:
        if fence is not None:
            _check_token(current, *fence)
        doomed = chosen(current)
        if not doomed:
            return 0
        entries = [data_file(current, root, f) for f in added]
        with current.transaction() as tx:
            if fence is not None:
                pipeline, token = fence
                tx.set_properties({_MAINTENANCE_PROPERTY.format(pipeline=pipeline): str(token)})
            props = summary_properties(summary)
            with tx.update_snapshot(snapshot_properties=props).overwrite() as change:
                for gone in doomed:
                    change.delete_data_file(gone)
                for entry in entries:
                    change.append_data_file(entry)
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
