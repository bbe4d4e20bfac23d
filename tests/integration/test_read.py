"""Reading exact ranges from Apache Kafka.

The bookkeeping of a read (redeliveries, gap runs) is checked in tests/unit/test_read.py.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from strata.batch.read import GAP_RUNS_VERIFIED, RangeProgress, read_ranges
from strata.errors import ReadError
from strata.store.ranges import OffsetRange
from tests.faults import Injected, installed
from tests.kafka_wire import WireRecord, produce


def _fill(broker, topic: str, partitions: int, per: int) -> None:
    broker.create_topic(topic, partitions)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for p in range(partitions):
        for i in range(per):
            producer.produce(topic, b'{"n": %d}' % i, partition=p)
    producer.flush(30)


def _chunks(broker, ranges, **kw):
    progress: dict[tuple[str, int, int], RangeProgress] = {}
    chunks = list(read_ranges({"bootstrap.servers": broker.bootstrap}, ranges, 5, progress, **kw))
    return chunks, progress


def _read(broker, ranges, **kw):
    chunks, progress = _chunks(broker, ranges, **kw)
    table = pa.concat_tables(c.table for c in chunks) if chunks else None
    return table, progress


@pytest.mark.parametrize("per", [40, 10_000])
def test_whole_partitions_are_read_to_the_last_offset_with_no_false_gaps(broker, per):
    # Read to the end of the log, the end-of-log event often arrives in the same
    # consume() batch as the last messages; they must still be counted.
    topic = f"read-whole-{per}"
    _fill(broker, topic, 3, per)
    for _ in range(3):
        table, progress = _read(broker, [OffsetRange(topic, p, 0, per) for p in range(3)])
        landed = zip(
            table.column("_partition").to_pylist(), table.column("_offset").to_pylist(), strict=True
        )
        assert sorted(landed) == [(p, o) for p in range(3) for o in range(per)]
        for s in progress.values():
            assert s.messages == per and s.gaps == 0 and s.done
            assert (s.first_offset, s.last_offset) == (0, per - 1)
            assert s.offset_sum == (per - 1) * per // 2
            assert s.redelivered == s.gap_runs == s.gap_runs_verified == 0
    assert set(table.column("_batch").to_pylist()) == {5}


def test_a_range_inside_the_log_reads_exactly_that_range(broker):
    _fill(broker, "read-mid", 1, 500)
    chunks, progress = _chunks(broker, [OffsetRange("read-mid", 0, 120, 130)], chunk_messages=3)
    assert [c.table.num_rows for c in chunks] == [3, 3, 3, 1]
    table = pa.concat_tables(c.table for c in chunks)
    assert table.column("_offset").to_pylist() == list(range(120, 130))
    [state] = progress.values()
    assert state.messages == 10 and state.bytes == sum(
        len(v) for v in table.column("_value").to_pylist()
    )
    assert state.offset_sum == sum(range(120, 130)) and state.gap_runs == 0


def test_a_range_past_the_end_of_the_log_fails_after_the_stall_limit(broker):
    _fill(broker, "read-short", 1, 10)
    with pytest.raises(
        ReadError,
        match=r"no progress for 2s: partition 0 of `read-short` at offset 10 of \[0, 50\)",
    ):
        _read(broker, [OffsetRange("read-short", 0, 0, 50)], stall_s=2)


def test_a_header_key_the_client_cannot_convert_marks_its_message_and_spares_the_rest(broker):
    topic = "read-bad-header"
    broker.create_topic(topic, 1)
    # One record batch, so the broker serves these in one fetch and one consume().
    produce(
        broker.bootstrap,
        topic,
        0,
        [
            WireRecord(b'{"n": 0}', b"k0", [(b"trace", b"a")], 1_000),
            WireRecord(b'{"n": 1}', b"k1", [(b"\xff\xfeid", b"b"), (b"ok", b"c")], 1_001),
            WireRecord(b'{"n": 2}', b"k2", [(b"\xc3\x28", None)], 1_002),
            WireRecord(b'{"n": 3}', None, [(b"span", b"d")], 1_003),
        ],
    )
    chunks, progress = _chunks(broker, [OffsetRange(topic, 0, 0, 4)])
    [chunk] = chunks
    rows = chunk.table.to_pylist()
    assert [r["_offset"] for r in rows] == [0, 1, 2, 3]
    assert [r["_key"] for r in rows] == [b"k0", b"k1", b"k2", None]
    assert [r["_value"] for r in rows] == [b'{"n": %d}' % i for i in range(4)]
    assert [r["_headers"] for r in rows] == [
        [{"key": "trace", "value": b"a"}],
        None,
        None,
        [{"key": "span", "value": b"d"}],
    ]
    assert dict(chunk.rejected) == {
        1: "headers unreadable by the Kafka client: header key b'\\xff\\xfeid' is not UTF-8 "
        "(invalid start byte at byte 0)",
        2: "headers unreadable by the Kafka client: header key b'\\xc3(' is not UTF-8 "
        "(invalid continuation byte at byte 0)",
    }
    [state] = progress.values()
    assert state.messages == 4 and state.gaps == 0


def test_chunks_are_cut_by_bytes_and_a_message_above_librdkafkas_default_limit_is_read(broker):
    topic = "read-large"
    mb = 1 << 20
    # Kafka refuses record batches above 1 MB unless the topic allows more.
    broker.create_topic(topic, 1, {"max.message.bytes": str(200 * mb)})
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "message.max.bytes": 200 * mb,
            "batch.num.messages": 1,
            "linger.ms": 0,
        }
    )
    # 24 messages of 1.5 MB, then one of 101 MB: above the 100 MB response size that
    # librdkafka accepts by default, which would stall the read for ever.
    sizes = [3 * mb // 2] * 24 + [101 * mb, 10]
    for i, size in enumerate(sizes):
        producer.produce(topic, bytes([65 + i % 26]) * size, key=b"k%d" % i, partition=0)
        producer.flush(60)
    chunks, progress = _chunks(
        broker, [OffsetRange(topic, 0, 0, len(sizes))], chunk_bytes=4 * mb, stall_s=30
    )
    held = [
        sum(len(v) for v in c.table["_value"].to_pylist() + c.table["_key"].to_pylist())
        for c in chunks
    ]
    offsets = [c.table["_offset"].to_pylist() for c in chunks]
    assert [o for chunk in offsets for o in chunk] == list(range(len(sizes)))
    # Two 1.5 MB messages fit in 4 MB, a third does not; the large one travels alone.
    assert offsets[:12] == [[2 * i, 2 * i + 1] for i in range(12)]
    assert offsets[12] == [24]
    assert all(h <= 4 * mb for i, h in enumerate(held) if i != 12)
    assert held[12] == 101 * mb + 3
    assert [len(v) for v in chunks[12].table["_value"].to_pylist()] == [101 * mb]
    [state] = progress.values()
    assert state.messages == len(sizes) and state.bytes == sum(held)


def _transactions(broker, topic: str, plan: list[tuple[int, bool]]) -> list[int]:
    """Produce transactions (size, commit?); the values of the committed messages."""
    broker.create_topic(topic, 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": topic})
    producer.init_transactions(30)
    values = []
    for txn, (n, commit) in enumerate(plan):
        producer.begin_transaction()
        for i in range(n):
            value = json.dumps({"txn": txn, "i": i, "commit": commit}).encode()
            producer.produce(topic, value, partition=0)
            if commit:
                values.append(value)
        # Sent before an abort, as a failing application's would be: an abort purges what
        # the client still holds, and the aborted records would never reach the log.
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    # The last commit marker is written after commit_transaction returns.
    broker.wait_until_stable(topic)
    return values


def _runs(offsets: list[int], end: int) -> int:
    """Maximal runs of offsets in [0, end) missing from a sorted list."""
    present = set(offsets)
    return sum(1 for o in range(end) if o not in present and (o == 0 or o - 1 in present))


def test_gaps_of_a_transactional_topic_are_confirmed_with_the_broker(broker):
    plan = [(5, True), (3, False), (4, True), (2, False), (6, True)]
    committed = _transactions(broker, "read-txn", plan)
    _, end = broker_watermarks(broker, "read-txn")
    table, progress = _read(broker, [OffsetRange("read-txn", 0, 0, end)])
    assert table["_value"].to_pylist() == committed
    [state] = progress.values()
    # Offsets 0-4 committed, 5 its marker, 6-8 aborted (kept in the log, skipped by a
    # read_committed consumer), 9 their marker; then 10-13, 14, 15-16, 17, 18-23, 24.
    assert end == 25 and state.gaps == end - len(committed) == 10
    # Each aborted transaction and the markers around it make one run; the last commit's
    # marker another: three runs.
    assert state.gap_runs == _runs(table["_offset"].to_pylist(), end) == 3
    assert state.gap_runs_verified == 3


def test_at_most_the_configured_number_of_runs_is_confirmed(broker):
    plan = [(2, True)] * 40
    committed = _transactions(broker, "read-txn-many", plan)
    _, end = broker_watermarks(broker, "read-txn-many")
    table, progress = _read(broker, [OffsetRange("read-txn-many", 0, 0, end)])
    assert table["_value"].to_pylist() == committed
    [state] = progress.values()
    assert state.gap_runs == _runs(table["_offset"].to_pylist(), end) == 40
    assert state.gap_runs_verified == GAP_RUNS_VERIFIED


def broker_watermarks(broker, topic: str) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "watermarks"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()


def test_a_message_the_read_skipped_is_not_passed_off_as_a_gap(broker):
    _fill(broker, "read-skip", 2, 300)
    with (
        installed(Injected(skip=("read-skip", 1, 57))),
        pytest.raises(
            ReadError,
            match=r"partition 1 of `read-skip`: offset 57 holds a message but the read of "
            r"\[0, 300\) skipped it",
        ),
    ):
        _read(broker, [OffsetRange("read-skip", p, 0, 300) for p in range(2)])
