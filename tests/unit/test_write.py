"""File writing: deterministic bytes, names unique per attempt, bounded open files."""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from strata.batch.write import PartitionedWriter, split_by
from strata.errors import UnsafePartitionValue
from strata.store.parquet import file_name, is_batch_file, write_file


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


def write(root: str, chunks: list[int], target: int = 1 << 30, **names) -> list:
    table = rows(sum(chunks))
    w = PartitionedWriter(
        pafs.LocalFileSystem(), root, table.schema, ["dt", "hr"], 7, "t00002", target, 1000, **names
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
            "dt=2025-11-22/hr=10/part-b0000000007-t00002-a0-f000.snappy.parquet",
            "dt=2025-11-22/hr=11/part-b0000000007-t00002-a0-f000.snappy.parquet",
        ]
    )
    for fa, fb in zip(a, b, strict=True):
        assert (tmp_path / "a" / fa.path).read_bytes() == (tmp_path / "b" / fb.path).read_bytes()
        assert fa.size == fb.size and fa.rows == fb.rows
    assert sum(f.rows for f in a) == 5000
    assert not list(tmp_path.rglob("*.tmp-*"))
    assert not list(tmp_path.rglob(".*"))


def test_another_attempt_or_run_writes_beside_never_over_the_files_of_the_first(tmp_path):
    first = write(str(tmp_path), [3000])
    before = {f.path: (tmp_path / f.path).read_bytes() for f in first}
    retry = write(str(tmp_path), [100], attempt=1)
    zombie = write(str(tmp_path), [200], run_id="20251122T100000Z_2f9c")
    assert [f.path for f in retry] == [
        "dt=2025-11-22/hr=10/part-b0000000007-t00002-a1-f000.snappy.parquet",
        "dt=2025-11-22/hr=11/part-b0000000007-t00002-a1-f000.snappy.parquet",
    ]
    assert zombie[0].path.endswith("-t00002-a0-20251122T100000Z_2f9c-f000.snappy.parquet")
    # The first attempt's files are untouched, byte for byte.
    assert {p: (tmp_path / p).read_bytes() for p in before} == before
    on_disk = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.parquet")}
    assert on_disk == {f.path for f in first + retry + zombie}
    assert all(is_batch_file(p, 7) for p in on_disk)


def test_batch_files_are_told_apart_by_batch_whatever_the_attempt():
    name = file_name(3, "t00001", 0, attempt=2, run_id="abc")
    assert name == "part-b0000000003-t00001-a2-abc-f000.snappy.parquet"
    assert is_batch_file(name, 3)
    assert is_batch_file(f"dt=2025-11-22/hr=10/{name}", 3)
    assert is_batch_file(f"dt=2025-11-22/.{name}.tmp-0123abcd", 3)
    assert is_batch_file("part-b0000000003-x00004-f000.snappy.parquet", 3)
    assert not is_batch_file(name, 30)
    assert not is_batch_file(file_name(30, "t00001", 0), 3)
    assert not is_batch_file("ledger-b0000000003.parquet", 3)
    with pytest.raises(ValueError, match="run id"):
        file_name(3, "t00001", 0, run_id="../x")


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
    table = pa.table({"v": ["x", "y"], "dt": pa.array(["2025-11-22", bad], pa.string())})
    w = PartitionedWriter(
        pafs.LocalFileSystem(), str(tmp_path / "t"), table.schema, ["dt"], 1, "t00000", 1 << 20, 10
    )
    with pytest.raises(UnsafePartitionValue):
        w.write(table)
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_split_by_gives_each_value_its_rows_in_their_order():
    rng = random.Random(3)
    n = 20_000
    dts = [f"2025-11-{rng.randrange(1, 29):02d}" for _ in range(n)]
    hrs = [f"{rng.randrange(24):02d}" for _ in range(n)]
    table = pa.table({"i": pa.array(range(n), pa.int64()), "dt": dts, "hr": hrs})
    # Cut into chunks, as tables concatenated from several reads are.
    chunked = pa.concat_tables([table.slice(0, 7000), table.slice(7000)])
    parts = split_by(chunked, ["dt", "hr"])
    expected: dict[tuple[str, str], list[int]] = {}
    for i, key in enumerate(zip(dts, hrs, strict=True)):
        expected.setdefault(key, []).append(i)
    assert [k for k, _ in parts] == sorted(expected)
    assert {k: t.column("i").to_pylist() for k, t in parts} == expected
    assert all(t.column("dt").to_pylist() == [k[0]] * t.num_rows for k, t in parts)
    [(only, whole)] = split_by(table.filter(pc.equal(table.column("hr"), "05")), ["hr"])
    assert only == ("05",) and whole.num_rows == len([h for h in hrs if h == "05"])


class _CountingFileSystem(pafs.LocalFileSystem):
    """The local filesystem, noting how many files under a root are open at each open."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.watched = str(root)
        self.most_open = 0

    def _open_now(self) -> int:
        count = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}").startswith(self.watched):
                    count += 1
            except OSError:
                continue
        return count

    def open_output_stream(self, path, compression="detect", buffer_size=None, metadata=None):
        stream = super().open_output_stream(path, compression, buffer_size, metadata)
        self.most_open = max(self.most_open, self._open_now())
        return stream


def test_thousands_of_hours_never_hold_more_open_files_than_allowed_and_lose_no_row(tmp_path):
    hours = 2000
    n = 30_000
    rng = random.Random(11)
    moments = [rng.randrange(hours) for _ in range(n)]
    table = pa.table(
        {
            "_topic": pa.array(["clicks"] * n),
            "_partition": pa.array([i % 3 for i in range(n)], pa.int32()),
            "_offset": pa.array(range(n), pa.int64()),
            "v": pa.array([f"payload-{i}" for i in range(n)]),
            "dt": pa.array([f"2025-{1 + m // 720:02d}-{1 + m // 24 % 30:02d}" for m in moments]),
            "hr": pa.array([f"{m % 24:02d}" for m in moments]),
        }
    )
    root = tmp_path / "table"
    fs = _CountingFileSystem(root)
    w = PartitionedWriter(
        fs,
        str(root),
        table.schema,
        ["dt", "hr"],
        1,
        "t00000",
        1 << 30,
        500,
        buffer_bytes=512 << 10,
        max_open_files=8,
    )
    for at in range(0, n, 3000):
        w.write(table.slice(at, 3000))
        assert w.open_files <= 8
    files = w.close()
    assert w.open_files == 0
    assert 0 < fs.most_open <= 8
    assert len({tuple(f.partition_values.values()) for f in files}) == hours
    # The write buffer filled up before the end, so some hours got a second, later file.
    assert len(files) > hours
    contents = []
    for f in files:
        stored = pq.ParquetFile(root / f.path)
        content = stored.read()
        assert stored.metadata.num_rows == f.rows == content.num_rows
        per: Counter[str] = Counter()
        sums: Counter[str] = Counter()
        for p, o in zip(
            content["_partition"].to_pylist(), content["_offset"].to_pylist(), strict=True
        ):
            per[f"clicks:{p}"] += 1
            sums[f"clicks:{p}"] += o
        assert f.offsets == {k: [per[k], sums[k]] for k in per}
        hour = f.partition_values["dt"] + f.partition_values["hr"]
        contents.append(content.append_column("hour", pa.array([hour] * f.rows)))
    back = pa.concat_tables(contents).sort_by("_offset")
    assert back.column("_offset").to_pylist() == list(range(n))
    assert back.column("v").to_pylist() == table.column("v").to_pylist()
    assert back.column("hour").to_pylist() == [
        d + h for d, h in zip(table["dt"].to_pylist(), table["hr"].to_pylist(), strict=True)
    ]


def test_a_file_reports_rows_and_offset_sums_per_partition(tmp_path):
    table = pa.table(
        {
            "_topic": ["a", "a", "b", "a", "b"],
            "_partition": pa.array([0, 1, 0, 0, 0], pa.int32()),
            "_offset": pa.array([10, 5, 7, 11, 9], pa.int64()),
            "v": ["x"] * 5,
        }
    )
    written = write_file(pafs.LocalFileSystem(), str(tmp_path), "f.parquet", table, {})
    assert written.offsets == {"a:0": [2, 21], "a:1": [1, 5], "b:0": [2, 16]}
    assert written.rows == pq.read_metadata(tmp_path / "f.parquet").num_rows == 5
    plain = write_file(pafs.LocalFileSystem(), str(tmp_path), "g.parquet", pa.table({"v": [1]}), {})
    assert plain.offsets == {}


def test_offsets_counted_per_chunk_match_each_files_rows_where_row_groups_cut_chunks(tmp_path):
    # Two Kafka partitions interleaved over two hours, in chunks that row groups of 7 rows
    # cut in the middle, and files rolled after a few groups: each file's reported
    # offsets must be those of the rows it holds.
    n = 400
    table = pa.table(
        {
            "_topic": pa.array(["clicks"] * n),
            "_partition": pa.array([i % 2 for i in range(n)], pa.int32()),
            "_offset": pa.array([i // 2 for i in range(n)], pa.int64()),
            "v": pa.array([f"payload-{i}" for i in range(n)]),
            "dt": pa.array(["2025-11-22"] * n),
            "hr": pa.array(["10" if i % 5 else "11" for i in range(n)]),
        }
    )
    w = PartitionedWriter(
        pafs.LocalFileSystem(), str(tmp_path), table.schema, ["dt", "hr"], 3, "t00001", 2000, 7
    )
    for at, size in [(0, 1), (1, 12), (13, 100), (113, 3), (116, 284)]:
        w.write(table.slice(at, size))
    files = w.close()
    assert len(files) > 2
    total: Counter[str] = Counter()
    for f in files:
        content = pq.read_table(tmp_path / f.path)
        per: Counter[str] = Counter()
        sums: Counter[str] = Counter()
        for p, o in zip(
            content["_partition"].to_pylist(), content["_offset"].to_pylist(), strict=True
        ):
            per[f"clicks:{p}"] += 1
            sums[f"clicks:{p}"] += o
        assert f.offsets == {k: [per[k], sums[k]] for k in per}
        total.update(per)
    assert total == {"clicks:0": n // 2, "clicks:1": n // 2}
