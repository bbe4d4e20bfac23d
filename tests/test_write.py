"""File writing: deterministic names and bytes, one file per partition value, rolling by size."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from strata.write import PartitionedWriter, UnsafePartitionValue


def rows(n: int, start: int = 0) -> pa.Table:
    return pa.table(
        {
            "v": pa.array([f"value-{i:08d}" * 4 for i in range(start, start + n)]),
            "_partition": pa.array([0] * n, pa.int32()),
            "_offset": pa.array(range(start, start + n), pa.int64()),
            "dt": pa.array(["2025-11-22"] * n),
            "hr": pa.array(["10" if i % 3 else "11" for i in range(start, start + n)]),
        }
    )


def write(root: str, chunks: list[int], target: int = 1 << 30) -> list:
    table = rows(sum(chunks))
    w = PartitionedWriter(
        pafs.LocalFileSystem(), root, table.schema, ["dt", "hr"], 7, "t00002", target, 1000
    )
    at = 0
    for n in chunks:
        w.write(table.slice(at, n))
        at += n
    return w.close()


def test_same_rows_in_other_chunks_give_identical_files(tmp_path):
    a = write(str(tmp_path / "a"), [5000])
    b = write(str(tmp_path / "b"), [1, 333, 2000, 7, 2659])
    assert (
        [f.path for f in a]
        == [f.path for f in b]
        == [
            "dt=2025-11-22/hr=10/part-b0000000007-t00002-f000.snappy.parquet",
            "dt=2025-11-22/hr=11/part-b0000000007-t00002-f000.snappy.parquet",
        ]
    )
    for fa, fb in zip(a, b, strict=True):
        assert (tmp_path / "a" / fa.path).read_bytes() == (tmp_path / "b" / fb.path).read_bytes()
        assert fa.size == fb.size and fa.rows == fb.rows
    assert sum(f.rows for f in a) == 5000
    assert not list(tmp_path.rglob("*.tmp-*"))
    assert not list(tmp_path.rglob(".*"))


def test_files_roll_at_the_target_size_and_keep_partition_columns_out(tmp_path):
    files = write(str(tmp_path), [20_000], target=50_000)
    hr10 = [f for f in files if "hr=10" in f.path]
    assert len(hr10) > 1
    assert [f.path.rsplit("-", 1)[1] for f in hr10][:2] == [
        "f000.snappy.parquet",
        "f001.snappy.parquet",
    ]
    first = pq.read_table(tmp_path / hr10[0].path)
    assert first.column_names == ["v", "_partition", "_offset"]
    assert sum(f.rows for f in files) == 20_000
    assert hr10[0].partition_values == {"dt": "2025-11-22", "hr": "10"}
    assert '"_offset"' in hr10[0].stats


@pytest.mark.parametrize("bad", ["../../etc", "2025/11", "..", ".hidden", "", "a b", None])
def test_a_partition_value_that_could_escape_the_table_is_refused(tmp_path, bad):
    table = pa.table({"v": ["x"], "dt": pa.array([bad], pa.string())})
    w = PartitionedWriter(
        pafs.LocalFileSystem(), str(tmp_path / "t"), table.schema, ["dt"], 1, "t00000", 1 << 20, 10
    )
    with pytest.raises(UnsafePartitionValue):
        w.write(table)
    assert not any(p.is_file() for p in tmp_path.rglob("*"))
