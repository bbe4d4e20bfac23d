"""A table's Parquet files: written whole with Delta's statistics, and named per batch.

A file's row groups are cut at a fixed row count, so the same rows give the same
bytes. Its name is fixed by (batch, task, attempt, run, partition values, file
number): a retried task attempt, or another run of the same batch, writes files of
its own rather than overwriting ones that may already be committed (a paused or
zombie runner must never replace a committed file under a table's readers). Only
the files a successful attempt reports are committed; the rest are orphans that
the driver removes (plain Parquet) or vacuum does (Delta). Files appear whole:
locally through a rename, on object stores through the atomic PUT.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

# Longer string bounds are left out of the statistics rather than bloat the log.
_MAX_STAT_STRING = 64
# Bytes a file being written holds before they go to its stream: a small file goes in
# one write, and a writer's open files (`max_open_files`) hold little memory.
_WRITE_BUFFER = 64 << 10


@dataclass(frozen=True)
class WrittenFile:
    """A finished data file, as a Delta add action needs it.

    Attributes:
        path: Path relative to the table root.
        size: Bytes.
        partition_values: Partition column values.
        rows: Rows in the file (the Parquet footer's count).
        stats: Delta statistics JSON; None records none (a reader then prunes nothing:
            statistics of some columns only would make delta-rs's and Arrow's readers
            skip files a filter on another column matches).
        offsets: Per `"topic:partition"`, `[rows, sum of offsets]` of the rows handed
            to the Parquet writer: what the driver reconciles against what was read.
            Empty for files without Kafka coordinates.
    """

    path: str
    size: int
    partition_values: dict[str, str]
    rows: int
    stats: str | None
    offsets: dict[str, list[int]] = field(default_factory=dict)


# A run id becomes part of file names: it must stay one plain path segment.
_RUN_ID = re.compile(r"^[A-Za-z0-9_]*$")


def file_name(batch: int, tag: str, number: int, attempt: int = 0, run_id: str = "") -> str:
    """The name of a task attempt's file in one partition directory.

    Unique per attempt and run: a retry or a zombie runner writes beside, never
    over, files that may already be committed.

    Args:
        batch: Batch number.
        tag: The writing task: `t00003` for split 3, `r00001` for shuffle reducer 1.
        number: The file's number within the task attempt and partition.
        attempt: Spark's attempt number of the task.
        run_id: The run's id (letters, digits, `_`); empty leaves it out.

    Raises:
        ValueError: If the run id is not a plain name.
    """
    if not _RUN_ID.match(run_id):
        raise ValueError(f"run id {run_id!r} may hold only letters, digits and `_`")
    run = f"-{run_id}" if run_id else ""
    return f"part-b{batch:010d}-{tag}-a{attempt}{run}-f{number:03d}.snappy.parquet"


# `part-b0000000042-…` (a batch's data, raw or quarantine file, or a backfill's
# rewrite), `ledger-b0000000042-…`, `part-c…` (a compaction's); a leading dot and a
# `.tmp-…` tail mark a write that never finished.
_BATCH_FILE = re.compile(r"^\.?(?:part|ledger)-b(\d{10})-")
_COMPACTION_FILE = re.compile(r"^\.?part-c\d{14}[0-9a-f]{8}-")


def file_batch(name: str) -> int | None:
    """The batch a file (a path or a base name) was written for; None for any other file."""
    found = _BATCH_FILE.match(name.rsplit("/", 1)[-1])
    return None if found is None else int(found.group(1))


def is_compaction_file(name: str) -> bool:
    """Whether a file (a path or a base name) is one a compaction wrote."""
    return _COMPACTION_FILE.match(name.rsplit("/", 1)[-1]) is not None


def is_batch_file(name: str, batch: int) -> bool:
    """Whether a file (a path or a base name) was written for a batch.

    Covers every attempt and run, and the hidden temporary files of unfinished
    writes, so the files of failed attempts can be found and removed.

    Args:
        name: File name or path.
        batch: Batch number.
    """
    base = name.rsplit("/", 1)[-1]
    prefix = f"part-b{batch:010d}-"
    return base.startswith(prefix) or base.startswith("." + prefix)


class OpenFile:
    """One Parquet file being written: row groups added, then closed whole with its statistics."""

    def __init__(
        self,
        fs: pafs.FileSystem,
        root: str,
        rel: str,
        schema: pa.Schema,
        partition_values: dict[str, str],
        layout: StatsLayout | None = None,
    ) -> None:
        """Begin a file, hidden until it is closed whole.

        Args:
            fs: Filesystem of the table.
            root: Table root path inside `fs`.
            rel: The file's path relative to the root.
            schema: The file's Arrow schema.
            partition_values: The file's partition values.
            layout: The schema's `StatsLayout`, shared by a writer's files; None
                works it out for this file.
        """
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
        # A Parquet writer writes each page, and asks its position, on its own: on a
        # local file that is a hundred system calls for a small file, most of what a
        # file of a few hundred rows costs beyond its encoding.
        self.stream = fs.open_output_stream(self.target, buffer_size=_WRITE_BUFFER)
        # Every timestamp at microseconds, which every reader takes, where a Kafka
        # timestamp or a `timestamp-millis` field would be milliseconds: Iceberg's spec
        # stores timestamps so, and Trino's Iceberg connector refuses a file that does not.
        self.writer = pq.ParquetWriter(
            self.stream, schema, compression="snappy", coerce_timestamps="us"
        )
        self.layout = StatsLayout(schema) if layout is None else layout
        self.rows = 0
        names = set(schema.names)
        self.coordinates = {"_topic", "_partition", "_offset"} <= names
        self.offsets: dict[str, list[int]] = {}

    def write(self, table: pa.Table, offsets: dict[str, list[int]] | None = None) -> None:
        """Add a row group.

        Args:
            table: The row group's rows.
            offsets: Their `offset_tally`, if the caller counted it already (from these
                very rows); None counts it here.
        """
        self.writer.write_table(table, row_group_size=table.num_rows)
        self.rows += table.num_rows
        if self.coordinates and table.num_rows:
            counted = offset_tally(table) if offsets is None else offsets
            for key, (rows, total) in counted.items():
                entry = self.offsets.setdefault(key, [0, 0])
                entry[0] += rows
                entry[1] += total

    @property
    def bytes_written(self) -> int:
        return int(self.stream.tell())

    def close(self) -> WrittenFile:
        self.writer.close()
        # What was written is the file's size: no look at the file (a HEAD request on
        # an object store) for each of a batch's thousands of small files.
        size = self.bytes_written
        self.stream.close()
        footer = self.writer.writer.metadata
        if self.local:
            self.fs.move(self.target, f"{self.root}/{self.rel}")
        stats = self.layout.stats(footer, footer.num_rows)
        return WrittenFile(
            self.rel, size, self.partition_values, footer.num_rows, json.dumps(stats), self.offsets
        )


def offset_tally(table: pa.Table) -> dict[str, list[int]]:
    """Rows and offset sum per `"topic:partition"` of rows holding Kafka coordinates."""
    if table.num_rows == 0:
        return {}
    topics = pc.min_max(table.column("_topic"))
    partitions = pc.min_max(table.column("_partition"))
    if topics["min"] == topics["max"] and partitions["min"] == partitions["max"]:
        # The usual row group holds one partition: two sums, no grouping.
        total = pc.sum(table.column("_offset")).as_py()
        return {f"{topics['min'].as_py()}:{partitions['min'].as_py()}": [table.num_rows, total]}
    grouped = table.group_by(["_topic", "_partition"], use_threads=False).aggregate(
        [("_offset", "count"), ("_offset", "sum")]
    )
    return {
        f"{topic}:{partition}": [rows, total]
        for topic, partition, rows, total in zip(
            grouped.column("_topic").to_pylist(),
            grouped.column("_partition").to_pylist(),
            grouped.column("_offset_count").to_pylist(),
            grouped.column("_offset_sum").to_pylist(),
            strict=True,
        )
    }


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
    return StatsLayout(schema).stats(footer, rows)


class StatsLayout:
    """Which footer columns give which of a schema's Delta statistics, worked out once.

    A batch over thousands of event hours writes thousands of small files of one
    schema: walking the schema's types again for every footer, and converting bounds
    Delta keeps none of (binary, booleans, decimals), cost more than reading the
    footer itself. Bounds are read as the footer stores them (integers, floats, UTF-8
    bytes) where that is what the column's type is, and turned into values once per
    file, not per row group: pyarrow's typed bounds build both bounds as Arrow scalars
    on each call, a timestamp's as a zoned datetime, half of a small file's statistics.
    """

    def __init__(self, schema: pa.Schema) -> None:
        """Plan the statistics of files of a schema.

        Args:
            schema: The files' Arrow schema.
        """
        self.fields = [_StatsField.of(f, f.name) for f in schema]
        # Per leaf kept, (path, column index, how its bounds are read); resolved from the
        # first footer, since every file of the schema has the same Parquet leaves.
        self._leaves: list[tuple[str, int, _Bounds]] | None = None
        self._columns = -1

    def stats(self, footer: Any, rows: int) -> dict[str, Any]:  # noqa: ANN401
        """A file's Delta statistics (see `delta_stats`).

        Args:
            footer: The file's `pyarrow.parquet.FileMetaData`.
            rows: Rows in the file.
        """
        if self._leaves is None or footer.num_columns != self._columns:
            self._leaves = self._resolve(footer)
            self._columns = footer.num_columns
        # Per leaf, [low, high, null count (None: unknown), bounds exact].
        leaves: dict[str, list[Any]] = {path: [None, None, 0, True] for path, _, _ in self._leaves}
        for g in range(footer.num_row_groups):
            group = footer.row_group(g)
            for path, i, bounds in self._leaves:
                stats = group.column(i).statistics
                entry = leaves[path]
                if stats is None or not stats.has_null_count:
                    entry[2], entry[3] = None, False
                    continue
                if entry[2] is not None:
                    entry[2] += stats.null_count
                if not bounds.wanted or not entry[3]:
                    continue
                if bounds.raw:
                    # None without bounds: then exact only if every value is null.
                    low, high = stats.min_raw, stats.max_raw
                elif stats.has_min_max:
                    try:
                        low, high = stats.min, stats.max
                    except (OverflowError, ValueError):
                        # A producer-set Kafka timestamp (or date) beyond what Python's
                        # datetime holds: keep the null count, give no bounds.
                        entry[3] = False
                        continue
                else:
                    low = high = None
                if low is None:
                    if stats.null_count != group.num_rows:
                        entry[3] = False
                    continue
                entry[0] = low if entry[0] is None else min(entry[0], low)
                entry[1] = high if entry[1] is None else max(entry[1], high)
        for path, _, bounds in self._leaves:
            entry = leaves[path]
            if bounds.convert is not None and entry[3] and entry[0] is not None:
                try:
                    entry[0], entry[1] = bounds.convert(entry[0]), bounds.convert(entry[1])
                except (OverflowError, ValueError):
                    # Beyond what Python's datetime holds, or not UTF-8: no bounds.
                    entry[3] = False
        mins: dict[str, Any] = {}
        maxs: dict[str, Any] = {}
        nulls: dict[str, Any] = {}
        for column in self.fields:
            column.collect(leaves, mins, maxs, nulls)
        return {"numRecords": rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}

    def _resolve(self, footer: Any) -> list[tuple[str, int, _Bounds]]:  # noqa: ANN401
        at = {footer.schema.column(i).path: i for i in range(footer.num_columns)}
        wanted: dict[str, str | None] = {}
        for column in self.fields:
            column.leaves(wanted)
        # Lists and maps are no leaves of their own name: Delta keeps no statistics for them.
        return [
            (path, at[path], _bounds_read(raw, footer.schema.column(at[path])))
            for path, raw in wanted.items()
            if path in at
        ]


@dataclass(frozen=True)
class _Bounds:
    """How a leaf's bounds are read from a footer.

    Attributes:
        wanted: Whether Delta keeps bounds for the leaf at all.
        raw: Read as stored (`min_raw`), not as pyarrow's typed values.
        convert: What turns a stored bound into the value `_stat_bounds` takes; None
            keeps it as it is.
    """

    wanted: bool
    raw: bool = False
    convert: Callable[[Any], Any] | None = None


_NO_BOUNDS = _Bounds(wanted=False)
_TYPED = _Bounds(wanted=True)
_EPOCH = datetime(1970, 1, 1)
_EPOCH_DAY = date(1970, 1, 1)
# Per way of reading a leaf (see `_StatsField.raw`): the Parquet storage it needs, and
# what turns a stored bound into a value. A timestamp stays naive: read as UTC, as
# `_iso_ms` writes it.
_RAW_READS: dict[str, tuple[tuple[str, ...], str | None, Callable[[Any], Any] | None]] = {
    "number": (("INT32", "INT64", "FLOAT", "DOUBLE"), None, None),
    "utf8": (("BYTE_ARRAY",), None, bytes.decode),
    "ms": (("INT64",), "milliseconds", lambda v: _EPOCH + timedelta(milliseconds=v)),
    "us": (("INT64",), "microseconds", lambda v: _EPOCH + timedelta(microseconds=v)),
    "days": (("INT32",), None, lambda v: _EPOCH_DAY + timedelta(days=v)),
}


def _bounds_read(raw: str | None, column: Any) -> _Bounds:  # noqa: ANN401
    """How to read a leaf's bounds, given how it is wanted and how the file stores it.

    Args:
        raw: `_StatsField.raw` of the leaf; the empty string for a leaf without bounds.
        column: The leaf's `pyarrow.parquet.ColumnSchema` in the footer.
    """
    if raw == "":
        return _NO_BOUNDS
    if raw is None or raw not in _RAW_READS:
        return _TYPED
    physical, unit, convert = _RAW_READS[raw]
    if column.physical_type not in physical:
        return _TYPED
    if unit is not None:
        # A file another writer wrote may store the time in another unit.
        logical = column.logical_type
        if logical is None or json.loads(logical.to_json()).get("timeUnit") != unit:
            return _TYPED
    return _Bounds(wanted=True, raw=True, convert=convert)


@dataclass(frozen=True)
class _StatsField:
    """A field of a schema as its statistics are gathered: a struct, or a leaf.

    Attributes:
        name: The field's name.
        path: Its dotted path, as a Parquet footer names its column.
        kind: What bounds Delta keeps for it (see `_stat_bounds`); None for none.
        children: A struct's fields; None for a leaf.
        raw: How its bounds can be read as the footer stores them (a key of
            `_RAW_READS`); None for pyarrow's typed values.
    """

    name: str
    path: str
    kind: str | None
    children: tuple[_StatsField, ...] | None
    raw: str | None = None

    @classmethod
    def of(cls, field: pa.Field, path: str) -> _StatsField:
        kind = field.type
        if pa.types.is_struct(kind):
            children = tuple(
                cls.of(kind.field(i), f"{path}.{kind.field(i).name}")
                for i in range(kind.num_fields)
            )
            return cls(field.name, path, None, children)
        return cls(field.name, path, _bounds_kind(kind), None, _raw_read(kind))

    def leaves(self, wanted: dict[str, str | None]) -> None:
        """Add each leaf's path, and how its bounds are read ("" for none wanted)."""
        if self.children is None:
            wanted[self.path] = "" if self.kind is None else self.raw
            return
        for child in self.children:
            child.leaves(wanted)

    def collect(
        self,
        leaves: dict[str, list[Any]],
        mins: dict[str, Any],
        maxs: dict[str, Any],
        nulls: dict[str, Any],
    ) -> None:
        """Add this field's statistics, from its leaves' `[low, high, nulls, exact]`."""
        if self.children is not None:
            child_min: dict[str, Any] = {}
            child_max: dict[str, Any] = {}
            child_nulls: dict[str, Any] = {}
            for child in self.children:
                child.collect(leaves, child_min, child_max, child_nulls)
            for target, values in ((mins, child_min), (maxs, child_max), (nulls, child_nulls)):
                if values:
                    target[self.name] = values
            return
        leaf = leaves.get(self.path)
        if leaf is None:
            return
        low, high, null_count, exact = leaf
        if null_count is None:
            return
        nulls[self.name] = null_count
        if not exact or low is None or self.kind is None:
            return
        bounds = _stat_bounds(self.kind, low, high)
        if bounds is not None:
            mins[self.name], maxs[self.name] = bounds


def _bounds_kind(kind: pa.DataType) -> str | None:
    """Which bounds Delta keeps for a leaf type; None for none (binary, bool, decimal)."""
    for name, test in (
        ("integer", pa.types.is_integer),
        ("floating", pa.types.is_floating),
        ("string", pa.types.is_string),
        ("timestamp", pa.types.is_timestamp),
        ("date", pa.types.is_date),
    ):
        if test(kind):
            return name
    return None


def _raw_read(kind: pa.DataType) -> str | None:
    """How a leaf type's bounds can be read as stored (see `_RAW_READS`); None if not.

    Unsigned integers are stored signed, and other units of time in other units: those
    are read as pyarrow's typed values.
    """
    if pa.types.is_signed_integer(kind) or kind in (pa.float32(), pa.float64()):
        return "number"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "utf8"
    if pa.types.is_timestamp(kind) and kind.unit in ("ms", "us"):
        # Stored at microseconds, whatever the unit (`OpenFile`).
        return "us"
    if pa.types.is_date32(kind):
        return "days"
    return None


def _stat_bounds(kind: str, low: Any, high: Any) -> tuple[Any, Any] | None:  # noqa: ANN401
    if kind == "integer":
        return low, high
    if kind == "floating":
        # An infinite or NaN bound is not JSON, and delta-rs then drops the whole file's
        # statistics, its row count included.
        return (low, high) if math.isfinite(low) and math.isfinite(high) else None
    if kind == "string":
        if len(low) > _MAX_STAT_STRING or len(high) > _MAX_STAT_STRING:
            return None
        return low, high
    if kind == "timestamp":
        # Delta keeps milliseconds: round the lower bound down and the upper one up.
        floor = low.replace(microsecond=low.microsecond // 1000 * 1000)
        ceil_us = -(-high.microsecond // 1000) * 1000
        try:
            ceil = high.replace(microsecond=0) + timedelta(microseconds=ceil_us)
        except OverflowError:
            return None  # rounding up passes year 9999
        return _iso_ms(floor), _iso_ms(ceil)
    return low.isoformat(), high.isoformat()


def _iso_ms(moment: datetime) -> str:
    utc = moment.astimezone(UTC) if moment.tzinfo else moment
    if utc.year < 1000:
        # strftime writes a year below 1000 without leading zeros: kept as it was.
        return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"
    # Formatted by hand: strftime took a tenth of a small file's whole statistics.
    return (
        f"{utc.year}-{utc.month:02d}-{utc.day:02d}T{utc.hour:02d}:{utc.minute:02d}:"
        f"{utc.second:02d}.{utc.microsecond // 1000:03d}Z"
    )


def write_file(
    fs: pafs.FileSystem, root: str, rel: str, table: pa.Table, partition_values: dict[str, str]
) -> WrittenFile:
    """Write one whole file (atomically, with its statistics) and describe it."""
    out = OpenFile(fs, root, rel, table.schema, partition_values)
    out.write(table)
    return out.close()


def partition_path(columns: Sequence[str], values: Sequence[str]) -> str:
    """A partition's directory relative to its table, Hive-style: `dt=…/hr=…`.

    The one spelling of it: the writer makes the directories, and registration,
    quality and compaction name partitions by it.
    """
    return "/".join(f"{c}={v}" for c, v in zip(columns, values, strict=True))


def write_sized(
    fs: pafs.FileSystem,
    root: str,
    stem: str,
    table: pa.Table,
    partition_values: dict[str, str],
    target_bytes: int,
    row_group_rows: int,
) -> list[WrittenFile]:
    """Write rows, in their order, into files of at most about `target_bytes`.

    A file is closed before the row group that would take it past the target (judged
    by the size of the group before), so every file but the last is close to it.

    Args:
        fs: Filesystem of the table.
        root: Table root path inside `fs`.
        stem: Path of the files relative to the root, without `-fNNN.snappy.parquet`.
        table: The rows (without partition columns).
        partition_values: The files' partition values.
        target_bytes: Size at which a file is closed.
        row_group_rows: Rows per row group.

    Returns:
        The files written, in row order.
    """
    files: list[WrittenFile] = []
    out: OpenFile | None = None
    layout = StatsLayout(table.schema)
    group = 0
    for start in range(0, table.num_rows, row_group_rows):
        if out is not None and out.bytes_written + group > target_bytes:
            files.append(out.close())
            out = None
        if out is None:
            rel = f"{stem}-f{len(files):03d}.snappy.parquet"
            out = OpenFile(fs, root, rel, table.schema, partition_values, layout)
        before = out.bytes_written
        out.write(table.slice(start, row_group_rows))
        group = out.bytes_written - before
    if out is not None:
        files.append(out.close())
    return files
