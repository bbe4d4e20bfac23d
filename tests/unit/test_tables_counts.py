"""Counting a batch's files back: from their footers where those pin the rows, else read."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from strata.store.parquet import OpenFile
from strata.store.places import TableRef
from strata.store.tables import _counted_files, file_counts

SCHEMA = pa.schema(
    [
        pa.field("v", pa.string()),
        pa.field("_topic", pa.string(), nullable=False),
        pa.field("_partition", pa.int32(), nullable=False),
        pa.field("_offset", pa.int64(), nullable=False),
        pa.field("_batch", pa.int64()),
    ]
)


def rows(partitions: list[int], batches: list[int | None] | None = None) -> pa.Table:
    n = len(partitions)
    return pa.table(
        [
            pa.array([f"v{i}" for i in range(n)]),
            pa.array(["t"] * n),
            pa.array(partitions, pa.int32()),
            pa.array(range(n), pa.int64()),
            pa.array([1] * n if batches is None else batches, pa.int64()),
        ],
        schema=SCHEMA,
    )


def written(root: Path, rel: str, *groups: pa.Table) -> str:
    """A file through the project's own writer, a row group per table given."""
    out = OpenFile(pafs.LocalFileSystem(), str(root), rel, SCHEMA, {})
    for group in groups:
        out.write(group)
    return out.close().path


def no_column_read(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("a column was read")

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", refused)
    monkeypatch.setattr(ds, "dataset", refused)


def test_files_whose_footers_pin_their_partitions_are_counted_without_reading_a_column(
    tmp_path, monkeypatch
):
    paths = [
        written(tmp_path, "a.parquet", rows([0, 0, 0])),
        written(tmp_path, "b.parquet", rows([1, 1]), rows([0])),
        # Another batch's rows: none of them counted for batch 1, all counted for no batch.
        written(tmp_path, "c.parquet", rows([1, 1], [2, 2])),
        # A row group whose `_batch` is all null holds no batch's rows.
        written(tmp_path, "d.parquet", rows([0], [None])),
    ]
    no_column_read(monkeypatch)
    ref = TableRef(str(tmp_path), "parquet")
    assert file_counts(ref, paths, 1) == {("t", 0): 4, ("t", 1): 2}
    assert file_counts(ref, paths[:3]) == {("t", 0): 4, ("t", 1): 4}


def test_row_groups_their_statistics_do_not_pin_are_read_and_counted(tmp_path, monkeypatch):
    paths = [
        written(tmp_path, "a.parquet", rows([0, 1, 1])),
        # One row group pinned, one read: the batch's rows of a group of two batches.
        written(tmp_path, "b.parquet", rows([1, 1]), rows([0, 0, 1], [1, 2, 1])),
        # A `_batch` with a null among the batch's rows.
        written(tmp_path, "c.parquet", rows([0, 0], [1, None])),
    ]
    ref = TableRef(str(tmp_path), "parquet")
    # Counted a file and a row at a time, the counts add up the same.
    monkeypatch.setattr("strata.store.tables._FILES_AT_ONCE", 1)
    monkeypatch.setattr("strata.store.tables._ROWS_AT_ONCE", 1)
    assert file_counts(ref, paths, 1) == {("t", 0): 3, ("t", 1): 5}
    assert file_counts(ref, paths) == {("t", 0): 5, ("t", 1): 5}
    assert file_counts(ref, paths, 2) == {("t", 0): 1}


def test_a_file_another_writer_wrote_without_statistics_is_read(tmp_path, monkeypatch):
    pq.write_table(rows([0, 0, 1]), tmp_path / "x.parquet", write_statistics=False)
    ref = TableRef(str(tmp_path), "parquet")
    assert file_counts(ref, ["x.parquet"], 1) == {("t", 0): 2, ("t", 1): 1}
    no_column_read(monkeypatch)
    with pytest.raises(AssertionError, match="a column was read"):
        file_counts(ref, ["x.parquet"], 1)


def test_what_is_counted_is_what_storage_holds_and_a_missing_or_broken_file_fails(tmp_path):
    ref = TableRef(str(tmp_path), "parquet")
    [path] = [written(tmp_path, "a.parquet", rows([0, 0, 0]))]
    assert file_counts(ref, [path], 1) == {("t", 0): 3}
    # The same name, rewritten with a row fewer: the footer read is the new file's.
    written(tmp_path, "a.parquet", rows([0, 0]))
    assert file_counts(ref, [path], 1) == {("t", 0): 2}
    with pytest.raises(FileNotFoundError):
        file_counts(ref, [path, "gone.parquet"], 1)
    (tmp_path / "broken.parquet").write_bytes((tmp_path / path).read_bytes()[:-20])
    with pytest.raises(pa.ArrowInvalid):
        file_counts(ref, [path, "broken.parquet"], 1)


def test_files_on_a_filesystem_of_requests_are_read_several_at_once_with_the_same_counts(
    tmp_path, monkeypatch
):
    paths = [written(tmp_path, f"p{i}.parquet", rows([i % 2] * 3 + [0])) for i in range(6)]
    # Not the local filesystem: files are read by a pool of threads, in groups.
    remote = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    monkeypatch.setattr("strata.store.tables._FILES_AT_ONCE", 4)
    assert _counted_files(remote, paths, 1) == {("t", 0): 15, ("t", 1): 9}
    with pytest.raises(FileNotFoundError):
        _counted_files(remote, [*paths, "gone.parquet"], 1)
