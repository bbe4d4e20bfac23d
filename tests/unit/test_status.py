"""`strata status`: the time left before size-based retention deletes unread messages.

The command against the real broker is in tests/integration/test_status.py.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from strata.operations.status import LAG_HISTORY, ingest_lags, lag_growth, size_time_left


def test_size_based_retention_is_estimated_from_message_size_and_produce_rate():
    # 1,000 unread messages of 200 bytes against 1 MB: 800 kB of room, filled at
    # 50 msgs/s x 200 bytes = 10 kB/s, so 80 s.
    assert size_time_left(1_000_000, 1_000, 200.0, 50.0) == pytest.approx(80.0)
    # Already over the limit: the broker may be deleting unread messages now.
    assert size_time_left(100_000, 1_000, 200.0, 50.0) == 0.0
    # Not growing, or the rate is unknown: no deadline to give.
    assert size_time_left(1_000_000, 1_000, 200.0, 0.0) is None
    assert size_time_left(1_000_000, 1_000, 200.0, None) is None


@pytest.mark.parametrize(
    ("lags", "streak"),
    [
        ([], 0),
        ([5], 0),
        ([5, 9], 1),
        ([1, 2, 3, 4], 3),
        ([9, 1, 2, 3], 2),  # the streak ends at the fall
        ([1, 2, 2, 3], 1),  # as large as before is not growth
        ([1, None, 2, 3], 1),  # an unknown lag ends it
        ([1, 2, 3, 0], 0),  # the newest batch caught up
    ],
)
def test_lag_growth_counts_the_newest_batches_that_each_left_more_behind(lags, streak):
    assert lag_growth(lags) == streak


def test_each_ingest_batch_left_its_rows_high_watermarks_less_their_ends():
    rows = pa.table(
        {
            "batch": [1, 1, 2, 3, 3, 4],
            "kind": ["ingest", "ingest", "backfill", "ingest", "ingest", "ingest"],
            "high_watermark": [100, 50, 10, 300, None, None],
            "end_offset": [80, 50, 0, 200, 7, 9],
        }
    )
    # Batch 2 is a backfill: it leaves no lag. Batch 3's unknown watermark counts as
    # none; batch 4 knows none.
    assert ingest_lags(rows) == [20, 100, None]


def test_only_the_newest_ingest_batches_are_read_for_the_lag_trend():
    batches = list(range(1, 201))
    rows = pa.table(
        {
            "batch": batches,
            "kind": ["ingest"] * len(batches),
            "high_watermark": [1000 + b for b in batches],
            "end_offset": [1000] * len(batches),
        }
    )
    lags = ingest_lags(rows)
    assert lags == list(range(201 - LAG_HISTORY, 201))
    assert lag_growth(lags) == LAG_HISTORY - 1
