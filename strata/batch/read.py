"""Read exact offset ranges from Kafka, inside a Spark task, into Arrow chunks.

A range is done when the consumer's position reaches its end, never when a count
of messages has been seen: compacted topics and transaction markers leave gaps in
offsets, and counting would either hang or read past the range. Gaps are counted,
and once a range is read its runs of missing offsets are confirmed with the broker
(at most `GAP_RUNS_VERIFIED` of them), so a message the read skipped fails the task
instead of passing for a gap.

Offsets of a partition must strictly increase: a redelivered offset is dropped and
counted, so every offset read is kept exactly once. A message whose headers the
Kafka client cannot convert is kept with its key and value and marked for
quarantine, never allowed to crash the task: a batch's plan is saved and resumed,
so a task that fails on one message would fail that batch on every re-run.

The parts: the consumer (`_consumer`), consumed messages as Arrow (`_messages`),
gap runs and their confirmation (`_gaps`), and reading the raw copy back (`_raw`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, TopicPartition

from strata import faults
from strata.batch._consumer import BrokerTrouble, range_consumer
from strata.batch._gaps import GAP_RUNS_VERIFIED, RangeProgress, verify_gaps
from strata.batch._messages import RawChunk, events_apart, to_table
from strata.batch._raw import read_raw_copy
from strata.errors import ReadError
from strata.log import get_logger
from strata.store.ranges import OffsetRange
from strata.store.tables import collector_paused

__all__ = [
    "CHUNK_MESSAGES",
    "GAP_RUNS_VERIFIED",
    "READ_TUNING",
    "RangeProgress",
    "RawChunk",
    "read_ranges",
    "read_raw_copy",
]

logger = get_logger(__name__)

# Consumer settings for reading whole ranges. librdkafka's default prefetch target
# (100k messages) starves a consumer that reads far faster than it fetches; a deeper
# queue, still capped at 64 MB, keeps fetches in flight. The benchmark's reference
# loops use the same settings, so the comparison is like with like. A fetch response
# is at most `fetch.max.bytes`, except that a record batch larger than that is still
# returned whole so the consumer can make progress; librdkafka refuses responses above
# `receive.message.max.bytes`, so that is raised to its maximum: a message the broker
# accepted is never one the task cannot read.
#
# A broker that drops out (a restart, a network blip) is what the read retries: the
# consumer keeps its position and reconnects, backing off from half a second to two,
# so a restarting broker is not hammered and one that is back is found within seconds,
# well inside `limits.read_stall_s`, after which the task fails and Spark retries it.
READ_TUNING: dict[str, Any] = {
    "queued.min.messages": 1_000_000,
    "queued.max.messages.kbytes": 65_536,
    "fetch.max.bytes": 104_857_600,
    "max.partition.fetch.bytes": 26_214_400,
    "receive.message.max.bytes": 2_147_483_647,
    "reconnect.backoff.ms": 500,
    "reconnect.backoff.max.ms": 2_000,
}

# Most messages one consume() call returns.
_CONSUME_BATCH = 10_000

# A chunk goes to decode and write once it holds this many messages (or the
# configured MB of keys and values, whichever comes first).
CHUNK_MESSAGES = 50_000


def read_ranges(
    conf: dict[str, Any],
    ranges: list[OffsetRange],
    batch: int,
    progress: dict[tuple[str, int, int], RangeProgress],
    chunk_messages: int = CHUNK_MESSAGES,
    stall_s: float = 60.0,
    chunk_bytes: int = 64 << 20,
) -> Iterator[RawChunk]:
    """Yield the messages of the ranges as raw-schema chunks.

    A chunk holds at most `chunk_messages` messages and `chunk_bytes` of keys and
    values (a single larger message travels alone), so no binary column comes near
    Arrow's 2 GiB offset limit and a task's memory is bounded by one chunk plus
    librdkafka's queue (`READ_TUNING`).

    Args:
        conf: librdkafka settings (bootstrap and security).
        ranges: Ranges to read; one consumer fetches all of them.
        batch: Batch number stamped on each row.
        progress: Filled in place, keyed by (topic, partition, start).
        chunk_messages: Most messages per chunk.
        stall_s: Fail if no range advances for this long.
        chunk_bytes: Most key and value bytes per chunk.

    Yields:
        Chunks in `RAW_SCHEMA`, in offset order per partition.

    Raises:
        ReadError: If a range stops advancing, the broker reports an error, or a run
            of missing offsets turns out to hold a message the read skipped.
    """
    trouble = BrokerTrouble(conf)
    consumer = range_consumer({**READ_TUNING, **conf, "error_cb": trouble})
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
    read = list(active.values())
    consumer.assign([TopicPartition(t, p, r.range.start) for (t, p), r in active.items()])
    topics = {t for t, _ in active}
    only_topic = next(iter(topics)) if len(topics) == 1 else None
    pending = _Chunker(chunk_messages, chunk_bytes)
    last_progress = time.monotonic()
    last_log = last_progress
    reading = False
    try:
        while active:
            # consume() returns once it holds as many messages as asked for, or when its
            # timeout ends: asking for no more than the ranges still hold lets the read
            # of a range's last messages return as they arrive, not half a second later.
            wanted = min(_CONSUME_BATCH, sum(s.range.end - s.position for s in active.values()))
            # The collector is paused while a batch becomes Arrow: the batch's thousands
            # of messages are objects it tracks, so it ran every few hundred of them,
            # walking the worker's every object each time (half a read's CPU), to find
            # no cycle: messages are freed by their count as soon as they are let go.
            with collector_paused():
                # librdkafka messages are typed Optional throughout; inside a range, set.
                messages: list[Any] = consumer.consume(max(wanted, 1), timeout=0.5)
                data, events = events_apart(messages)
                converted = to_table(data, batch, only_topic) if data else None
                # Only the Arrow copy lives on while a chunk is decoded and written: the
                # consumed messages' own bytes are let go first.
                del messages, data
            advanced = False
            # Messages first, then events: a partition's end-of-log event can arrive in
            # the same batch as its last messages, and must not close the range before
            # they are counted.
            if converted is not None:
                table, unreadable = converted
                # Where a test loses messages between the consumer and the read.
                keep = faults.delivered(table)
                if keep is not None:
                    table, unreadable = _filtered(table, unreadable, keep)
                table, sizes, unreadable, finished = _keep_in_range(
                    table, unreadable, active, only_topic is not None
                )
                if table.num_rows:
                    yield from pending.add(table, sizes, unreadable)
                    if not reading:
                        # Where the broker-restart test freezes a task: part of its
                        # ranges read, the rest still on the broker.
                        faults.reached(faults.MID_READ)
                        reading = True
                    advanced = True
                for key in finished:
                    _finish(consumer, active, key)
                    advanced = True
            if events and _handle_errors(consumer, events, active, trouble.brokers):
                advanced = True
            now = time.monotonic()
            if advanced:
                if trouble.last is not None:
                    # The outage is over (or the client's queue bridged it): say so, since
                    # its refusals were logged and the batch still lands whole.
                    logger.warning(
                        "batch %s: reading on after %.1fs without progress, while %s could "
                        "not be reached (%s)",
                        batch,
                        now - last_progress,
                        trouble.brokers,
                        trouble.last,
                    )
                    trouble.last = None
                last_progress = now
            elif now - last_progress > stall_s:
                stuck = ", ".join(
                    f"partition {p} of `{t}` at offset {s.position} "
                    f"of [{s.range.start}, {s.range.end})"
                    for (t, p), s in active.items()
                )
                raise ReadError(
                    f"no progress for {stall_s:.0f}s: {stuck}; {trouble.why_stuck()}. Nothing "
                    "of the batch is committed, and the next run reads the same offsets"
                )
            if now - last_log > 10:
                last_log = now
                waiting = (
                    f" ({trouble.why_stuck()}; retrying for up to {stall_s:.0f}s)"
                    if trouble.last is not None
                    else ""
                )
                for (t, p), st in active.items():
                    logger.info(
                        "batch %s reading `%s` p%s: %s of %s offsets%s",
                        batch,
                        t,
                        p,
                        f"{st.messages:,}",
                        f"{st.range.count:,}",
                        waiting,
                    )
    finally:
        consumer.close()
    verify_gaps(conf, read, stall_s)
    if pending.rows:
        yield pending.take()


class _Chunker:
    """Rows read but not yet handed on, cut into chunks at a message and byte bound."""

    def __init__(self, max_messages: int, max_bytes: int) -> None:
        self.max_messages, self.max_bytes = max_messages, max_bytes
        self.tables: list[pa.Table] = []
        self.rows = 0
        self.bytes = 0
        self.rejected: dict[int, str] = {}

    def add(
        self, table: pa.Table, sizes: pa.Array, rejected: Mapping[int, str]
    ) -> Iterator[RawChunk]:
        """Take rows (with each one's key plus value bytes); yield every full chunk."""
        total = len(sizes)
        whole = pc.sum(sizes).as_py() or 0
        if self.rows + total < self.max_messages and self.bytes + whole < self.max_bytes:
            # The usual case: all of it fits, and the chunk is not full yet.
            for row, reason in rejected.items():
                self.rejected[self.rows + row] = reason
            self.tables.append(table)
            self.rows += total
            self.bytes += whole
            return
        # Bytes before each row, so a prefix's bytes are one subtraction away.
        upto = pc.cumulative_sum(sizes.cast(pa.int64()))
        at = 0
        while at < total:
            before = upto[at - 1].as_py() if at else 0
            fits_bytes = pc.sum(
                pc.less_equal(upto.slice(at), before + self.max_bytes - self.bytes)
            ).as_py()
            take = min(total - at, self.max_messages - self.rows, fits_bytes or 0)
            if take == 0 and self.rows == 0:
                take = 1  # one message larger than a chunk travels alone
            if take:
                for row, reason in rejected.items():
                    if at <= row < at + take:
                        self.rejected[self.rows + row - at] = reason
                self.tables.append(table.slice(at, take))
                self.rows += take
                self.bytes += upto[at + take - 1].as_py() - before
                at += take
            if at < total or self.rows >= self.max_messages or self.bytes >= self.max_bytes:
                # Yielded straight from the call, so no frame holds the chunk while the
                # caller decodes and writes it.
                yield self.take()

    def take(self) -> RawChunk:
        """What is held, as one chunk; the chunker is left empty."""
        tables, rejected = self.tables, self.rejected
        self.tables, self.rows, self.bytes, self.rejected = [], 0, 0, {}
        return RawChunk(pa.concat_tables(tables).combine_chunks(), rejected)


def _handle_errors(
    consumer: Consumer,
    events: list[tuple[Any, Any]],
    active: dict[tuple[str, int], RangeProgress],
    brokers: str,
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
            f"[{state.range.start}, {state.range.end}) from {brokers}"
        )
    return finished


def _filtered(
    table: pa.Table, unreadable: dict[int, str], keep: pa.Array
) -> tuple[pa.Table, dict[int, str]]:
    """Rows where `keep` holds, with the unreadable rows' indices moved along."""
    if unreadable:
        flags = keep.to_pylist()
        moved, at = {}, 0
        for row, kept in enumerate(flags):
            if kept:
                if row in unreadable:
                    moved[at] = unreadable[row]
                at += 1
        unreadable = moved
    return table.filter(keep), unreadable


def _keep_in_range(
    table: pa.Table,
    unreadable: dict[int, str],
    active: dict[tuple[str, int], RangeProgress],
    single_topic: bool,
) -> tuple[pa.Table, pa.Array, dict[int, str], list[tuple[str, int]]]:
    """Keep each partition's new offsets inside its range; count them; say which ended.

    An offset is kept once: it must lie in the range and above every offset of its
    partition kept before, in this batch or earlier ones. One at or below is a
    redelivery, dropped and counted. Offsets before the range's start are not part
    of it and are dropped silently, as librdkafka may hand over the start of the
    record batch that holds the first one.

    Returns:
        The rows kept, their key plus value bytes, the unreadable rows among them,
        and the ranges whose end was reached.
    """
    offsets = table.column("_offset").combine_chunks()
    partitions = table.column("_partition").combine_chunks()
    # Key plus value bytes of every message, computed once; ranges sum their share.
    sizes = pc.add(
        pc.fill_null(pc.binary_length(table.column("_value")), 0),
        pc.fill_null(pc.binary_length(table.column("_key")), 0),
    ).combine_chunks()
    keep = None
    kept_rows = 0
    finished = []
    for key, state in active.items():
        mine = pc.equal(partitions, key[1])
        if not single_topic:
            mine = pc.and_(mine, pc.equal(table.column("_topic").combine_chunks(), key[0]))
        delivered = pc.filter(offsets, mine)
        if not len(delivered):
            continue
        r = state.range
        floor = state.position - 1
        bounds = pc.min_max(delivered)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        # An offset at or past the last one of the range means the range is read.
        if high >= r.end - 1:
            finished.append(key)
        if low > floor and high < r.end:
            inside, candidates = mine, delivered  # the usual case: all of them are new
        else:
            inside = pc.and_(
                mine, pc.and_(pc.greater_equal(offsets, r.start), pc.less(offsets, r.end))
            )
            candidates = pc.filter(offsets, inside)
            if not len(candidates):
                continue
        steps = pc.min_max(pc.pairwise_diff(candidates))
        if candidates[0].as_py() <= floor or (steps["min"].as_py() or 1) <= 0:
            inside, candidates = _drop_redelivered(state, inside, candidates, floor)
            if not len(candidates):
                continue
            holes = True
        else:
            holes = candidates[0].as_py() > floor + 1 or (steps["max"].as_py() or 1) > 1
        count = len(candidates)
        state.messages += count
        state.bytes += pc.sum(pc.filter(sizes, inside)).as_py() or 0
        state.offset_sum += pc.sum(candidates).as_py()
        if state.first_offset is None:
            state.first_offset = candidates[0].as_py()
        if holes:
            _note_gaps(state, candidates, floor)
        state.last_offset = candidates[count - 1].as_py()
        kept_rows += count
        keep = inside if keep is None else pc.or_(keep, inside)
    if keep is None:
        return table.slice(0, 0), sizes.slice(0, 0), {}, finished
    if kept_rows == table.num_rows:
        return table, sizes, unreadable, finished
    table, unreadable = _filtered(table, unreadable, keep)
    return table, pc.filter(sizes, keep), unreadable, finished


def _drop_redelivered(
    state: RangeProgress, inside: pa.Array, candidates: pa.Array, floor: int
) -> tuple[pa.Array, pa.Array]:
    """Narrow a partition's rows to offsets above every one delivered before them."""
    # The highest offset delivered before each row, this batch's and earlier.
    before = pc.max_element_wise(
        pa.concat_arrays(
            [
                pa.array([floor], pa.int64()),
                pc.cumulative_max(candidates).slice(0, len(candidates) - 1),
            ]
        ),
        floor,
    )
    fresh = pc.greater(candidates, before)
    state.redelivered += len(candidates) - pc.sum(fresh).as_py()
    return _only(inside, fresh), pc.filter(candidates, fresh)


def _only(inside: pa.Array, fresh: pa.Array) -> pa.Array:
    """`inside` with the rows it selects narrowed to those where `fresh` holds."""
    flags = iter(fresh.to_pylist())
    return pa.array([bool(i) and next(flags) for i in inside.to_pylist()], pa.bool_())


def _note_gaps(state: RangeProgress, kept: pa.Array, floor: int) -> None:
    """Record the runs of missing offsets before each kept offset."""
    previous = pa.concat_arrays([pa.array([floor], pa.int64()), kept.slice(0, len(kept) - 1)])
    missing = pc.greater(pc.subtract(kept, previous), 1)
    if not pc.any(missing).as_py():
        return
    starts = pc.add(pc.filter(previous, missing), 1).to_pylist()
    state.note_runs(starts, pc.filter(kept, missing).to_pylist())


def _finish(
    consumer: Consumer, active: dict[tuple[str, int], RangeProgress], key: tuple[str, int]
) -> None:
    state = active.pop(key)
    state.done = True
    state.finish_runs()
    # Stop fetching past the range; the remaining partitions keep the consumer busy.
    consumer.pause([TopicPartition(key[0], key[1])])
