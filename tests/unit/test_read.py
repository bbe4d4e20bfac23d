"""What a read keeps of the messages it receives: redeliveries dropped, gap runs recorded.

Reads from the real broker are in tests/integration/test_read.py.
"""

from __future__ import annotations

import pyarrow as pa

from strata.batch.read import GAP_RUNS_VERIFIED, RangeProgress, _keep_in_range
from strata.schema.avro import RAW_SCHEMA
from strata.store.ranges import OffsetRange


def test_redelivered_offsets_are_dropped_and_counted_and_gap_runs_recorded():
    state = RangeProgress(OffsetRange("t", 0, 10, 40))
    active = {("t", 0): state}

    def batch(offsets):
        n = len(offsets)
        return pa.table(
            {
                "_topic": ["t"] * n,
                "_partition": pa.array([0] * n, pa.int32()),
                "_offset": pa.array(offsets, pa.int64()),
                "_kafka_ts": pa.array([None] * n, pa.timestamp("ms", tz="UTC")),
                "_key": pa.array([b"k"] * n),
                "_value": pa.array([b"vv"] * n),
                "_headers": pa.array([None] * n, RAW_SCHEMA.field("_headers").type),
                "_batch": pa.array([1] * n, pa.int64()),
                "_read_error": pa.nulls(n, pa.string()),
            },
            schema=RAW_SCHEMA,
        )

    # 9 lies before the range; 11 and 12 come again; 14-15 and 18-19 are missing.
    kept, sizes, unreadable, finished = _keep_in_range(
        batch([9, 10, 11, 12, 11, 12, 13, 16]), {5: "bad headers"}, active, True
    )
    assert kept["_offset"].to_pylist() == [10, 11, 12, 13, 16]
    assert sizes.to_pylist() == [3] * 5
    assert unreadable == {}  # the row marked unreadable was a redelivery, dropped
    assert (state.messages, state.redelivered, state.offset_sum) == (5, 2, 62)
    kept, _, unreadable, finished = _keep_in_range(
        batch([15, 16, 17, 20, 21]), {1: "bad headers", 2: "bad headers"}, active, True
    )
    assert kept["_offset"].to_pylist() == [17, 20, 21]
    assert unreadable == {0: "bad headers"}
    assert (state.messages, state.redelivered, state.offset_sum) == (8, 4, 120)
    assert (state.first_offset, state.last_offset, state.gaps) == (10, 21, 22)
    assert state.gap_runs == 2 and state.runs_to_verify() == [(14, 16), (18, 20)]
    assert finished == []
    state.finish_runs()
    assert state.runs_to_verify() == [(14, 16), (18, 20), (22, 40)]


def test_many_gap_runs_are_sampled_evenly_with_the_first_and_last():
    state = RangeProgress(OffsetRange("t", 0, 0, 10_000))
    every = [(2 * k + 1, 2 * k + 2) for k in range(1_500)]  # every odd offset is missing
    for at in range(0, len(every), 50):
        part = every[at : at + 50]
        state.note_runs([a for a, _ in part], [b for _, b in part])
    assert state.gap_runs == 1_500
    runs = state.runs_to_verify()
    assert len(set(runs)) == GAP_RUNS_VERIFIED
    assert runs[0] == every[0] and runs[-1] == every[-1]
    indices = [every.index(r) for r in runs]
    assert indices == sorted(indices)
    # Evenly spread: no stretch between two confirmed runs is much longer than 1/31st.
    assert max(b - a for a, b in zip(indices, indices[1:], strict=False)) <= 2 * 1_500 // 31
