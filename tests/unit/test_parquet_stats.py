"""A file's Delta statistics read from its footer's stored bounds, for every kind of column."""

from __future__ import annotations

import datetime as dt
import io

import pyarrow as pa
import pyarrow.parquet as pq

from strata.store.parquet import StatsLayout


def stats(table: pa.Table, row_group_rows: int) -> dict:
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=row_group_rows)
    out.seek(0)
    return StatsLayout(table.schema).stats(pq.read_metadata(out), table.num_rows)


def test_bounds_are_those_of_the_values_whatever_the_type_stores(tmp_path):
    paris = dt.timezone(dt.timedelta(hours=1))
    table = pa.table(
        {
            # Stored signed: a bound past 2**31 read as stored would be negative.
            "u32": pa.array([3, 2**32 - 1], pa.uint32()),
            "i8": pa.array([-128, 5], pa.int8()),
            "f32": pa.array([0.5, -1.5], pa.float32()),
            "s": pa.array(["é", "a"]),
            "ms": pa.array(
                [dt.datetime(2025, 1, 1, 0, 0, 0, 1000, tzinfo=dt.UTC), None],
                pa.timestamp("ms", tz="UTC"),
            ),
            # Another zone, and none: both bounded by their UTC instant as stored.
            "zoned": pa.array(
                [dt.datetime(2025, 1, 1, 1, 0, tzinfo=paris), None],
                pa.timestamp("us", tz="Europe/Paris"),
            ),
            "naive": pa.array([dt.datetime(2025, 1, 1, 0, 0, 0, 1), None], pa.timestamp("us")),
            # Seconds are stored as milliseconds, nanoseconds as nanoseconds.
            "sec": pa.array([1, 2], pa.timestamp("s", tz="UTC")),
            "ns": pa.array([1_000_000, 2_000], pa.timestamp("ns", tz="UTC")),
            "day": pa.array([dt.date(1969, 12, 31), dt.date(2000, 2, 29)]),
        }
    )
    for rows in (2, 1):  # one row group, or two merged
        got = stats(table, rows)
        assert got["minValues"] == {
            "u32": 3,
            "i8": -128,
            "f32": -1.5,
            "s": "a",
            "ms": "2025-01-01T00:00:00.001Z",
            "zoned": "2025-01-01T00:00:00.000Z",
            "naive": "2025-01-01T00:00:00.000Z",
            "sec": "1970-01-01T00:00:01.000Z",
            "ns": "1970-01-01T00:00:00.000Z",
            "day": "1969-12-31",
        }
        assert got["maxValues"] == {
            "u32": 2**32 - 1,
            "i8": 5,
            "f32": 0.5,
            "s": "é",
            "ms": "2025-01-01T00:00:00.001Z",
            "zoned": "2025-01-01T00:00:00.000Z",
            "naive": "2025-01-01T00:00:00.001Z",
            "sec": "1970-01-01T00:00:02.000Z",
            "ns": "1970-01-01T00:00:00.001Z",
            "day": "2000-02-29",
        }
        assert got["nullCount"]["ms"] == 1 and got["nullCount"]["u32"] == 0


def test_a_bound_beyond_what_a_datetime_holds_leaves_the_column_unbounded_but_counted():
    far = 400_000 * 365 * 86_400_000  # milliseconds: some 400,000 years on
    table = pa.table(
        {
            "ms": pa.array([0, far, None], pa.timestamp("ms", tz="UTC")),
            "day": pa.array([0, 4_000_000, None], pa.date32()),
            "n": pa.array([1, 2, 3], pa.int64()),
        }
    )
    for rows in (3, 1):
        got = stats(table, rows)
        # Whichever row group held it, the column has no bounds; the others keep theirs.
        assert got["minValues"] == {"n": 1} and got["maxValues"] == {"n": 3}
        assert got["nullCount"] == {"ms": 1, "day": 1, "n": 0}
