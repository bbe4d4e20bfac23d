"""Write Parquet files with deterministic names and deterministic content.

A file's name is fixed by (batch, task, partition values, file number), and its
row groups are cut at a fixed row count, so a retried task or a re-run batch writes
the same files byte for byte and overwrites instead of duplicating. Files appear
whole: locally through a rename, on object stores through the atomic PUT.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

# Longer string bounds are left out of the statistics rather than bloat the log.
_MAX_STAT_STRING = 64


@dataclass(frozen=True)
class WrittenFile:
    """A finished data file, as a Delta add action needs it.

    Attributes:
        path: Path relative to the table root.
        size: Bytes.
        partition_values: Partition column values.
        rows: Rows in the file.
        stats: Delta statistics JSON.
    """

    path: str
    size: int
    partition_values: dict[str, str]
    rows: int
    stats: str


def file_name(batch: int, tag: str, number: int) -> str:
    """The deterministic name of a task's file in one partition directory.

    Args:
        batch: Batch number.
        tag: The writing task: `t00003` for split 3, `r00001` for shuffle reducer 1.
        number: The file's number within the task and partition.
    """
    return f"part-b{batch:010d}-{tag}-f{number:03d}.snappy.parquet"


class _OpenFile:
    def __init__(
        self,
        fs: pafs.FileSystem,
        root: str,
        rel: str,
        schema: pa.Schema,
        partition_values: dict[str, str],
    ) -> None:
        self.fs, self.root, self.rel = fs, root, rel
        self.partition_values = partition_values
        final = f"{root}/{rel}"
        self.local = isinstance(fs, pafs.LocalFileSystem)
        if self.local:
            # Object stores have no directories; creating them would leave marker objects.
            fs.create_dir(final.rsplit("/", 1)[0], recursive=True)
        # Readers of plain Parquet directories (Hive, Trino, Spark) skip dot-files, so a
        # crashed attempt's half-written file is never read.
        directory, _, base = final.rpartition("/")
        hidden = f"{directory}/.{base}.tmp-{uuid.uuid4().hex}"
        self.target = hidden if self.local else final
        self.stream = fs.open_output_stream(self.target)
        self.writer = pq.ParquetWriter(self.stream, schema, compression="snappy")
        self.schema = schema
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        self.writer.write_table(table, row_group_size=table.num_rows)
        self.rows += table.num_rows

    @property
    def bytes_written(self) -> int:
        return int(self.stream.tell())

    def close(self) -> WrittenFile:
        self.writer.close()
        self.stream.close()
        footer = self.writer.writer.metadata
        final = f"{self.root}/{self.rel}"
        if self.local:
            self.fs.move(self.target, final)
        size = self.fs.get_file_info(final).size
        stats = delta_stats(footer, self.schema, self.rows)
        return WrittenFile(
            self.rel, int(size or 0), self.partition_values, self.rows, json.dumps(stats)
        )


def delta_stats(footer: Any, schema: pa.Schema, rows: int) -> dict[str, Any]:  # noqa: ANN401
    """Delta file statistics from a Parquet footer, which the writer computed anyway.

    Every column gets a null count, and min/max where they are exact and small. A
    column missing from a file's statistics is not safe: delta-rs's reader then
    builds `col >= null` for it, and any filter on that column finds no rows.

    Args:
        footer: The file's `pyarrow.parquet.FileMetaData`.
        schema: The file's Arrow schema.
        rows: Rows in the file.

    Returns:
        `numRecords`, `minValues`, `maxValues`, `nullCount`.
    """
    leaves: dict[str, list[Any]] = {}
    for g in range(footer.num_row_groups):
        group = footer.row_group(g)
        for i in range(group.num_columns):
            column = group.column(i)
            stats = column.statistics
            entry = leaves.setdefault(column.path_in_schema, [None, None, 0, True])
            if stats is None or not stats.has_null_count:
                entry[2], entry[3] = None, False
                continue
            if entry[2] is not None:
                entry[2] += stats.null_count
            if stats.has_min_max:
                entry[0] = stats.min if entry[0] is None else min(entry[0], stats.min)
                entry[1] = stats.max if entry[1] is None else max(entry[1], stats.max)
            elif stats.null_count != group.num_rows:
                entry[3] = False
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, Any] = {}
    for field in schema:
        _field_stats(field, field.name, leaves, mins, maxs, nulls)
    return {"numRecords": rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}


def _field_stats(
    field: pa.Field,
    path: str,
    leaves: dict[str, list[Any]],
    mins: dict[str, Any],
    maxs: dict[str, Any],
    nulls: dict[str, Any],
) -> None:
    kind = field.type
    if pa.types.is_struct(kind):
        child_min: dict[str, Any] = {}
        child_max: dict[str, Any] = {}
        child_nulls: dict[str, Any] = {}
        for i in range(kind.num_fields):
            child = kind.field(i)
            _field_stats(child, f"{path}.{child.name}", leaves, child_min, child_max, child_nulls)
        for target, values in ((mins, child_min), (maxs, child_max), (nulls, child_nulls)):
            if values:
                target[field.name] = values
        return
    leaf = leaves.get(path)
    if leaf is None:
        return  # lists and maps: Delta keeps no statistics for them
    low, high, null_count, exact = leaf
    if null_count is None:
        return
    nulls[field.name] = null_count
    if not exact or low is None:
        return
    bounds = _stat_bounds(kind, low, high)
    if bounds is not None:
        mins[field.name], maxs[field.name] = bounds


def _stat_bounds(kind: pa.DataType, low: Any, high: Any) -> tuple[Any, Any] | None:  # noqa: ANN401
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return low, high
    if pa.types.is_string(kind):
        if len(low) > _MAX_STAT_STRING or len(high) > _MAX_STAT_STRING:
            return None
        return low, high
    if pa.types.is_timestamp(kind):
        # Delta keeps milliseconds: round the lower bound down and the upper one up.
        floor = low.replace(microsecond=low.microsecond // 1000 * 1000)
        ceil_us = -(-high.microsecond // 1000) * 1000
        ceil = high.replace(microsecond=0) + timedelta(microseconds=ceil_us)
        return _iso_ms(floor), _iso_ms(ceil)
    if pa.types.is_date(kind):
        return low.isoformat(), high.isoformat()
    return None


def _iso_ms(moment: datetime) -> str:
    utc = moment.astimezone(UTC) if moment.tzinfo else moment
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def write_file(
    fs: pafs.FileSystem, root: str, rel: str, table: pa.Table, partition_values: dict[str, str]
) -> WrittenFile:
    """Write one whole file (atomically, with its statistics) and describe it."""
    out = _OpenFile(fs, root, rel, table.schema, partition_values)
    out.write(table)
    return out.close()


class PartitionedWriter:
    """Writes one task's rows of one table, a file (or a few) per partition value.

    Rows are buffered per partition and written in row groups of exactly
    `row_group_rows` rows (the last one shorter); a file is closed and the next one
    begun once it passes `target_bytes`.
    """

    def __init__(
        self,
        fs: pafs.FileSystem,
        root: str,
        schema: pa.Schema,
        partition_by: list[str],
        batch: int,
        tag: str,
        target_bytes: int,
        row_group_rows: int,
        buffer_bytes: int = 64 << 20,
    ) -> None:
        """Prepare a writer.

        Args:
            fs: Filesystem of the table.
            root: Table root path inside `fs`.
            schema: Full table schema, partition columns included.
            partition_by: Partition columns (kept out of the files, as Delta does).
            batch: Batch number, for file names.
            tag: The writing task, for file names (see `file_name`).
            target_bytes: Size at which a file is closed.
            row_group_rows: Rows per row group.
            buffer_bytes: Memory for rows not yet written, over all partitions. Past
                it, the largest buffer is written as a shorter row group, so memory
                stays flat however many event hours a batch touches.
        """
        self.fs, self.root = fs, root
        self.partition_by = partition_by
        self.file_schema = pa.schema([f for f in schema if f.name not in partition_by])
        self.batch, self.tag = batch, tag
        self.target_bytes, self.row_group_rows = target_bytes, row_group_rows
        self.buffer_bytes = buffer_bytes
        self._held: dict[tuple[str, ...], int] = {}
        self._buffers: dict[tuple[str, ...], list[pa.Table]] = {}
        self._buffered: dict[tuple[str, ...], int] = {}
        self._open: dict[tuple[str, ...], _OpenFile] = {}
        self._numbers: dict[tuple[str, ...], int] = {}
        self.files: list[WrittenFile] = []

    def write(self, table: pa.Table) -> None:
        """Buffer rows, writing every full row group.

        Args:
            table: Rows in the table's schema, partition columns included.
        """
        if table.num_rows == 0:
            return
        for key, part in split_by(table, self.partition_by):
            body = part.select(self.file_schema.names).cast(self.file_schema)
            self._buffers.setdefault(key, []).append(body)
            self._buffered[key] = self._buffered.get(key, 0) + body.num_rows
            self._held[key] = self._held.get(key, 0) + body.nbytes
            while self._buffered[key] >= self.row_group_rows:
                self._write_group(key, self.row_group_rows)
        while sum(self._held.values()) > self.buffer_bytes:
            largest = max(self._held, key=lambda k: self._held[k])
            self._write_group(largest, self._buffered[largest])

    def _write_group(self, key: tuple[str, ...], rows: int) -> None:
        buffered = pa.concat_tables(self._buffers[key])
        group, rest = buffered.slice(0, rows), buffered.slice(rows)
        self._buffers[key] = [rest] if rest.num_rows else []
        self._buffered[key] = rest.num_rows
        self._held[key] = rest.nbytes if rest.num_rows else 0
        out = self._open.get(key)
        if out is None:
            number = self._numbers.get(key, 0)
            self._numbers[key] = number + 1
            directory = "/".join(f"{c}={v}" for c, v in zip(self.partition_by, key, strict=True))
            rel = f"{directory}/{file_name(self.batch, self.tag, number)}".lstrip("/")
            out = _OpenFile(
                self.fs,
                self.root,
                rel,
                self.file_schema,
                dict(zip(self.partition_by, key, strict=True)),
            )
            self._open[key] = out
        out.write(group)
        if out.bytes_written >= self.target_bytes:
            self.files.append(out.close())
            del self._open[key]

    def close(self) -> list[WrittenFile]:
        """Write what is buffered and close every file.

        Returns:
            Every file this writer produced.
        """
        for key in sorted(self._buffers):
            if self._buffered.get(key):
                self._write_group(key, self._buffered[key])
        for key in sorted(self._open):
            self.files.append(self._open.pop(key).close())
        return sorted(self.files, key=lambda f: f.path)


# A partition value becomes a directory name: it must not be able to leave the table.
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9_:+-][A-Za-z0-9_.:+-]*$")


class UnsafePartitionValue(ValueError):
    """A partition value that would not stay one directory inside the table."""


def split_by(table: pa.Table, columns: list[str]) -> list[tuple[tuple[str, ...], pa.Table]]:
    """Split rows by the values of partition columns.

    Raises:
        UnsafePartitionValue: If a value is null, empty, or could escape the table
            directory (`/`, `..`, leading dots, other special characters).
    """
    if not columns:
        return [((), table)]
    combos = table.group_by(columns).aggregate([]).to_pylist()
    out = []
    for combo in sorted(combos, key=lambda c: [c[k] or "" for k in columns]):
        values = tuple(combo[c] for c in columns)
        for column, value in zip(columns, values, strict=True):
            if value is None or not _SAFE_VALUE.match(value):
                raise UnsafePartitionValue(
                    f"partition value {value!r} of `{column}` cannot be a directory name"
                )
        mask = None
        for column, value in zip(columns, values, strict=True):
            test = pc.equal(table.column(column), value)
            mask = test if mask is None else pc.and_(mask, test)
        out.append((values, table.filter(mask)))
    return out
