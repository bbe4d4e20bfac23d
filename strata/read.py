"""Read exact offset ranges from Kafka, inside a Spark task, into Arrow chunks.

A range is done when the consumer's position reaches its end, never when a count
of messages has been seen: compacted topics and transaction markers leave gaps in
offsets, and counting would either hang or read past the range. Gaps are counted.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, TopicPartition

from strata.plan import OffsetRange
from strata.schema import RAW_SCHEMA

# Consumer settings for reading whole ranges. librdkafka's default prefetch target
# (100k messages) starves a consumer that reads far faster than it fetches; a deeper
# queue, still capped at 64 MB per partition, keeps fetches in flight. The benchmark's
# reference loops use the same settings, so the comparison is like with like.
READ_TUNING: dict[str, Any] = {
    "queued.min.messages": 1_000_000,
    "queued.max.messages.kbytes": 65_536,
    "fetch.max.bytes": 104_857_600,
    "max.partition.fetch.bytes": 26_214_400,
}


class ReadError(Exception):
    """A planned range could not be read."""


@dataclass
class RangeProgress:
    """How far one range has been read.

    Attributes:
        range: The planned range.
        messages: Messages read inside the range.
        bytes: Key and value bytes read.
        done: Whether the consumer's position reached the range's end.
    """

    range: OffsetRange
    messages: int = 0
    bytes: int = 0
    done: bool = False
    _last_offset: int = field(default=-1, repr=False)

    @property
    def gaps(self) -> int:
        """Offsets in the range that held no message (compaction, transaction markers)."""
        return self.range.count - self.messages


def read_ranges(
    conf: dict[str, Any],
    ranges: list[OffsetRange],
    batch: int,
    progress: dict[tuple[str, int, int], RangeProgress],
    chunk_messages: int = 50_000,
    stall_s: float = 60.0,
) -> Iterator[pa.Table]:
    """Yield the messages of the ranges as raw-schema Arrow tables.

    Args:
        conf: librdkafka settings (bootstrap and security).
        ranges: Ranges to read; one consumer fetches all of them.
        batch: Batch number stamped on each row.
        progress: Filled in place, keyed by (topic, partition, start).
        chunk_messages: Messages per yielded table.
        stall_s: Fail if no range advances for this long.

    Yields:
        Tables in `RAW_SCHEMA`, in offset order per partition.

    Raises:
        ReadError: If a range stops advancing, or the broker reports an error.
    """
    consumer = Consumer(
        {
            **READ_TUNING,
            **conf,
            # The group is never joined (assign, not subscribe) and never committed to.
            "group.id": conf.get("group.id", "strata-reader"),
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "auto.offset.reset": "error",
        }
    )
    active: dict[tuple[str, int], RangeProgress] = {}
    for r in ranges:
        tracked = progress.setdefault((r.topic, r.partition, r.start), RangeProgress(r))
        if r.count > 0:
            active[(r.topic, r.partition)] = tracked
        else:
            tracked.done = True
    if not active:
        consumer.close()
        return
    consumer.assign([TopicPartition(t, p, r.range.start) for (t, p), r in active.items()])
    cols = _Columns(batch)
    last_progress = time.monotonic()
    last_log = last_progress
    try:
        while active:
            # librdkafka messages are typed Optional throughout; inside a range they are set.
            messages: list[Any] = consumer.consume(10_000, timeout=0.5)
            advanced = False
            for m in messages:
                key = (m.topic(), m.partition())
                state = active.get(key)
                if state is None:
                    continue
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        # The log ends here. At or past the range's end the rest were gaps.
                        if m.offset() >= state.range.end:
                            _finish(consumer, active, key)
                            advanced = True
                        continue
                    raise ReadError(
                        f"partition {key[1]} of `{key[0]}`: {err.str()} while reading "
                        f"[{state.range.start}, {state.range.end})"
                    )
                offset = m.offset()
                if offset >= state.range.end:
                    _finish(consumer, active, key)
                    advanced = True
                    continue
                if offset < state.range.start or offset <= state._last_offset:
                    continue
                state._last_offset = offset
                value = m.value()
                msg_key = m.key()
                state.messages += 1
                state.bytes += (len(value) if value else 0) + (len(msg_key) if msg_key else 0)
                cols.add(m, value, msg_key)
                advanced = True
                if offset == state.range.end - 1:
                    _finish(consumer, active, key)
            now = time.monotonic()
            if advanced:
                last_progress = now
            elif now - last_progress > stall_s:
                stuck = ", ".join(
                    f"partition {p} of `{t}` at offset {max(s._last_offset + 1, s.range.start)} "
                    f"of [{s.range.start}, {s.range.end})"
                    for (t, p), s in active.items()
                )
                raise ReadError(
                    f"no progress for {stall_s:.0f}s: {stuck}; the broker no longer serves "
                    "the planned offsets or is unreachable"
                )
            if now - last_log > 10:
                last_log = now
                for (t, p), st in active.items():
                    sys.stderr.write(
                        f"strata: batch {batch} reading `{t}` p{p}: {st.messages:,} of "
                        f"{st.range.count:,} offsets\n"
                    )
            if cols.size >= chunk_messages:
                yield cols.flush()
        if cols.size:
            yield cols.flush()
    finally:
        consumer.close()


def _finish(
    consumer: Consumer, active: dict[tuple[str, int], RangeProgress], key: tuple[str, int]
) -> None:
    state = active.pop(key)
    state.done = True
    # Stop fetching past the range; the remaining partitions keep the consumer busy.
    consumer.pause([TopicPartition(key[0], key[1])])


class _Columns:
    """Accumulates message fields column by column; far cheaper than row objects."""

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self._reset()

    def _reset(self) -> None:
        self.topic: list[str] = []
        self.partition: list[int] = []
        self.offset: list[int] = []
        self.ts: list[int | None] = []
        self.key: list[bytes | None] = []
        self.value: list[bytes | None] = []
        self.headers: list[list[dict[str, Any]] | None] = []

    @property
    def size(self) -> int:
        return len(self.offset)

    def add(self, m: Any, value: bytes | None, key: bytes | None) -> None:  # noqa: ANN401
        self.topic.append(m.topic())
        self.partition.append(m.partition())
        self.offset.append(m.offset())
        kind, ts = m.timestamp()
        self.ts.append(ts if kind != 0 and ts >= 0 else None)
        self.key.append(key)
        self.value.append(value)
        headers = m.headers()
        self.headers.append([{"key": k, "value": v} for k, v in headers] if headers else None)

    def flush(self) -> pa.Table:
        n = len(self.offset)
        table = pa.table(
            [
                pa.array(self.topic, pa.string()),
                pa.array(self.partition, pa.int32()),
                pa.array(self.offset, pa.int64()),
                pa.array(self.ts, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
                pa.array(self.key, pa.binary()),
                pa.array(self.value, pa.binary()),
                pa.array(self.headers, RAW_SCHEMA.field("_headers").type),
                pa.array([self.batch] * n, pa.int64()),
            ],
            schema=RAW_SCHEMA,
        )
        self._reset()
        return table
