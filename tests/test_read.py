"""Reading exact ranges from the real broker."""

from __future__ import annotations

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from strata.plan import OffsetRange
from strata.read import RangeProgress, ReadError, read_ranges

pytestmark = pytest.mark.integration


def _fill(broker, topic: str, partitions: int, per: int) -> None:
    broker.create_topic(topic, partitions)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for p in range(partitions):
        for i in range(per):
            producer.produce(topic, b'{"n": %d}' % i, partition=p)
    producer.flush(30)
    broker.seal(topic, list(range(partitions)), b'{"n": -1}')


def _read(broker, ranges, **kw):
    progress: dict[tuple[str, int, int], RangeProgress] = {}
    tables = list(read_ranges({"bootstrap.servers": broker.bootstrap}, ranges, 5, progress, **kw))
    table = pa.concat_tables(tables) if tables else None
    return table, progress


@pytest.mark.parametrize("per", [40, 10_000])
def test_whole_partitions_are_read_to_the_last_offset_with_no_false_gaps(broker, per):
    # Read to the end of the log, the end-of-log event often arrives in the same
    # consume() batch as the last messages; they must still be counted.
    topic = f"read-whole-{per}"
    _fill(broker, topic, 3, per)
    for _ in range(3):
        table, progress = _read(broker, [OffsetRange(topic, p, 0, per + 1) for p in range(3)])
        landed = zip(
            table.column("_partition").to_pylist(), table.column("_offset").to_pylist(), strict=True
        )
        assert sorted(landed) == [(p, o) for p in range(3) for o in range(per + 1)]
        assert all(s.messages == per + 1 and s.gaps == 0 and s.done for s in progress.values())
    assert set(table.column("_batch").to_pylist()) == {5}


def test_a_range_inside_the_log_reads_exactly_that_range(broker):
    _fill(broker, "read-mid", 1, 500)
    table, progress = _read(broker, [OffsetRange("read-mid", 0, 120, 130)], chunk_messages=3)
    assert table.column("_offset").to_pylist() == list(range(120, 130))
    [state] = progress.values()
    assert state.messages == 10 and state.bytes == sum(
        len(v) for v in table.column("_value").to_pylist()
    )


def test_a_range_past_the_end_of_the_log_fails_after_the_stall_limit(broker):
    _fill(broker, "read-short", 1, 10)
    with pytest.raises(
        ReadError,
        match=r"no progress for 2s: partition 0 of `read-short` at offset 11 of \[0, 50\)",
    ):
        _read(broker, [OffsetRange("read-short", 0, 0, 50)], stall_s=2)
