"""Reading a pipeline's tables, Delta, Iceberg or plain Parquet: the one way readers open them.

Run, backfill, replay, quality and the summary page all read back what a batch wrote:
to reconcile it, to check it, to count what landed where. They open a table through
`TableRef` (`strata.store.places`), which knows the table's location, its format and
the storage options, so
the decision by format is made here once. Writing and committing stay with
`strata.batch.write` and `strata.store.delta`.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from functools import partial
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from strata.store.delta import batch_metadata, commit_metadata, open_table, range_filter
from strata.store.files import filesystem
from strata.store.locations import current_files
from strata.store.places import TableRef

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyiceberg.table import Table as IcebergTable

    from strata.store.ranges import OffsetRange

Counts = dict[tuple[str, int], int]
"""Rows per (topic, partition)."""


def dataset(
    ref: TableRef,
    schema: pa.Schema | None = None,
    table: DeltaTable | IcebergTable | None = None,
) -> ds.Dataset | None:
    """The table's current files as one Arrow dataset, or None if there is no table yet.

    Args:
        ref: The table.
        schema: For plain Parquet, the schema to read with; files that do not match it
            (a stray file in the directory) are left out rather than failing the read.
        table: For Delta or Iceberg, the table opened already, at the snapshot to
            read; without, it is opened.

    Returns:
        The dataset: for Delta and Iceberg, the files of the current snapshot; for Parquet, the
        data files of each partition's directory in use, with `dt`/`hr` from the path
        (None while there is none).
    """
    if ref.format == "iceberg":
        iceberg = _iceberg()
        return iceberg.arrow_dataset(ref, cast("IcebergTable | None", table))
    if ref.format == "delta":
        if table is None:
            table = open_table(ref.uri, ref.options)
        return None if table is None else cast("DeltaTable", table).to_pyarrow_dataset()
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


def _iceberg() -> ModuleType:
    """`strata.store.iceberg`, imported where an Iceberg table is read.

    The Spark tasks import this module to count their files, and the executors'
    environment (`make dist`) has no pyiceberg: only the driver commits and reads
    Iceberg tables.
    """
    from strata.store import iceberg

    return iceberg


def batch_record(
    ref: TableRef,
    pipeline: str,
    batch: int,
    key: str,
    table: DeltaTable | IcebergTable | None = None,
) -> Any:  # noqa: ANN401 - JSON as recorded
    """What a batch's commit to a Delta or Iceberg table recorded under `key`, or None.

    Args:
        ref: The table.
        pipeline: Whose batch.
        batch: The batch number.
        key: The commit info's (Delta) or snapshot summary's (Iceberg) key.
        table: The table opened already; without, it is opened.
    """
    if ref.format == "iceberg":
        iceberg = _iceberg()
        found = cast("IcebergTable | None", table) or iceberg.open_table(ref)
        return None if found is None else iceberg.snapshot_summary(found, pipeline, batch, key)
    if table is None:
        return batch_metadata(ref.uri, batch, ref.options, key)
    return commit_metadata(cast("DeltaTable", table), batch, key)


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


def batch_counts(
    ref: TableRef, batch: int, table: DeltaTable | IcebergTable | None = None
) -> Counts:
    """Rows of one batch in the table, per (topic, partition).

    Of a Delta table, only the files whose `_batch` statistics can hold the batch are
    read (a file without them is read too); of plain Parquet, each partition's
    directory in use. Scanning the whole table as one dataset kept every file's
    metadata in memory: a batch of 10,000 files took 1.3 GB to count.

    Args:
        ref: The table.
        batch: The batch number.
        table: For Delta or Iceberg, the table opened already, at the snapshot to
            count; without, it is opened.
    """
    fs, root = filesystem(ref.uri, ref.options)
    if ref.format == "iceberg":
        iceberg = _iceberg()
        found = cast("IcebergTable | None", table) or iceberg.open_table(ref)
        if found is None:
            return {}
        paths = [f"{root}/{iceberg.relative(ref, f)}" for f in iceberg.batch_files(found, batch)]
        return _counted_files(fs, paths, batch)
    if ref.format != "delta":
        return _counted_files(fs, [f"{root}/{f.path}" for f in current_files(fs, root)], batch)
    if table is None:
        table = open_table(ref.uri, ref.options)
    if table is None:
        return {}
    adds = pa.table(cast("DeltaTable", table).get_add_actions(flatten=True))
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
    return _counted_files(fs, [f"{root}/{p}" for p in paths.to_pylist()], batch)


def range_counts(
    ref: TableRef, ranges: list[OffsetRange], table: DeltaTable | IcebergTable | None = None
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
    return _counted_files(fs, [f"{root}/{p}" for p in paths], batch)


# Files read at once: each file's footer and unsure rows stay in memory until its group is done.
_FILES_AT_ONCE = 256
# Rows counted at once: two narrow columns, a few tens of MB at most.
_ROWS_AT_ONCE = 1_000_000

_FileCounts = tuple[Counts, pa.Table | None]
"""A file's rows counted from its footer, and the rows it did not pin, if any."""


def _counted_files(fs: pafs.FileSystem, paths: list[str], batch: int | None) -> Counts:
    """Rows per (topic, partition) of these Parquet files; of one batch only if given.

    Each file's footer is read, and each row group whose statistics pin its `_topic` and
    `_partition` to one value (and its `_batch` to the batch, or away from it) is
    counted from the footer's row count; only the other row groups' columns are read.
    A missing or unreadable file raises, as reading its columns did.

    Files are read one after another through `pq.ParquetFile`, not as a dataset: a
    dataset's scan cost about 0.4 ms of CPU a small file, this about 0.2 ms, and a batch
    over thousands of event hours writes thousands of small files. On an object store,
    where each read waits on a request, `pa.io_thread_count()` files are read at once.
    Memory stays flat in the files' number and size: `_FILES_AT_ONCE` files at a time,
    and their unsure rows counted a million at a time.
    """
    counts: Counter[tuple[str, int]] = Counter()
    # The coordinates' column indices of the last file read: files of one writer share them.
    known: list[dict[str, int]] = [{}]
    local = isinstance(fs, pafs.LocalFileSystem)
    # A file's column chunks fetched together, in the background: what an object store's
    # requests need; on a local disk, only a thread's hand-off more per file.
    read = partial(_file_counts, fs, batch=batch, known=known, pre_buffer=not local)
    held: list[pa.Table] = []
    rows_held = 0
    with ExitStack() as stack:
        # Reading a file makes a few hundred short-lived objects, none in a cycle: in a
        # driver holding a batch's thousands of file descriptions, they set off full
        # collections that took as long as the reading (about 1 s over 10,000 files).
        stack.enter_context(collector_paused())
        if local:
            each: Callable[[Callable[[str], _FileCounts], list[str]], Iterable[_FileCounts]] = map
        else:
            each = stack.enter_context(ThreadPoolExecutor(pa.io_thread_count())).map
        for at in range(0, len(paths), _FILES_AT_ONCE):
            for pinned, rows in each(read, paths[at : at + _FILES_AT_ONCE]):
                counts.update(pinned)
                if rows is not None and rows.num_rows:
                    held.append(rows)
                    rows_held += rows.num_rows
                # Grouped per million rows, not per file: a compute call per small file
                # cost more than reading it.
                if rows_held >= _ROWS_AT_ONCE:
                    counts.update(_counted_rows(held))
                    held, rows_held = [], 0
    if held:
        counts.update(_counted_rows(held))
    return dict(counts)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block (if it was running).

    For blocks that make many short-lived objects none of which is in a cycle (a read's
    messages, a read-back's footers): the collector would walk every object of the
    process again and again and find nothing to free.
    """
    running = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if running:
            gc.enable()


def _counted_rows(held: list[pa.Table]) -> Counts:
    """Rows per (topic, partition) of files' rows their footers did not pin."""
    # One chunk, not one per file: grouping thousands of chunks cost more.
    return count_by_partition(pa.concat_tables(held).combine_chunks())


def _file_counts(
    fs: pafs.FileSystem,
    path: str,
    batch: int | None,
    known: list[dict[str, int]],
    pre_buffer: bool,
) -> _FileCounts:
    """One file's rows per (topic, partition) that its footer pins, and its other rows.

    Args:
        fs: The filesystem.
        path: The file.
        batch: Count only this batch's rows; all rows if None.
        known: One slot: the coordinates' column indices of a file read before.
        pre_buffer: Whether the columns read are fetched ahead, together.

    Returns:
        The counts from the footer, and the `_topic` and `_partition` of the batch's rows
        (every row, without a batch) in row groups it does not pin; None if it pins all.
    """
    with fs.open_input_file(path) as source:
        parquet = pq.ParquetFile(source, pre_buffer=pre_buffer)
        footer = parquet.metadata
        known[0] = at = _coordinate_columns(footer, known[0])
        pinned, unsure, mixed = _footer_counts(footer, at, batch)
        if not unsure:
            return pinned, None
        # `_batch` is read only where a row group's statistics leave some of its rows'
        # batch open: the usual row group unsure of its partition is all of the batch.
        columns = ["_topic", "_partition"] + (["_batch"] if mixed else [])
        rows = parquet.read_row_groups(unsure, columns=columns, use_threads=False)
    if mixed:
        rows = rows.filter(pc.equal(rows.column("_batch"), batch)).drop_columns(["_batch"])
    return pinned, rows


def _footer_counts(
    footer: pq.FileMetaData, at: dict[str, int], batch: int | None
) -> tuple[Counts, list[int], bool]:
    """Rows per (topic, partition) of the row groups a footer's statistics pin.

    A row group's statistics pin a column when their bounds are equal and it holds no
    null: every row then holds that very value, whatever writer wrote the file.

    Args:
        footer: The file's footer.
        at: The column index of each of the coordinates the file holds.
        batch: Count only this batch's rows; all rows if None.

    Returns:
        The counts; the row groups whose rows must be read to be counted; and whether
        any of those holds rows of other batches (or of none) beside the batch's.
    """
    counts: dict[tuple[str, int], int] = {}
    unsure: list[int] = []
    mixed = False
    for g in range(footer.num_row_groups):
        group = footer.row_group(g)
        rows = group.num_rows
        if rows == 0:
            continue
        if batch is not None:
            held = _batch_rows(group, at.get("_batch"), batch)
            if held == 0:
                continue
            if held is None:
                unsure.append(g)
                mixed = True
                continue
        topic = _pinned(group, at.get("_topic"))
        partition = _pinned(group, at.get("_partition"))
        if topic is None or partition is None:
            unsure.append(g)
            continue
        key = (topic, partition)
        counts[key] = counts.get(key, 0) + rows
    return counts, unsure, mixed


_COORDINATES = ("_topic", "_partition", "_batch")


def _coordinate_columns(footer: pq.FileMetaData, known: dict[str, int]) -> dict[str, int]:
    """The footer's column index of each of `_topic`, `_partition` and `_batch` it holds.

    Args:
        footer: The file's footer.
        known: Indices found in another file: kept if this file has those columns there
            (three looks, against one per column of the file).
    """
    schema = footer.schema
    columns = footer.num_columns
    if len(known) == len(_COORDINATES):
        for path, i in known.items():
            if i >= columns or schema.column(i).path != path:
                break
        else:
            return known
    return {
        path: i for i in range(columns) for path in [schema.column(i).path] if path in _COORDINATES
    }


def _pinned(group: pq.RowGroupMetaData, column: int | None) -> Any:  # noqa: ANN401
    """The one value a row group's column holds by its statistics; None if not known."""
    if column is None:
        return None
    stats = group.column(column).statistics
    if stats is None or not stats.has_null_count or stats.null_count or not stats.has_min_max:
        return None
    low = stats.min
    return low if low == stats.max else None


def _batch_rows(group: pq.RowGroupMetaData, column: int | None, batch: int) -> int | None:
    """Rows of a row group in the batch by its `_batch` statistics: all, none, or None."""
    if column is None:
        return None
    stats = group.column(column).statistics
    if stats is None or not stats.has_null_count:
        return None
    if stats.null_count == group.num_rows:
        return 0  # no batch at all
    if not stats.has_min_max:
        return None
    low, high = stats.min, stats.max
    if low > batch or high < batch:
        return 0
    if low == high == batch and stats.null_count == 0:
        return int(group.num_rows)
    return None
