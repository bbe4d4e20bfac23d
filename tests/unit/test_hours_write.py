"""The many small files of a batch over thousands of event hours: their statistics and sizes."""

from __future__ import annotations

import datetime as dt
import json
import os
import random

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from strata.batch.write import PartitionedWriter
from strata.store.parquet import StatsLayout, delta_stats


def mixed() -> pa.Table:
    """Four rows over two hours, of every kind of column the statistics treat apart."""
    utc = dt.UTC
    return pa.table(
        {
            "n": pa.array([3, None, -7, 12], pa.int64()),
            "s": pa.array(["b", "a", None, "x" * 65]),
            "f": pa.array([0.0, float("nan"), -0.0, 2.5]),
            "ts": pa.array(
                [
                    dt.datetime(2025, 11, 22, 10, 0, 0, 1500, tzinfo=utc),
                    None,
                    dt.datetime(2025, 11, 22, 10, 59, 59, 999001, tzinfo=utc),
                    dt.datetime(2025, 11, 22, 10, 30, tzinfo=utc),
                ],
                pa.timestamp("us", tz="UTC"),
            ),
            "d": pa.array([dt.date(2025, 1, 2), dt.date(2024, 12, 31), None, None]),
            "st": pa.array(
                [{"x": 1, "y": "q"}, None, {"x": None, "y": "p"}, {"x": 5, "y": None}],
                pa.struct([("x", pa.int32()), ("y", pa.string())]),
            ),
            "l": pa.array([[1], [], None, [2, 3]], pa.list_(pa.int32())),
            "bin": pa.array([b"\x00", None, b"\xff", b"a"], pa.binary()),
            "hr": pa.array(["10", "10", "10", "11"]),
        }
    )


def test_each_files_statistics_are_those_of_its_own_rows_over_its_row_groups(tmp_path):
    table = mixed()
    # Rows per row group 2: hour 10's file has two row groups, so its bounds are merged.
    w = PartitionedWriter(
        pafs.LocalFileSystem(), str(tmp_path), table.schema, ["hr"], 1, "t00000", 1 << 30, 2
    )
    w.write(table.slice(0, 3))
    w.write(table.slice(3))
    ten, eleven = w.close()
    assert pq.read_metadata(tmp_path / ten.path).num_row_groups == 2
    assert json.loads(ten.stats) == {
        "numRecords": 3,
        # NaN is no bound; -0.0 and 0.0 bound zero from both sides; times to milliseconds,
        # the lower bound down and the upper one up (into the next hour).
        "minValues": {
            "n": -7,
            "s": "a",
            "f": -0.0,
            "ts": "2025-11-22T10:00:00.001Z",
            "d": "2024-12-31",
            "st": {"x": 1, "y": "p"},
        },
        "maxValues": {
            "n": 3,
            "s": "b",
            "f": 0.0,
            "ts": "2025-11-22T11:00:00.000Z",
            "d": "2025-01-02",
            "st": {"x": 1, "y": "q"},
        },
        # A struct's null counts are its fields'; lists have none; binary only counts.
        "nullCount": {
            "n": 1,
            "s": 1,
            "f": 0,
            "ts": 1,
            "d": 1,
            "st": {"x": 2, "y": 1},
            "bin": 1,
        },
    }
    assert str(json.loads(ten.stats)["minValues"]["f"]) == "-0.0"
    assert json.loads(eleven.stats) == {
        "numRecords": 1,
        # A string longer than 64 characters is left out of the bounds, not its null count.
        "minValues": {"n": 12, "f": 2.5, "ts": "2025-11-22T10:30:00.000Z", "st": {"x": 5}},
        "maxValues": {"n": 12, "f": 2.5, "ts": "2025-11-22T10:30:00.000Z", "st": {"x": 5}},
        "nullCount": {
            "n": 0,
            "s": 0,
            "f": 0,
            "ts": 0,
            "d": 1,
            "st": {"x": 0, "y": 1},
            "bin": 0,
        },
    }


def test_one_layout_gives_every_files_statistics_as_the_footer_alone_does(tmp_path):
    table = mixed().drop_columns(["hr"])
    layout = StatsLayout(table.schema)
    for n, rows in enumerate([table, table.slice(1, 2), table.slice(3), table.slice(0, 0)]):
        pq.write_table(rows, tmp_path / f"{n}.parquet", row_group_size=2)
        footer = pq.read_metadata(tmp_path / f"{n}.parquet")
        fresh = delta_stats(footer, table.schema, rows.num_rows)
        assert layout.stats(footer, rows.num_rows) == fresh
        assert fresh["numRecords"] == rows.num_rows
    # The last file has no rows: no bounds and no counts, as from its footer.
    assert fresh == {"numRecords": 0, "minValues": {}, "maxValues": {}, "nullCount": {}}


def clicks(n: int, hours: int) -> pa.Table:
    payload = random.Random(5)
    return pa.table(
        {
            "_topic": pa.array(["clicks"] * n),
            "_partition": pa.array([0] * n, pa.int32()),
            "_offset": pa.array(range(n), pa.int64()),
            "v": pa.array([payload.randbytes(48).hex() for _ in range(n)]),
            "hr": pa.array([f"{i % hours:02d}" for i in range(n)]),
        }
    )


def test_a_files_reported_size_is_its_size_on_disk(tmp_path):
    # Small row groups and a small target: files of one and of several row groups; and
    # one large file, past what a file holds before it goes to disk.
    for name, hours, target, group in (("small", 40, 4000, 20), ("large", 1, 1 << 30, 1000)):
        table = clicks(5000, hours)
        root = tmp_path / name
        w = PartitionedWriter(
            pafs.LocalFileSystem(), str(root), table.schema, ["hr"], 1, "t00000", target, group
        )
        for at in range(0, table.num_rows, 700):
            w.write(table.slice(at, 700))
        files = w.close()
        for f in files:
            assert f.size == os.path.getsize(root / f.path)
            assert f.rows == pq.read_metadata(root / f.path).num_rows
        assert sum(f.rows for f in files) == table.num_rows
        groups = [pq.read_metadata(root / f.path).num_row_groups for f in files]
        if name == "small":
            assert len(files) > hours and min(groups) == 1 and max(groups) > 1
        else:
            assert len(files) == 1 and groups == [5] and files[0].size > 1 << 18
