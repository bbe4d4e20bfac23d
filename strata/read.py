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
import pyarrow.compute as pc
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
    single_topic = len({t for t, _ in active}) == 1
    pending: list[pa.Table] = []
    held = 0
    last_progress = time.monotonic()
    last_log = last_progress
    try:
        while active:
            # librdkafka messages are typed Optional throughout; inside a range they are set.
            messages: list[Any] = consumer.consume(10_000, timeout=0.5)
            advanced = False
            errors = [m.error() for m in messages]
            events = (
                [] if all(e is None for e in errors) else list(zip(messages, errors, strict=True))
            )
            data = [m for m, e in events if e is None] if events else messages
            # Messages first, then events: a partition's end-of-log event can arrive in
            # the same batch as its last messages, and must not close the range before
            # they are counted.
            if data:
                table = _to_table(data, batch)
                table, finished = _keep_in_range(table, active, single_topic)
                if table.num_rows:
                    pending.append(table)
                    held += table.num_rows
                    advanced = True
                for key in finished:
                    _finish(consumer, active, key)
                    advanced = True
            if events and _handle_errors(consumer, events, active):
                advanced = True
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
            if held >= chunk_messages:
                yield pa.concat_tables(pending).combine_chunks()
                pending, held = [], 0
        if pending:
            yield pa.concat_tables(pending).combine_chunks()
    finally:
        consumer.close()


def _handle_errors(
    consumer: Consumer,
    events: list[tuple[Any, Any]],
    active: dict[tuple[str, int], RangeProgress],
) -> bool:
    """Act on error events; True if a range finished. Other errors fail the task."""
    finished = False
    for m, err in events:
        if err is None:
            continue
        key = (m.topic(), m.partition())
        state = active.get(key)
        if state is None:
            continue
        if err.code() == KafkaError._PARTITION_EOF:
            # The log ends here. At or past the range's end the rest were gaps.
            if m.offset() >= state.range.end:
                _finish(consumer, active, key)
                finished = True
            continue
        raise ReadError(
            f"partition {key[1]} of `{key[0]}`: {err.str()} while reading "
            f"[{state.range.start}, {state.range.end})"
        )
    return finished


def _to_table(messages: list[Any], batch: int) -> pa.Table:
    """One consume() batch as a raw-schema table: one list comprehension per field."""
    stamps = [m.timestamp() for m in messages]
    headers = [m.headers() for m in messages]
    kinds = pa.array([k for k, _ in stamps], pa.int8())
    ts = pa.array([t for _, t in stamps], pa.int64())
    # Type 0 is "not available": such a message has no Kafka timestamp.
    ts = pc.if_else(pc.equal(kinds, 0), pa.scalar(None, pa.int64()), ts)
    if any(h is not None for h in headers):
        header_rows: list[Any] = [
            None if h is None else [{"key": k, "value": v} for k, v in h] for h in headers
        ]
    else:
        header_rows = headers
    n = len(messages)
    return pa.table(
        [
            pa.array([m.topic() for m in messages], pa.string()),
            pa.array([m.partition() for m in messages], pa.int32()),
            pa.array([m.offset() for m in messages], pa.int64()),
            ts.cast(pa.timestamp("ms", tz="UTC")),
            pa.array([m.key() for m in messages], pa.binary()),
            pa.array([m.value() for m in messages], pa.binary()),
            pa.array(header_rows, RAW_SCHEMA.field("_headers").type),
            pa.repeat(pa.scalar(batch, pa.int64()), n),
        ],
        schema=RAW_SCHEMA,
    )


def _keep_in_range(
    table: pa.Table, active: dict[tuple[str, int], RangeProgress], single_topic: bool
) -> tuple[pa.Table, list[tuple[str, int]]]:
    """Keep the rows inside their partition's range; count them; say which ranges ended."""
    offsets = table.column("_offset")
    partitions = table.column("_partition")
    # Key plus value bytes of every message, computed once; ranges sum their share.
    sizes = pc.add(
        pc.fill_null(pc.binary_length(table.column("_value")), 0),
        pc.fill_null(pc.binary_length(table.column("_key")), 0),
    )
    keep = None
    finished = []
    for key, state in active.items():
        mine = pc.equal(partitions, key[1])
        if not single_topic:
            mine = pc.and_(mine, pc.equal(table.column("_topic"), key[0]))
        if not pc.any(mine).as_py():
            continue
        lower = max(state.range.start, state._last_offset + 1)
        inside = pc.and_(
            mine,
            pc.and_(pc.greater_equal(offsets, lower), pc.less(offsets, state.range.end)),
        )
        keep = inside if keep is None else pc.or_(keep, inside)
        count = int(pc.sum(pc.cast(inside, pa.int64())).as_py() or 0)
        if count:
            state.messages += count
            state.bytes += int(pc.sum(pc.filter(sizes, inside)).as_py() or 0)
            state._last_offset = pc.max(pc.filter(offsets, inside)).as_py()
        # An offset at or past the last one of the range means the range is read.
        if pc.max(pc.filter(offsets, mine)).as_py() >= state.range.end - 1:
            finished.append(key)
    if keep is None:
        return table.slice(0, 0), finished
    return table.filter(keep), finished


def _length(column: pa.ChunkedArray) -> int:
    return int(pc.sum(pc.binary_length(column)).as_py() or 0)


def _finish(
    consumer: Consumer, active: dict[tuple[str, int], RangeProgress], key: tuple[str, int]
) -> None:
    state = active.pop(key)
    state.done = True
    # Stop fetching past the range; the remaining partitions keep the consumer busy.
    consumer.pause([TopicPartition(key[0], key[1])])


def read_raw_copy(
    raw_uri: str,
    storage_options: dict[str, str] | None,
    ranges: list[OffsetRange],
    batch: int,
    progress: dict[tuple[str, int, int], RangeProgress],
) -> Iterator[pa.Table]:
    """Yield the raw copy's messages of the ranges, as `read_ranges` yields Kafka's.

    A backfill of offsets that Kafka's retention has deleted reads them here: the raw
    copy holds every message ever read, with its key, value, headers and timestamp.

    Args:
        raw_uri: The raw copy's Delta table.
        storage_options: Object-store options for deltalake.
        ranges: Ranges to read.
        batch: Batch number stamped on each row.
        progress: Filled in place, keyed by (topic, partition, start).

    Yields:
        Tables in `RAW_SCHEMA`.
    """
    from deltalake import DeltaTable

    from strata.delta import range_filter

    dataset = DeltaTable(raw_uri, storage_options=storage_options).to_pyarrow_dataset()
    for r in ranges:
        state = progress.setdefault((r.topic, r.partition, r.start), RangeProgress(r))
        for chunk in dataset.to_batches(filter=range_filter(r), columns=RAW_SCHEMA.names):
            if chunk.num_rows == 0:
                continue
            table = pa.Table.from_batches([chunk]).cast(RAW_SCHEMA)
            table = table.set_column(
                RAW_SCHEMA.get_field_index("_batch"),
                RAW_SCHEMA.field("_batch"),
                pa.repeat(pa.scalar(batch, pa.int64()), table.num_rows),
            )
            state.messages += table.num_rows
            state.bytes += _length(table.column("_value")) + _length(table.column("_key"))
            yield table
        state.done = True
