"""A task's rows of one table written per partition value, in files of a target size.

What a file is, how it is named and written whole, is `strata.store.parquet`.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from strata.errors import UnsafePartitionValue
from strata.store.parquet import OpenFile, WrittenFile, file_name, partition_path


class PartitionedWriter:
    """Writes one task's rows of one table, a file (or a few) per partition value.

    Rows are buffered per partition and written in row groups of exactly
    `row_group_rows` rows (the last one shorter); a file is closed and the next one
    begun once it passes `target_bytes`. At most `max_open_files` files are open at
    once: a batch spread over thousands of event hours closes the least recently
    written file first (its partition gets one more, smaller file if rows for it
    come later), so neither file handles nor memory grow with the number of hours.
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
        max_open_files: int = 64,
        attempt: int = 0,
        run_id: str = "",
        locations: Mapping[str, str] | None = None,
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
                it, the largest buffers are written as shorter row groups, so memory
                stays flat however many event hours a batch touches.
            max_open_files: Most files open at once.
            attempt: The task's attempt number, for file names.
            run_id: The run's id, for file names.
            locations: A plain Parquet table's compacted partitions (`dt=…/hr=…`) and
                the directory each is in now (see `strata.store.locations`).
        """
        if max_open_files < 1:
            raise ValueError("max_open_files must be at least 1")
        file_name(batch, tag, 0, attempt, run_id)  # refuse a bad run id before any write
        self.fs, self.root = fs, root
        self.partition_by = partition_by
        self.file_schema = pa.schema([f for f in schema if f.name not in partition_by])
        self.batch, self.tag = batch, tag
        self.attempt, self.run_id = attempt, run_id
        self.target_bytes, self.row_group_rows = target_bytes, row_group_rows
        self.buffer_bytes = buffer_bytes
        self.max_open_files = max_open_files
        self.locations = dict(locations or {})
        self._held: dict[tuple[str, ...], int] = {}
        self._held_total = 0
        self._buffers: dict[tuple[str, ...], list[pa.Table]] = {}
        self._buffered: dict[tuple[str, ...], int] = {}
        # Least recently written first.
        self._open: OrderedDict[tuple[str, ...], OpenFile] = OrderedDict()
        self._numbers: dict[tuple[str, ...], int] = {}
        self.files: list[WrittenFile] = []

    @property
    def open_files(self) -> int:
        """Files open right now."""
        return len(self._open)

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
            self._hold(key, self._held.get(key, 0) + body.nbytes)
            while self._buffered[key] >= self.row_group_rows:
                self._write_group(key, self.row_group_rows)
        if self._held_total > self.buffer_bytes:
            for key in sorted(self._held, key=self._held.__getitem__, reverse=True):
                if self._held_total <= self.buffer_bytes:
                    break
                if self._buffered.get(key):
                    self._write_group(key, self._buffered[key])

    def _hold(self, key: tuple[str, ...], nbytes: int) -> None:
        self._held_total += nbytes - self._held.get(key, 0)
        self._held[key] = nbytes

    def _write_group(self, key: tuple[str, ...], rows: int) -> None:
        buffered = pa.concat_tables(self._buffers[key])
        group, rest = buffered.slice(0, rows), buffered.slice(rows)
        self._buffers[key] = [rest] if rest.num_rows else []
        self._buffered[key] = rest.num_rows
        self._hold(key, rest.nbytes if rest.num_rows else 0)
        out = self._open.get(key)
        if out is None:
            while len(self._open) >= self.max_open_files:
                _, oldest = self._open.popitem(last=False)
                self.files.append(oldest.close())
            number = self._numbers.get(key, 0)
            self._numbers[key] = number + 1
            directory = partition_path(self.partition_by, key)
            directory = self.locations.get(directory, directory)
            name = file_name(self.batch, self.tag, number, self.attempt, self.run_id)
            out = OpenFile(
                self.fs,
                self.root,
                f"{directory}/{name}".lstrip("/"),
                self.file_schema,
                dict(zip(self.partition_by, key, strict=True)),
            )
            self._open[key] = out
        else:
            self._open.move_to_end(key)
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
        while self._open:
            self.files.append(self._open.popitem(last=False)[1].close())
        return sorted(self.files, key=lambda f: f.path)


# A partition value becomes a directory name: it must not be able to leave the table.
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9_:+-][A-Za-z0-9_.:+-]*$")


def split_by(table: pa.Table, columns: list[str]) -> list[tuple[tuple[str, ...], pa.Table]]:
    """Split rows by the values of partition columns, keeping their order within each.

    One stable sort on the values' dictionary codes groups the rows, so the cost
    stays O(rows log rows) however many values there are. Each part is taken as a
    compact copy of its own rows: a part buffered for later never keeps the whole
    input alive.

    Args:
        table: Rows holding the columns.
        columns: Partition columns (strings).

    Returns:
        (values, rows) per distinct combination of values, sorted by values.

    Raises:
        UnsafePartitionValue: If a value is null, empty, or could escape the table
            directory (`/`, `..`, leading dots, other special characters).
    """
    if not columns:
        return [((), table)]
    if table.num_rows == 0:
        return []
    dictionaries = []
    codes: pa.Array | None = None
    for column in columns:
        values = table.column(column).combine_chunks()
        if values.null_count:
            raise UnsafePartitionValue(
                f"partition value None of `{column}` cannot be a directory name"
            )
        encoded = pc.dictionary_encode(values)
        dictionaries.append(encoded.dictionary.to_pylist())
        these = encoded.indices.cast(pa.int64())
        codes = these if codes is None else pc.add(pc.multiply(codes, len(dictionaries[-1])), these)
    assert codes is not None
    distinct = pc.unique(codes).to_pylist()
    keyed = []
    for code in distinct:
        values_of: list[str] = []
        for dictionary in reversed(dictionaries):
            code, at = divmod(code, len(dictionary))
            values_of.append(dictionary[at])
        values = tuple(reversed(values_of))
        for column, value in zip(columns, values, strict=True):
            if not _SAFE_VALUE.match(value):
                raise UnsafePartitionValue(
                    f"partition value {value!r} of `{column}` cannot be a directory name"
                )
        keyed.append(values)
    if len(distinct) == 1:
        return [(keyed[0], table)]
    order = pc.sort_indices(codes)
    ordered = pc.take(codes, order)
    # Where the sorted codes change, a part ends; parts come out in code order.
    ends = pc.indices_nonzero(
        pc.not_equal(ordered.slice(1), ordered.slice(0, len(ordered) - 1))
    ).to_pylist()
    bounds = [0] + [e + 1 for e in ends] + [len(ordered)]
    by_code = dict(zip(distinct, keyed, strict=True))
    parts = []
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        values = by_code[ordered[lo].as_py()]
        parts.append((values, table.take(order.slice(lo, hi - lo))))
    parts.sort(key=lambda part: part[0])
    return parts
