"""A task's rows of one table written per partition value, in files of a target size.

What a file is, how it is named and written whole, is `strata.store.parquet`.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from strata.errors import UnsafePartitionValue
from strata.store.parquet import (
    OpenFile,
    StatsLayout,
    WrittenFile,
    file_name,
    offset_tally,
    partition_path,
)


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
        self.layout = StatsLayout(self.file_schema)
        self.coordinates = {"_topic", "_partition", "_offset"} <= set(self.file_schema.names)
        self.batch, self.tag = batch, tag
        self.attempt, self.run_id = attempt, run_id
        self.target_bytes, self.row_group_rows = target_bytes, row_group_rows
        self.buffer_bytes = buffer_bytes
        self.max_open_files = max_open_files
        self.locations = dict(locations or {})
        self._held: dict[tuple[str, ...], int] = {}
        self._held_total = 0
        self._buffers: dict[tuple[str, ...], list[_Piece]] = {}
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
        # Cast and count once for the whole chunk, never once per partition value: a
        # chunk spread over thousands of event hours made those per-part calls (and a
        # `take` that concatenated the chunk's chunks again for each part) most of a
        # task's time.
        body = table.select(self.file_schema.names).cast(self.file_schema).combine_chunks()
        groups = _group_by_values(table, self.partition_by)
        tallies = _offset_tallies(body, groups) if self.coordinates else {}
        # A part's memory is its share of the chunk's: `nbytes` costs tens of
        # microseconds a call, more than taking a part of a few rows.
        per_row = body.nbytes / body.num_rows
        for key, rows in groups.parts():
            part = body if rows is None else body.take(rows)
            held = round(part.num_rows * per_row)
            self._buffers.setdefault(key, []).append(_Piece(part, held, tallies.get(key)))
            self._buffered[key] = self._buffered.get(key, 0) + part.num_rows
            self._hold(key, self._held.get(key, 0) + held)
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
        taken: list[pa.Table] = []
        tally: Tally | None = {} if self.coordinates else None
        rest: list[_Piece] = []
        due = rows
        for piece in self._buffers[key]:
            if due >= piece.rows.num_rows:
                taken.append(piece.rows)
                tally = _added(tally, piece.tally)
                due -= piece.rows.num_rows
            elif due:
                head, tail = piece.rows.slice(0, due), piece.rows.slice(due)
                # Cut inside a piece: its head is counted, its tail keeps the rest.
                counted = offset_tally(head) if piece.tally is not None else None
                taken.append(head)
                tally = _added(tally, counted)
                held = round(piece.nbytes * tail.num_rows / piece.rows.num_rows)
                rest.append(_Piece(tail, held, _taken_away(piece.tally, counted)))
                due = 0
            else:
                rest.append(piece)
        group = pa.concat_tables(taken)
        self._buffers[key] = rest
        self._buffered[key] = sum(piece.rows.num_rows for piece in rest)
        self._hold(key, sum(piece.nbytes for piece in rest))
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
                self.layout,
            )
            self._open[key] = out
        else:
            self._open.move_to_end(key)
        out.write(group, tally)
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

    Each part is taken as a compact copy of its own rows: a part buffered for later
    never keeps the whole input alive.

    Args:
        table: Rows holding the columns.
        columns: Partition columns (strings).

    Returns:
        (values, rows) per distinct combination of values, sorted by values.

    Raises:
        UnsafePartitionValue: If a value is null, empty, or could escape the table
            directory (`/`, `..`, leading dots, other special characters).
    """
    groups = _group_by_values(table, columns)
    if groups.order is not None:
        # A take from a table of several chunks concatenates them again for every part.
        table = table.combine_chunks()
    return [(key, table if rows is None else table.take(rows)) for key, rows in groups.parts()]


@dataclass(frozen=True)
class _ValueGroups:
    """Rows grouped by the values of partition columns: which rows hold which values.

    Attributes:
        keys: The distinct values, sorted.
        codes: Per row, the code of its values (None with one part only).
        order: Row indices, stably sorted by code (None with one part only).
        bounds: Per key, its rows' `[lo, hi)` within `order`.
        key_of: The values of each code.
    """

    keys: list[tuple[str, ...]]
    codes: pa.Array | None = None
    order: pa.Array | None = None
    bounds: dict[tuple[str, ...], tuple[int, int]] = field(default_factory=dict)
    key_of: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def parts(self) -> list[tuple[tuple[str, ...], pa.Array | None]]:
        """(values, their rows' indices in order) per key, sorted; None for every row."""
        if self.order is None:
            return [(key, None) for key in self.keys]
        return [
            (key, self.order.slice(lo, hi - lo))
            for key in self.keys
            for lo, hi in [self.bounds[key]]
        ]


def _group_by_values(table: pa.Table, columns: list[str]) -> _ValueGroups:
    """Group rows by the values of partition columns, keeping their order within each.

    One stable sort on the values' dictionary codes groups the rows, so the cost
    stays O(rows log rows) however many values there are.

    Args:
        table: Rows holding the columns.
        columns: Partition columns (strings).

    Returns:
        The groups (none for no rows; one for every row without columns).

    Raises:
        UnsafePartitionValue: If a value is null, empty, or could escape the table
            directory (`/`, `..`, leading dots, other special characters).
    """
    if not columns:
        return _ValueGroups([()])
    if table.num_rows == 0:
        return _ValueGroups([])
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
        return _ValueGroups(keyed)
    key_of = dict(zip(distinct, keyed, strict=True))
    order = pc.sort_indices(codes)
    ordered = pc.take(codes, order)
    # Where the sorted codes change, a part ends; parts come out in code order.
    ends = pc.indices_nonzero(
        pc.not_equal(ordered.slice(1), ordered.slice(0, len(ordered) - 1))
    ).to_pylist()
    starts = [0] + [e + 1 for e in ends]
    firsts = pc.take(ordered, pa.array(starts)).to_pylist()
    bounds = {
        key_of[code]: (lo, hi)
        for code, lo, hi in zip(firsts, starts, [*starts[1:], len(ordered)], strict=True)
    }
    return _ValueGroups(sorted(keyed), codes, order, bounds, key_of)


Tally = dict[str, list[int]]
"""Per `"topic:partition"`, `[rows, sum of offsets]` (see `WrittenFile.offsets`)."""


@dataclass(frozen=True)
class _Piece:
    """Buffered rows of one partition value: the memory they hold, their offset tally."""

    rows: pa.Table
    nbytes: int
    tally: Tally | None


def _offset_tallies(body: pa.Table, groups: _ValueGroups) -> dict[tuple[str, ...], Tally]:
    """Each part's offset tally, counted for the whole chunk at once.

    One grouped sum over the chunk, rather than one per part: the rows counted are the
    very rows each part takes, so a file's tally is still that of the rows handed to
    its Parquet writer.
    """
    if groups.codes is None:
        return {key: offset_tally(body) for key in groups.keys}
    grouped = (
        pa.table(
            {
                "code": groups.codes,
                "topic": body.column("_topic"),
                "partition": body.column("_partition"),
                "offset": body.column("_offset"),
            }
        )
        .group_by(["code", "topic", "partition"], use_threads=False)
        .aggregate([("offset", "count"), ("offset", "sum")])
    )
    tallies: dict[tuple[str, ...], Tally] = {}
    for code, topic, partition, rows, total in zip(
        grouped.column("code").to_pylist(),
        grouped.column("topic").to_pylist(),
        grouped.column("partition").to_pylist(),
        grouped.column("offset_count").to_pylist(),
        grouped.column("offset_sum").to_pylist(),
        strict=True,
    ):
        tallies.setdefault(groups.key_of[code], {})[f"{topic}:{partition}"] = [rows, total]
    return tallies


def _added(a: Tally | None, b: Tally | None) -> Tally | None:
    """Two tallies added up; None (count the rows again) if either is unknown."""
    if a is None or b is None:
        return None
    out = {key: list(value) for key, value in a.items()}
    for key, (rows, total) in b.items():
        entry = out.setdefault(key, [0, 0])
        entry[0] += rows
        entry[1] += total
    return out


def _taken_away(whole: Tally | None, head: Tally | None) -> Tally | None:
    """What is left of a tally once a head of its rows is taken; None if either is unknown."""
    if whole is None or head is None:
        return None
    out = {}
    for key, (rows, total) in whole.items():
        got = head.get(key, [0, 0])
        if rows - got[0]:
            out[key] = [rows - got[0], total - got[1]]
    return out
