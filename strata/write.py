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
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

# Integer columns whose min/max go into Delta's file statistics, for file skipping.
_STATS_COLUMNS = ("_partition", "_offset", "_batch")


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
        self.rows = 0
        self.mins: dict[str, Any] = {}
        self.maxs: dict[str, Any] = {}

    def write(self, table: pa.Table) -> None:
        self.writer.write_table(table, row_group_size=table.num_rows)
        self.rows += table.num_rows
        for name in _STATS_COLUMNS:
            if name in table.column_names:
                mm = pc.min_max(table.column(name)).as_py()
                if mm["min"] is not None:
                    self.mins[name] = min(mm["min"], self.mins.get(name, mm["min"]))
                    self.maxs[name] = max(mm["max"], self.maxs.get(name, mm["max"]))

    @property
    def bytes_written(self) -> int:
        return int(self.stream.tell())

    def close(self) -> WrittenFile:
        self.writer.close()
        self.stream.close()
        final = f"{self.root}/{self.rel}"
        if self.local:
            self.fs.move(self.target, final)
        size = self.fs.get_file_info(final).size
        stats = {"numRecords": self.rows, "minValues": self.mins, "maxValues": self.maxs}
        return WrittenFile(
            self.rel, int(size or 0), self.partition_values, self.rows, json.dumps(stats)
        )


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
