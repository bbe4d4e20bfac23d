"""Reading a pipeline's tables, Delta or plain Parquet: the one way every reader opens them.

Run, backfill, replay, quality and the summary page all read back what a batch wrote:
to reconcile it, to check it, to count what landed where. They open a table through
`TableRef` (`strata.store.places`), which knows the table's location, its format and
the storage options, so
the Delta-or-Parquet decision is made here once. Writing and committing stay with
`strata.batch.write` and `strata.store.delta`.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from strata.store.delta import open_table, range_filter
from strata.store.files import filesystem
from strata.store.locations import current_files
from strata.store.places import TableRef

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from strata.store.ranges import OffsetRange

Counts = dict[tuple[str, int], int]
"""Rows per (topic, partition)."""


def dataset(
    ref: TableRef, schema: pa.Schema | None = None, table: DeltaTable | None = None
) -> ds.Dataset | None:
    """The table's current files as one Arrow dataset, or None if there is no table yet.

    Args:
        ref: The table.
        schema: For plain Parquet, the schema to read with; files that do not match it
            (a stray file in the directory) are left out rather than failing the read.
        table: For Delta, the table opened already, at the snapshot to read; without,
            it is opened.

    Returns:
        The dataset: for Delta, the files of the current snapshot; for Parquet, the
        data files of each partition's directory in use, with `dt`/`hr` from the path
        (None while there is none).
    """
    if ref.format == "delta":
        if table is None:
            table = open_table(ref.uri, ref.options)
        return None if table is None else table.to_pyarrow_dataset()
    fs, root = filesystem(ref.uri, ref.options)
    # Each partition's files are those of its directory in use (see strata.store.locations).
    paths = [f"{root}/{f.path}" for f in current_files(fs, root)]
    if not paths:
        # No file, no schema: read as a table not written yet.
        return None
    return ds.dataset(
        paths,
        filesystem=fs,
        format="parquet",
        partitioning="hive",
        partition_base_dir=root,
        schema=schema,
        exclude_invalid_files=schema is not None,
    )


def read(ref: TableRef, columns: list[str], where: ds.Expression | None = None) -> pa.Table:
    """Rows of the table, the columns asked for; no rows if there is no table yet.

    Args:
        ref: The table.
        columns: The columns to read.
        where: Which rows.

    Returns:
        The rows. Without a table, an empty table of those columns: the coordinates
        with their own types, any other column as a string.
    """
    found = dataset(ref)
    if found is None:
        return pa.schema(
            [(c, _COORDINATE_TYPES.get(c, pa.string())) for c in columns]
        ).empty_table()
    return found.to_table(columns=columns, filter=where)


_COORDINATE_TYPES = {"_partition": pa.int32(), "_offset": pa.int64(), "_batch": pa.int64()}


def count_by_partition(data: pa.Table) -> Counts:
    """Rows per (topic, partition) of a table holding `_topic` and `_partition`."""
    if data.num_rows == 0:
        return {}
    grouped = data.group_by(["_topic", "_partition"]).aggregate([("_partition", "count")])
    return {
        (t, p): c
        for t, p, c in zip(
            grouped.column("_topic").to_pylist(),
            grouped.column("_partition").to_pylist(),
            grouped.column("_partition_count").to_pylist(),
            strict=True,
        )
    }


def batch_counts(ref: TableRef, batch: int, table: DeltaTable | None = None) -> Counts:
    """Rows of one batch in the table, per (topic, partition).

    Of a Delta table, only the files whose `_batch` statistics can hold the batch are
    read (a file without them is read too); of plain Parquet, each partition's
    directory in use. Scanning the whole table as one dataset kept every file's
    metadata in memory: a batch of 10,000 files took 1.3 GB to count.

    Args:
        ref: The table.
        batch: The batch number.
        table: For Delta, the table opened already, at the snapshot to count; without,
            it is opened.
    """
    where = ds.field("_batch") == batch
    fs, root = filesystem(ref.uri, ref.options)
    if ref.format != "delta":
        return _counted_files(fs, [f"{root}/{f.path}" for f in current_files(fs, root)], where)
    if table is None:
        table = open_table(ref.uri, ref.options)
    if table is None:
        return {}
    adds = pa.table(table.get_add_actions(flatten=True))
    if adds.num_rows == 0:
        return {}
    paths = adds.column("path")
    if {"min._batch", "max._batch"} <= set(adds.column_names):
        low, high = adds.column("min._batch"), adds.column("max._batch")
        may_hold = pc.and_kleene(
            pc.fill_null(pc.less_equal(low, batch), True),
            pc.fill_null(pc.greater_equal(high, batch), True),
        )
        paths = pc.filter(paths, may_hold)
    return _counted_files(fs, [f"{root}/{p}" for p in paths.to_pylist()], where)


def range_counts(
    ref: TableRef, ranges: list[OffsetRange], table: DeltaTable | None = None
) -> Counts:
    """Rows of the table within each offset range, of any batch, per (topic, partition).

    Args:
        ref: The table.
        ranges: The ranges.
        table: For Delta, the table opened already, at the snapshot to count; without,
            it is opened.
    """
    found = dataset(ref, table=table)
    if found is None:
        return {}
    return {(r.topic, r.partition): found.count_rows(filter=range_filter(r)) for r in ranges}


def file_counts(ref: TableRef, paths: list[str], batch: int | None = None) -> Counts:
    """Rows of the given data files (relative to the table), per (topic, partition).

    Args:
        ref: The table.
        paths: The files, relative to the table's root.
        batch: Count only the rows of this batch (by their `_batch`); all rows if None.
    """
    fs, root = filesystem(ref.uri, ref.options)
    where = None if batch is None else ds.field("_batch") == batch
    return _counted_files(fs, [f"{root}/{p}" for p in paths], where)


# Files read at once: each open file's metadata stays in memory until its group is done.
_FILES_AT_ONCE = 256
# Rows counted at once: two narrow columns, a few tens of MB at most.
_ROWS_AT_ONCE = 1_000_000


def _counted_files(fs: pafs.FileSystem, paths: list[str], where: ds.Expression | None) -> Counts:
    """Rows per (topic, partition) of these Parquet files, where `where` holds.

    Read `_FILES_AT_ONCE` files at a time and a record batch at a time, so memory stays
    flat in the files' number and size.
    """
    counts: Counter[tuple[str, int]] = Counter()
    for at in range(0, len(paths), _FILES_AT_ONCE):
        files = ds.dataset(paths[at : at + _FILES_AT_ONCE], format="parquet", filesystem=fs)
        # Grouped per group of files (or million rows), not per record batch: a batch
        # over thousands of event hours has thousands of small files, a call each.
        held: list[pa.RecordBatch] = []
        rows_held = 0
        for rows in files.to_batches(columns=["_topic", "_partition"], filter=where):
            if rows.num_rows:
                held.append(rows)
                rows_held += rows.num_rows
            if rows_held >= _ROWS_AT_ONCE:
                counts.update(count_by_partition(pa.Table.from_batches(held)))
                held, rows_held = [], 0
        if held:
            counts.update(count_by_partition(pa.Table.from_batches(held)))
    return dict(counts)
