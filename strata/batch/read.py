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
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from strata import faults
from strata.batch.plan import OffsetRange
from strata.errors import ReadError
from strata.log import get_logger
from strata.schema.avro import RAW_SCHEMA

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

# Most runs of missing offsets confirmed with the broker per range, spread evenly
# over the range's runs with the first and last included. Each costs one seek and
# one small fetch; a compacted topic has a run per removed stretch, so all of them
# would cost as much as the read.
GAP_RUNS_VERIFIED = 32

# The verifier only needs the first message at an offset: small fetches, no prefetch,
# and no pause after one (librdkafka waits a second by default once its queue holds
# `queued.min.messages`), so a run costs one round trip.
_VERIFY_TUNING: dict[str, Any] = {
    "queued.min.messages": 1,
    "queued.max.messages.kbytes": 1_024,
    "fetch.max.bytes": 1_048_576,
    "max.partition.fetch.bytes": 65_536,
    "fetch.wait.max.ms": 10,
    "fetch.queue.backoff.ms": 0,
    "receive.message.max.bytes": 2_147_483_647,
}


# Messages are always consume()d and never built by hand; headers() is read through
# the method itself so a failure can be pinned on one message (see `_headers`).
_HEADERS = Message.headers
_TIMESTAMP, _TOPIC, _PARTITION = Message.timestamp, Message.topic, Message.partition
_OFFSET, _KEY, _VALUE, _ERROR = Message.offset, Message.key, Message.value, Message.error


class _BrokerTrouble:
    """What the client last reported about reaching the brokers; its `error_cb`.

    librdkafka reports a refused or dropped connection here, not as a message, and
    keeps retrying: the read only needs it to say why it is stuck if it gives up.
    """

    def __init__(self, conf: Mapping[str, Any]) -> None:
        servers = str(conf.get("bootstrap.servers", ""))
        self.several = "," in servers
        self.brokers = f"the broker{'s' if self.several else ''} at {servers}"
        self.last: str | None = None

    def __call__(self, err: KafkaError) -> None:
        # "1/1 brokers are down" follows each refusal: keep the refusal, which says why.
        if err.code() != KafkaError._ALL_BROKERS_DOWN or self.last is None:
            self.last = err.str()

    def why_stuck(self) -> str:
        """The brokers, named, and what is known of why they serve nothing."""
        if self.last is None:
            serve = "serve" if self.several else "serves"
            return f"{self.brokers} no longer {serve} the planned offsets"
        return f"{self.brokers} cannot be reached ({self.last})"


@dataclass
class RangeProgress:
    """How far one range has been read.

    Attributes:
        range: The planned range.
        messages: Distinct offsets read inside the range.
        bytes: Key and value bytes of those messages.
        done: Whether the consumer's position reached the range's end.
        redelivered: Messages delivered again at or below the last offset kept, and
            dropped.
        offset_sum: Sum of the offsets kept: a checksum the written files must match.
        first_offset: First offset kept, or None.
        last_offset: Last offset kept, or None.
        gap_runs: Runs of consecutive offsets inside the range that held no message.
        gap_runs_verified: Of those, the runs the broker confirmed hold no message
            (0 for reads that have no broker, such as the raw copy's).
    """

    range: OffsetRange
    messages: int = 0
    bytes: int = 0
    done: bool = False
    redelivered: int = 0
    offset_sum: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    gap_runs: int = 0
    gap_runs_verified: int = 0
    # Runs whose global index is a multiple of the stride, and the latest run: an
    # evenly spread sample of every run seen, in bounded memory.
    _stride: int = field(default=1, repr=False)
    _picked: list[tuple[int, int, int]] = field(default_factory=list, repr=False)
    _latest: tuple[int, int, int] | None = field(default=None, repr=False)

    @property
    def gaps(self) -> int:
        """Offsets in the range that held no message (compaction, transaction markers)."""
        return self.range.count - self.messages

    @property
    def position(self) -> int:
        """The next offset the read expects."""
        return self.range.start if self.last_offset is None else self.last_offset + 1

    def note_runs(self, starts: list[int], ends: list[int]) -> None:
        """Record runs of missing offsets `[start, end)`, in offset order."""
        count = len(starts)
        if not count:
            return
        base, total = self.gap_runs, self.gap_runs + count
        stride = self._stride
        while total > 2 * GAP_RUNS_VERIFIED * stride:
            stride *= 2
        if stride != self._stride:
            self._stride = stride
            self._picked = [run for run in self._picked if run[0] % stride == 0]
        for i in range((-base) % stride, count, stride):
            self._picked.append((base + i, starts[i], ends[i]))
        self._latest = (total - 1, starts[-1], ends[-1])
        self.gap_runs = total

    def runs_to_verify(self) -> list[tuple[int, int]]:
        """At most `GAP_RUNS_VERIFIED` runs, spread evenly, first and last included."""
        candidates = list(self._picked)
        if self._latest is not None and (not candidates or candidates[-1] != self._latest):
            candidates.append(self._latest)
        if len(candidates) > GAP_RUNS_VERIFIED:
            last = len(candidates) - 1
            steps = GAP_RUNS_VERIFIED - 1
            candidates = [candidates[round(i * last / steps)] for i in range(steps + 1)]
        return [(start, end) for _, start, end in candidates]

    def finish_runs(self) -> None:
        """Record the run between the last offset kept and the range's end."""
        if self.position < self.range.end:
            self.note_runs([self.position], [self.range.end])


@dataclass(frozen=True)
class RawChunk:
    """A chunk of messages handed to decode and write.

    Attributes:
        table: Messages in `RAW_SCHEMA`, in offset order per partition.
        rejected: Row index to the reason a message must go to quarantine whatever
            its value holds (its headers could not be read).
    """

    table: pa.Table
    rejected: Mapping[int, str]


def range_consumer(conf: dict[str, Any]) -> Consumer:
    """A consumer that reads assigned offsets exactly: committed records only, no group.

    The group is never joined (assign, not subscribe) and never committed to; an offset
    out of range is an error rather than a silent jump, and each partition's end is
    reported, so a range ends on position.
    """
    return Consumer(
        {
            **conf,
            "group.id": conf.get("group.id", "strata-reader"),
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "auto.offset.reset": "error",
        }
    )


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
    trouble = _BrokerTrouble(conf)
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
            with _collector_paused():
                # librdkafka messages are typed Optional throughout; inside a range, set.
                messages: list[Any] = consumer.consume(max(wanted, 1), timeout=0.5)
                data, events = _events_apart(messages)
                converted = _to_table(data, batch, only_topic) if data else None
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


def verify_gaps(conf: dict[str, Any], states: list[RangeProgress], stall_s: float) -> None:
    """Confirm with the broker that the ranges' runs of missing offsets hold no message.

    For each run (at most `GAP_RUNS_VERIFIED` per range), a consumer seeks to its
    first offset: the first message the broker returns must lie at or past the run's
    end. A compacted stretch, an aborted transaction or a transaction marker passes;
    a message the read skipped does not.

    Args:
        conf: librdkafka settings (bootstrap and security).
        states: Ranges read completely.
        stall_s: Fail if the broker answers nothing for this long.

    Raises:
        ReadError: Naming the partition and the offset a run turned out to hold.
    """
    todo = [(s, run) for s in states for run in s.runs_to_verify()]
    if not todo:
        return
    trouble = _BrokerTrouble(conf)
    verifier = range_consumer({**conf, **_VERIFY_TUNING, "error_cb": trouble})
    try:
        for state, (start, end) in todo:
            r = state.range
            found = _first_offset_from(verifier, r, start, stall_s, trouble)
            if found < end:
                raise ReadError(
                    f"partition {r.partition} of `{r.topic}`: offset {found} holds a message "
                    f"but the read of [{r.start}, {r.end}) skipped it (it counted "
                    f"[{start}, {end}) as a gap); nothing of the batch is committed. Run "
                    "again; if it recurs, the consumer or the broker loses messages"
                )
            state.gap_runs_verified += 1
    finally:
        verifier.close()


def _first_offset_from(
    consumer: Consumer, r: OffsetRange, offset: int, stall_s: float, trouble: _BrokerTrouble
) -> int:
    """The offset of the first message (or the log end) at or after `offset`."""
    consumer.assign([TopicPartition(r.topic, r.partition, offset)])
    deadline = time.monotonic() + stall_s
    while time.monotonic() < deadline:
        found: list[Any] = consumer.consume(1, timeout=0.5)
        for m in found:
            err = m.error()
            if err is None or err.code() == KafkaError._PARTITION_EOF:
                # At the end of the log, the event's offset is the log end: nothing lies
                # between `offset` and it.
                return int(m.offset())
            raise ReadError(
                f"partition {r.partition} of `{r.topic}`: {err.str()} while confirming that "
                f"offset {offset} of [{r.start}, {r.end}) holds no message ({trouble.brokers})"
            )
    raise ReadError(
        f"no answer for {stall_s:.0f}s while confirming that offset {offset} of partition "
        f"{r.partition} of `{r.topic}` holds no message; {trouble.why_stuck()}. Nothing of "
        "the batch is committed, and the next run reads the same offsets"
    )


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block (if it was running)."""
    running = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if running:
            gc.enable()


def _events_apart(messages: list[Any]) -> tuple[list[Any], list[tuple[Any, Any]]]:
    """A consumed batch's messages, and its events (an error, a partition's end) with theirs."""
    errors = list(map(_ERROR, messages))
    # By identity: a KafkaError compared with None leaves a TypeError set (list.count).
    if all(e is None for e in errors):
        return messages, []
    pairs = list(zip(messages, errors, strict=True))
    return [m for m, e in pairs if e is None], [(m, e) for m, e in pairs if e is not None]


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


def _headers(messages: list[Any]) -> tuple[list[Any], dict[int, str]]:
    """Every message's headers, and why those of some could not be read.

    confluent-kafka decodes header keys as UTF-8. For a key that is not, `headers()`
    raises SystemError (from a UnicodeDecodeError) and caches a half-built list whose
    key is a null pointer: calling it again on that message returns the list, and
    touching the key crashes the interpreter. So each message's `headers()` is called
    exactly once; `list.extend` keeps what was read before a failure, which pins it
    on one message.
    """
    headers: list[Any] = []
    unreadable: dict[int, str] = {}
    while True:
        try:
            headers.extend(map(_HEADERS, messages[len(headers) :] if unreadable else messages))
            return headers, unreadable
        except Exception as exc:  # noqa: BLE001 - any failure is this one message's
            unreadable[len(headers)] = _header_problem(exc)
            headers.append(None)


def _header_problem(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__ or exc
    if isinstance(cause, UnicodeDecodeError):
        raw = bytes(cause.object)
        shown = repr(raw[:64]) + ("..." if len(raw) > 64 else "")
        return (
            f"headers unreadable by the Kafka client: header key {shown} is not UTF-8 "
            f"({cause.reason} at byte {cause.start})"
        )
    return f"headers unreadable by the Kafka client: {type(cause).__name__}: {cause}"


def _to_table(
    messages: list[Any], batch: int, topic: str | None
) -> tuple[pa.Table, dict[int, str]]:
    """One consume() batch as a raw-schema table: one pass per field.

    Fields are read through the methods themselves, mapped over the batch (no Python
    frame per message), as this runs once per message read.

    Args:
        messages: The batch's messages, none of them an event.
        batch: Batch number stamped on each row.
        topic: The only topic the consumer reads, or None if it reads several.

    Returns:
        The table, and the rows whose headers could not be read (kept with null
        headers) with the reason.
    """
    n = len(messages)
    kinds, stamps = zip(*map(_TIMESTAMP, messages), strict=True) if n else ((), ())
    headers, unreadable = _headers(messages)
    ts = pa.array(stamps, pa.int64())
    # Type 0 is "not available": such a message has no Kafka timestamp.
    ts = pc.if_else(pc.equal(pa.array(kinds, pa.int8()), 0), pa.scalar(None, pa.int64()), ts)
    if headers.count(None) != n:
        header_rows: list[Any] = [
            None if h is None else [{"key": k, "value": v} for k, v in h] for h in headers
        ]
        header_column = pa.array(header_rows, RAW_SCHEMA.field("_headers").type)
    else:
        header_column = pa.nulls(n, RAW_SCHEMA.field("_headers").type)
    topics = (
        pa.array(list(map(_TOPIC, messages)), pa.string())
        if topic is None
        else pa.repeat(pa.scalar(topic, pa.string()), n)
    )
    table = pa.table(
        [
            topics,
            pa.array(list(map(_PARTITION, messages)), pa.int32()),
            pa.array(list(map(_OFFSET, messages)), pa.int64()),
            ts.cast(pa.timestamp("ms", tz="UTC")),
            # Over 2 GiB of keys or values (a few huge messages at once), pyarrow
            # returns a chunked array rather than overflow; chunks are cut below that.
            pa.array(list(map(_KEY, messages)), pa.binary()),
            pa.array(list(map(_VALUE, messages)), pa.binary()),
            header_column,
            pa.repeat(pa.scalar(batch, pa.int64()), n),
            pa.array([unreadable.get(i) for i in range(n)], pa.string())
            if unreadable
            else pa.nulls(n, pa.string()),
        ],
        schema=RAW_SCHEMA,
    )
    return table, unreadable


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


def _length(column: pa.ChunkedArray) -> int:
    return int(pc.sum(pc.binary_length(column)).as_py() or 0)


def _finish(
    consumer: Consumer, active: dict[tuple[str, int], RangeProgress], key: tuple[str, int]
) -> None:
    state = active.pop(key)
    state.done = True
    state.finish_runs()
    # Stop fetching past the range; the remaining partitions keep the consumer busy.
    consumer.pause([TopicPartition(key[0], key[1])])


def read_raw_copy(
    raw_uri: str,
    storage_options: dict[str, str] | None,
    ranges: list[OffsetRange],
    batch: int,
    progress: dict[tuple[str, int, int], RangeProgress],
    only_batch: int | None = None,
) -> Iterator[RawChunk]:
    """Yield the raw copy's messages of the ranges, as `read_ranges` yields Kafka's.

    A backfill of offsets that Kafka's retention has deleted reads them here: the raw
    copy holds every message ever read, with its key, value, headers, timestamp and
    whatever the client could not read of it. Its files come in no particular order,
    so offsets are summed but neither checked for order nor split into gap runs, and
    there is no broker to confirm gaps with. Each offset must appear once: after a
    topic was re-created and read again from its start, the raw copy holds two
    messages at one offset, and reading both would land both.

    Args:
        raw_uri: The raw copy's Delta table.
        storage_options: Object-store options for deltalake.
        ranges: Ranges to read.
        batch: Batch number stamped on each row.
        progress: Filled in place, keyed by (topic, partition, start).
        only_batch: Read only the rows this batch wrote (a batch resumed from its own
            committed raw copy).

    Yields:
        Chunks in `RAW_SCHEMA`.

    Raises:
        ReadError: If the raw copy holds an offset of a range more than once.
    """
    # Imported here: pyarrow.dataset brings pandas along, seconds of CPU in every Spark
    # worker that only reads from Kafka.
    import pyarrow.dataset as ds
    from deltalake import DeltaTable

    from strata.store.delta import range_filter

    dataset = DeltaTable(raw_uri, storage_options=storage_options).to_pyarrow_dataset()
    present = [name for name in RAW_SCHEMA.names if name in dataset.schema.names]
    for r in ranges:
        state = progress.setdefault((r.topic, r.partition, r.start), RangeProgress(r))
        wanted = range_filter(r)
        if only_batch is not None:
            wanted = wanted & (ds.field("_batch") == only_batch)
        seen: list[pa.Array] = []
        for chunk in dataset.to_batches(filter=wanted, columns=present):
            if chunk.num_rows == 0:
                continue
            table = pa.Table.from_batches([chunk])
            for name in RAW_SCHEMA.names:
                if name not in present:  # a raw copy written before the column existed
                    table = table.append_column(name, pa.nulls(table.num_rows, pa.string()))
            table = table.select(RAW_SCHEMA.names).cast(RAW_SCHEMA)
            table = table.set_column(
                RAW_SCHEMA.get_field_index("_batch"),
                RAW_SCHEMA.field("_batch"),
                pa.repeat(pa.scalar(batch, pa.int64()), table.num_rows),
            )
            offsets = table.column("_offset")
            seen.append(offsets.combine_chunks())
            state.messages += table.num_rows
            state.bytes += _length(table.column("_value")) + _length(table.column("_key"))
            state.offset_sum += pc.sum(offsets).as_py()
            low, high = pc.min(offsets).as_py(), pc.max(offsets).as_py()
            state.first_offset = low if state.first_offset is None else min(state.first_offset, low)
            state.last_offset = high if state.last_offset is None else max(state.last_offset, high)
            errors = table.column("_read_error")
            rejected = {
                int(i): errors[int(i)].as_py()
                for i in pc.indices_nonzero(pc.is_valid(errors)).to_pylist()
            }
            yield RawChunk(table, rejected)
        if seen and pc.count_distinct(pa.chunked_array(seen)).as_py() != state.messages:
            counts = pa.chunked_array(seen).value_counts()
            twice = pc.filter(counts.field("values"), pc.greater(counts.field("counts"), 1))
            raise ReadError(
                f"{r.describe()}: the raw copy holds offset {twice[0].as_py()} (and "
                f"{len(twice) - 1} more) more than once: two logs were read under these "
                "offsets (a topic deleted and created again, then read from its start). "
                "Nothing was committed; give a range only one log covers."
            )
        state.done = True
