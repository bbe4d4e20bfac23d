"""The data table's files as completeness sees them: each with its partition and batches.

Completeness asks which files hold rows of a batch, or of partitions due in an
interval of the watermark, and counts a batch's rows landed after completion; it never
needs the rows of other batches.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from strata.config import PartitioningConfig
from strata.schema.avro import partition_columns
from strata.store.delta import open_table
from strata.store.locations import current_files
from strata.store.parquet import file_batch, partition_path
from strata.store.places import TableRef


@dataclass(frozen=True)
class DataFile:
    """A data file of the table: its partition and the batches its rows may be of."""

    path: str
    partition: str
    low: int | None
    high: int | None


def table_files(ref: TableRef, partitioning: PartitioningConfig) -> list[DataFile]:
    """The data table's current files, each with its partition and batch bounds.

    Delta: from the log's add actions (partition values, `_batch` statistics). Plain
    Parquet: each partition's directory in use; a file's name carries its batch, and a
    compaction's file (rows of many batches) has no bounds.
    """
    columns = partition_columns(partitioning)
    if ref.format == "delta":
        table = open_table(ref.uri, ref.options)
        if table is None:
            return []
        adds = pa.table(table.get_add_actions(flatten=True))
        if adds.num_rows == 0:
            return []
        names = set(adds.column_names)
        values = [adds.column(f"partition.{c}").to_pylist() for c in columns]
        low = adds.column("min._batch").to_pylist() if "min._batch" in names else None
        high = adds.column("max._batch").to_pylist() if "max._batch" in names else None
        return [
            DataFile(
                path,
                partition_path(columns, [str(v[i]) for v in values]),
                None if low is None else low[i],
                None if high is None else high[i],
            )
            for i, path in enumerate(adds.column("path").to_pylist())
        ]
    fs, root = ref.filesystem()
    out = []
    for f in current_files(fs, root):
        batch = file_batch(f.path)
        out.append(DataFile(f.path, f.partition, batch, batch))
    return out


def late_rows(
    ref: TableRef,
    files: list[DataFile],
    since: dict[str, int],
    ingested: set[int],
    only: int | None = None,
) -> dict[str, int]:
    """Rows per partition that ingest batches landed after the batch completing it.

    Only files that can hold such rows are read, and only their `_batch` column.

    Args:
        ref: The data table.
        files: The data table's files (`_table_files`).
        since: Per partition, the batch that completed it.
        ingested: The ingest batches of the ledger (backfills and replays re-write
            committed offsets by an operator's decision and are reported by them).
        only: Count the rows of this batch only.

    Returns:
        Partitions with late rows, and how many.
    """
    fs, root = ref.filesystem()
    by_partition: dict[str, list[str]] = defaultdict(list)
    for f in files:
        after = since.get(f.partition)
        if after is None or (f.high is not None and f.high <= after):
            continue
        # A batch's rows are in files named by it: a file without bounds (a compaction's,
        # of rows of settled, older batches) is not read for one batch's count.
        if only is not None and (
            only <= after or f.low is None or f.high is None or not f.low <= only <= f.high
        ):
            continue
        by_partition[f.partition].append(f"{root}/{f.path}")
    counts = {}
    for partition, paths in sorted(by_partition.items()):
        batches = {only} if only is not None else ingested
        where = (ds.field("_batch") > since[partition]) & ds.field("_batch").isin(
            sorted(batches & ingested)
        )
        found = ds.dataset(paths, format="parquet", filesystem=fs).count_rows(filter=where)
        if found:
            counts[partition] = found
    return counts


def candidates(
    adds: pa.Table | None,
    columns: list[str],
    batch: int | None,
    after: datetime | None,
    until: datetime | None,
    held: set[str],
    lateness: timedelta = timedelta(0),
) -> list[DataFile]:
    """The data table's files that may hold rows of `batch`, or of partitions due (their
    end plus `lateness`) after `after` and by `until`, or held by a quality mark.

    Picked by the add actions' columns, without a Python step per file: the dates of
    partitions due in the interval lie within a day of its ends, in any zone.
    """
    if adds is None or adds.num_rows == 0:
        return []
    names = set(adds.column_names)
    if batch is not None:
        low = adds.column("min._batch") if "min._batch" in names else None
        high = adds.column("max._batch") if "max._batch" in names else None
        if low is None or high is None:
            pick = pa.repeat(pa.scalar(True), adds.num_rows)
        else:
            pick = pc.and_kleene(
                pc.fill_null(pc.less_equal(low, batch), True),
                pc.fill_null(pc.greater_equal(high, batch), True),
            )
    elif until is None:
        return []
    else:
        dt = adds.column("partition.dt")
        pick = pc.less_equal(dt, (until - lateness + timedelta(days=1)).date().isoformat())
        if after is not None:
            floor = (after - lateness - timedelta(days=1)).date().isoformat()
            pick = pc.and_kleene(pick, pc.greater_equal(dt, floor))
        pick = pc.fill_null(pick, False)
    chosen = adds.filter(pick)
    values = [chosen.column(f"partition.{c}").to_pylist() for c in columns]
    low_values = chosen.column("min._batch").to_pylist() if "min._batch" in names else None
    high_values = chosen.column("max._batch").to_pylist() if "max._batch" in names else None
    out = [
        DataFile(
            path,
            partition_path(columns, [str(v[i]) for v in values]),
            None if low_values is None else low_values[i],
            None if high_values is None else high_values[i],
        )
        for i, path in enumerate(chosen.column("path").to_pylist())
    ]
    if batch is None and held:
        out += [f for f in _held_files(adds, columns, held) if f not in out]
    return out


def _held_files(adds: pa.Table, columns: list[str], held: set[str]) -> list[DataFile]:
    """The files of the partitions a quality mark holds."""
    values = [adds.column(f"partition.{c}").to_pylist() for c in columns]
    paths = adds.column("path").to_pylist()
    out = []
    for i, path in enumerate(paths):
        partition = partition_path(columns, [str(v[i]) for v in values])
        if partition in held:
            out.append(DataFile(path, partition, None, None))
    return out
