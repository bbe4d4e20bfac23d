"""Runs of missing offsets: sampled as a range is read, then confirmed with the broker.

A range's gaps (compaction, transaction markers) are runs of offsets that held no
message. Once the range is read, at most `GAP_RUNS_VERIFIED` of its runs, spread
evenly, are confirmed with the broker, so a message the read skipped fails the task
instead of passing for a gap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from strata.batch._consumer import BrokerTrouble, range_consumer
from strata.errors import ReadError
from strata.store.ranges import OffsetRange

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
    trouble = BrokerTrouble(conf)
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
    consumer: Consumer, r: OffsetRange, offset: int, stall_s: float, trouble: BrokerTrouble
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
