"""Plan a batch: which offsets of which partitions it reads, and how tasks split them.

The decisions are pure functions of the committed offsets and the broker's
watermarks, so they are tested with literal values. The plan is persisted before
any task runs: a retry of an unfinished batch reads exactly the planned ranges,
whatever the broker holds by then.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Collection
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from strata.config import Decoding, KafkaSource
from strata.errors import PlanError
from strata.store.files import (
    delete_object,
    filesystem,
    list_names,
    put_if_absent,
    read_bytes,
)
from strata.store.places import Places
from strata.store.ranges import OffsetRange

# The operations that read committed ranges again, replacing their rows.
Reprocess = Literal["backfill", "replay"]


@dataclass(frozen=True)
class PartitionState:
    """What is known of one partition when planning.

    A transaction left open holds a partition's last stable offset below its high
    watermark: a `read_committed` reader (every Strata reader) gets nothing past it
    until the transaction ends, so a batch plans to it (`high`), and the rest counts
    as lag held back (`held_back`), never as read.

    Attributes:
        topic: Kafka topic.
        partition: Partition number.
        low: The broker's log start offset.
        high: Where a batch may read up to: the last stable offset, which is the high
            watermark unless a transaction is open.
        committed: End offset of the last committed batch, or None if never read.
        at_start: For a partition never read, when `starting_offsets` is a moment: the
            first offset at or after it, as the brokers answered; None otherwise.
        log_end: The high watermark (the log end, as a `read_uncommitted` reader sees
            it) where it lies above `high`; None where they are equal.
        unstable_since_ms: Where `log_end` is set: the Kafka timestamp of the message at
            the first unstable offset (`high`), the first of the open transaction, when
            the brokers gave it.
    """

    topic: str
    partition: int
    low: int
    high: int
    committed: int | None
    at_start: int | None = None
    log_end: int | None = None
    unstable_since_ms: int | None = None

    @property
    def high_watermark(self) -> int:
        """The partition's high watermark: what lag counts up to."""
        return self.high if self.log_end is None else max(self.log_end, self.high)

    @property
    def held_back(self) -> int:
        """Offsets between the last stable offset and the high watermark: held back from
        every `read_committed` reader by a transaction still open."""
        return self.high_watermark - self.high


@dataclass(frozen=True)
class BatchPlan:
    """One batch, as persisted before reading.

    Attributes:
        pipeline: Pipeline name.
        batch: Batch number (the Delta app-transaction version).
        ranges: Every partition's range, empty ones included (they record a start).
        splits: Ranges grouped into tasks; each inner list is one Spark task.
        new_partitions: Partitions this batch reads for the first time.
        fingerprint: Hash of the settings that decide where a message lands; a resumed
            batch must decode exactly as it began.
        created_at: When the plan was made (informational).
        watermarks: Each partition's high watermark when planned (`topic:partition`),
            so the ledger can tell how far behind the log each batch ended.
        kind: `ingest` (the next offsets), or `backfill` or `replay` (committed ranges again).
        note: Why, for a backfill.
        source: `kafka`, or `raw` when a backfill reads the raw copy.
        losses: Ranges deleted by retention before they were read, accepted for this
            batch and recorded in the ledger.
        topic_ids: The brokers' id of each topic when planned, where they keep one: a
            topic re-created before the batch is finished is not read as the same log.
        began: Why each new partition (`topic:partition`) starts where it does; the
            ledger keeps it with the partition's first range.
        reader_schema: The Avro schema the batch is read with, when the table follows
            its Schema Registry subject (`schema_registry.evolve`); empty otherwise.
        rebuild: For a replay that rebuilds tables gone or replaced (`strata replay
            --rebuild`), those tables: they are made afresh from the raw copy, and the
            ledger vouches for the new ones once the replay is committed.
    """

    pipeline: str
    batch: int
    ranges: list[OffsetRange]
    splits: list[list[OffsetRange]]
    new_partitions: list[tuple[str, int]] = field(default_factory=list)
    fingerprint: str = ""
    created_at: str = ""
    watermarks: dict[str, int] = field(default_factory=dict)
    kind: str = "ingest"
    note: str = ""
    source: str = "kafka"
    losses: list[OffsetRange] = field(default_factory=list)
    topic_ids: dict[str, str] = field(default_factory=dict)
    began: dict[str, str] = field(default_factory=dict)
    reader_schema: str = ""
    rebuild: tuple[str, ...] = ()

    @property
    def offsets(self) -> int:
        """Offsets spanned by the whole batch."""
        return sum(r.count for r in self.ranges)

    def to_json(self) -> str:
        """Serialise the plan.

        Built by hand rather than with `asdict` (which deep-copies every value) and
        written without indentation (which Python's JSON encoder does in pure Python):
        a plan over thousands of partitions took half a second to save.
        """
        body = {f.name: getattr(self, f.name) for f in fields(self)}
        body["ranges"] = [_range_body(r) for r in self.ranges]
        body["splits"] = [[_range_body(r) for r in split] for split in self.splits]
        body["losses"] = [_range_body(r) for r in self.losses]
        return json.dumps(body, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> BatchPlan:
        """Read a serialised plan."""
        body: dict[str, Any] = json.loads(text)
        return cls(
            pipeline=body["pipeline"],
            batch=body["batch"],
            ranges=[OffsetRange(**r) for r in body["ranges"]],
            splits=[[OffsetRange(**r) for r in s] for s in body["splits"]],
            new_partitions=[(t, p) for t, p in body.get("new_partitions", [])],
            fingerprint=body.get("fingerprint", ""),
            created_at=body.get("created_at", ""),
            watermarks=body.get("watermarks", {}),
            kind=body.get("kind", "ingest"),
            note=body.get("note", ""),
            source=body.get("source", "kafka"),
            losses=[OffsetRange(**r) for r in body.get("losses", [])],
            topic_ids=dict(body.get("topic_ids", {})),
            began=dict(body.get("began", {})),
            reader_schema=body.get("reader_schema", ""),
            rebuild=tuple(body.get("rebuild", ())),
        )


def _range_body(r: OffsetRange) -> dict[str, Any]:
    """An offset range as a saved plan holds it."""
    return {"topic": r.topic, "partition": r.partition, "start": r.start, "end": r.end}


def plan_ranges(
    states: list[PartitionState],
    starting_offsets: str,
    max_offsets_per_partition: int,
    accept_loss: bool = False,
    committed: Collection[tuple[str, int]] = (),
) -> tuple[list[OffsetRange], list[tuple[str, int]], list[OffsetRange]]:
    """Decide each partition's range for the next batch.

    A partition never read before starts at `starting_offsets` when its topic is new
    to the pipeline. A partition added to a topic the pipeline already reads starts
    at its log start whatever that setting says (as Spark's and Flink's Kafka sources
    do): every message in it is newer than the pipeline's start, and `latest` would
    silently skip those produced between the partition's creation and this plan.

    Args:
        states: Watermarks and committed offsets of every partition of the topics.
        starting_offsets: `earliest`, `latest` or a moment (each state then carries
            the offset found at it), for the partitions of a topic the pipeline has
            never read.
        max_offsets_per_partition: Cap on one partition's range.
        accept_loss: Go on from the log start when retention deleted unread offsets,
            returning the lost ranges so they are recorded; otherwise fail closed.
        committed: Every (topic, partition) the ledger has committed offsets for; one
            the broker no longer lists stops the plan.

    Returns:
        The ranges (empty ones included), the partitions seen for the first time, and
        the ranges lost to retention (only with `accept_loss`).

    Raises:
        PlanError: If the broker went backwards, lost a partition, deleted offsets
            before they were read and the loss was not accepted, or gave no offset for
            a starting moment.
    """
    listed = {(s.topic, s.partition) for s in states}
    vanished = sorted(set(committed) - listed)
    if vanished:
        names = ", ".join(f"partition {p} of `{t}`" for t, p in vanished)
        raise PlanError(
            f"{names}: the ledger has committed offsets for it but the broker no longer lists "
            "it. The topic was re-created with fewer partitions, or this is the wrong "
            "cluster. Nothing was read. Check kafka.bootstrap_servers and the topic."
        )
    read = read_topics(states, committed)
    ranges = []
    new = []
    losses = []
    for s in sorted(states, key=lambda s: (s.topic, s.partition)):
        where = f"partition {s.partition} of `{s.topic}`"
        if s.committed is None:
            start, _ = first_start(s, starting_offsets, s.topic in read)
            new.append((s.topic, s.partition))
        else:
            start = s.committed
            if s.high < s.committed:
                raise PlanError(
                    f"{where}: the high watermark {s.high} is below the committed offset "
                    f"{s.committed}. The log went backwards (unclean leader election, a deleted "
                    "and re-created topic, or the wrong cluster). Nothing was read. Check the "
                    "cluster; if the topic was re-created on purpose, record where to read it "
                    "from with `strata ledger seek --topic TOPIC --to earliest --reason TEXT`, "
                    "or point the pipeline at new tables."
                )
            if s.committed < s.low:
                losses.append(OffsetRange(s.topic, s.partition, s.committed, s.low))
                start = s.low
        end = min(s.high, start + max_offsets_per_partition)
        ranges.append(OffsetRange(s.topic, s.partition, start, end))
    if losses and not accept_loss:
        # Every partition is named: --accept-loss accepts the losses of the whole plan,
        # and whoever accepts them must know what they accept.
        names = "; ".join(
            f"partition {x.partition} of `{x.topic}`: committed offset {x.start} is below the "
            f"log start {x.end}; {x.count} messages were deleted by retention before they "
            "were read"
            for x in losses
        )
        raise PlanError(
            f"{names}. Nothing was read. Re-run with --accept-loss to record the "
            f"loss{'es' if len(losses) > 1 else ''} in the ledger and go on from the log start."
        )
    return ranges, new, losses


def read_topics(states: list[PartitionState], committed: Collection[tuple[str, int]]) -> set[str]:
    """The topics the pipeline has read before: any of their partitions has offsets committed."""
    return {t for t, _ in committed} | {s.topic for s in states if s.committed is not None}


def vanished_topics(
    source: KafkaSource, states: list[PartitionState], committed: dict[tuple[str, int], int]
) -> list[str]:
    """Topics a pattern matched and the ledger has offsets for, that the brokers no longer list.

    A listed topic that vanishes stops the plan (see `plan_ranges`); a pattern's topics
    come and go, so those that went are reported and no longer read.
    """
    if source.pattern is None:
        return []
    listed = {s.topic for s in states}
    return sorted({t for t, _ in committed if source.reads(t) and t not in listed})


def first_start(state: PartitionState, starting_offsets: str, added: bool) -> tuple[int, str]:
    """Where a partition never read before starts, and why, in words for the ledger.

    Args:
        state: The partition's watermarks (and, for a moment, the offset found at it).
        starting_offsets: `earliest`, `latest`, or a moment (see `PipelineConfig`).
        added: Whether its topic is read already, so the partition was added to it.

    Returns:
        The first offset to read, and why.

    Raises:
        PlanError: If the start is a moment the brokers gave no offset for.
    """
    if added:
        return state.low, "a partition added to a topic already read starts at its log start"
    if starting_offsets == "earliest":
        return state.low, "starting_offsets earliest: the log start"
    if starting_offsets == "latest":
        return state.high, "starting_offsets latest: the high watermark"
    if state.at_start is None:
        raise PlanError(
            f"partition {state.partition} of `{state.topic}`: the brokers gave no offset for "
            f"starting_offsets {starting_offsets} (the first message at or after it). Nothing "
            "was read. Run again once they answer, or start at earliest or latest"
        )
    # The answer lies inside the log unless the log moved between the two requests.
    start = min(max(state.at_start, state.low), state.high)
    return start, f"starting_offsets {starting_offsets}: the first message at or after it"


def split_ranges(
    ranges: list[OffsetRange], tasks: int, max_per_task: int
) -> list[list[OffsetRange]]:
    """Group ranges into Spark tasks of about equal size.

    Ranges are laid end to end in (topic, partition) order and cut into
    `max(tasks, ceil(total / max_per_task))` contiguous, near-equal pieces. A task
    therefore reads one or several partitions, and a long range is cut across tasks.
    One consumer fetching several partitions is also how Kafka clients are meant to
    be used; it keeps the number of files per event hour at most one per task.

    Args:
        ranges: The batch's ranges; empty ones are ignored.
        tasks: The least number of tasks wanted (the cluster's parallelism).
        max_per_task: Most offsets one task may read.

    Returns:
        The splits, each a non-empty list of non-empty ranges.
    """
    work = [r for r in ranges if r.count > 0]
    total = sum(r.count for r in work)
    if total == 0:
        return []
    n = max(1, tasks, math.ceil(total / max_per_task))
    n = min(n, total)
    size = math.ceil(total / n)
    splits: list[list[OffsetRange]] = []
    current: list[OffsetRange] = []
    room = size
    for r in work:
        start = r.start
        while start < r.end:
            take = min(room, r.end - start)
            current.append(OffsetRange(r.topic, r.partition, start, start + take))
            start += take
            room -= take
            if room == 0:
                splits.append(current)
                current, room = [], size
    if current:
        splits.append(current)
    return splits


def decode_fingerprint(decoding: Decoding) -> str:
    """Hash of everything that decides whether and where a message lands.

    The Schema Registry's url counts (which registry names the writer schemas), its
    credentials do not; it is left out without a registry, so that the plans saved
    before registries were supported keep their fingerprint. Partitioning counts whole
    (its zone, its field's name, values and `other`), and is written as before when it
    is plain UTC `dt`/`hr`, for the same reason.
    """
    schemas = decoding.schemas
    partitioning = schemas.partitioning
    body: dict[str, Any] = {
        "format": schemas.format,
        "schema_id": decoding.schema_id,
        "schema": schemas.text,
        "event_time": decoding.event_time.model_dump(),
        "partitioning": partitioning.by if partitioning.default else partitioning.model_dump(),
    }
    if schemas.format == "confluent_avro" and decoding.registry.url is not None:
        body["schema_registry"] = decoding.registry.url
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def drop_command(pipeline: str, batch: int, force: bool = False) -> str:
    """The command that abandons a batch's saved plan, as the way out of a stop names it."""
    forced = " --force" if force else ""
    return f"`strata plan drop --pipeline {pipeline} --batch {batch}{forced} --reason TEXT`"


KEPT_PLANS = 100
"""How many of the newest committed batches keep their saved plan, to read by hand."""

_PLAN_NAME = re.compile(r"^batch-(\d{10})\.json$")


class PlanStore:
    """Plans of a pipeline, one JSON file per batch under the state location.

    A plan is created only where none exists (an object store's conditional PUT, a
    hard link locally) and never rewritten: two runners planning the same batch at
    once both end up reading the one plan that was saved first.

    A committed ingest batch's plan is read by nothing (the ledger holds what it
    read), so each committed ingest batch forgets the plan of the batch `KEPT_PLANS`
    before it, and the store stays the same size however long the pipeline runs. A
    backfill's or replay's plan says which copy it read (Kafka or the raw copy),
    which checking its batch again needs; those are kept.
    """

    def __init__(self, places: Places) -> None:
        """Open the store for a pipeline.

        Args:
            places: The pipeline's places (its state location).
        """
        self._uri = places.state.uri
        self._options = places.options
        self._fs, self._root = filesystem(self._uri, self._options)
        self._pipeline = places.pipeline

    def _name(self, batch: int) -> str:
        return f"plans/batch-{batch:010d}.json"

    def describe(self, batch: int) -> str:
        """Where a batch's plan is kept, for messages."""
        return f"{self._uri}/{self._name(batch)}"

    def _drop_name(self, batch: int) -> str:
        return f"plans/batch-{batch:010d}.dropped.json"

    def mark_dropped(self, batch: int, record: dict[str, Any]) -> dict[str, Any]:
        """Record that a batch's plan is being dropped, before anything is changed.

        Returns:
            The record that stands: this one, or that of a drop begun earlier.
        """
        uri = f"{self._uri}/{self._drop_name(batch)}"
        put_if_absent(uri, self._options, json.dumps(record, sort_keys=True).encode())
        return self.dropping(batch) or record

    def dropping(self, batch: int) -> dict[str, Any] | None:
        """The record of a drop of this batch's plan, if one was begun."""
        data = read_bytes(self._fs, f"{self._root}/{self._drop_name(batch)}")
        return None if data is None else dict(json.loads(data))

    def load(self, batch: int, *, dropping_ok: bool = False) -> BatchPlan | None:
        """The persisted plan of a batch, if one was made.

        Args:
            batch: The batch.
            dropping_ok: Load it even if a drop of it was begun (for the drop itself).

        Raises:
            PlanError: Naming the file, if it cannot be read as a plan, or if a drop of
                it was begun and not finished.
        """
        if not dropping_ok:
            record = self.dropping(batch)
            if record is not None:
                raise PlanError(
                    f"batch {batch}'s plan is being dropped ({record.get('who')}: "
                    f"{record.get('reason')}) and the drop did not finish. Nothing was read. "
                    f"Run {drop_command(self._pipeline, batch)} again to finish it."
                )
        data = read_bytes(self._fs, f"{self._root}/{self._name(batch)}")
        if data is None:
            return None
        try:
            plan = BatchPlan.from_json(data.decode())
        except (ValueError, KeyError, TypeError) as exc:
            raise PlanError(
                f"{self.describe(batch)}: the saved plan of batch {batch} cannot be read "
                f"({type(exc).__name__}: {exc}); it was cut short or edited. Nothing was read. "
                "Restore the file, or abandon the batch with "
                f"{drop_command(self._pipeline, batch)}."
            ) from None
        if plan.batch != batch or plan.pipeline != self._pipeline:
            raise PlanError(
                f"{self.describe(batch)}: the file holds the plan of batch {plan.batch} of "
                f"pipeline {plan.pipeline}, not batch {batch} of {self._pipeline}; it was "
                "copied or edited by hand. Nothing was read. Restore the file, or abandon the "
                f"batch with {drop_command(self._pipeline, batch)}."
            )
        return plan

    def create(self, plan: BatchPlan) -> BatchPlan:
        """Persist a plan before any of it is read, unless the batch has one already.

        Returns:
            The batch's plan as saved: this one, or the one another runner saved first.
        """
        uri = f"{self._uri}/{self._name(plan.batch)}"
        if put_if_absent(uri, self._options, plan.to_json().encode()):
            return plan
        saved = self.load(plan.batch)
        if saved is None:
            raise PlanError(f"{uri}: the plan exists but cannot be read back; try again")
        return saved

    def forget(self, batch: int) -> bool:
        """Delete the saved plan of a committed ingest batch; any other plan stays.

        Call only for a batch the ledger holds. A plan that cannot be read is left
        for a person to look at.

        Args:
            batch: The batch.

        Returns:
            Whether a plan was deleted.

        Raises:
            StorageError: If the store could not be reached or refused the request.
        """
        try:
            plan = self.load(batch, dropping_ok=True)
        except PlanError:
            return False
        if plan is None or plan.kind != "ingest":
            return False
        delete_object(f"{self._uri}/{self._name(batch)}", self._options)
        return True

    def forget_older(self, committed: int, keep: int | None = None) -> list[int]:
        """Delete the saved plans of ingest batches more than `keep` before `committed`.

        What each committed batch does one plan at a time, done for every plan at once:
        for a store that kept every plan, or where a deletion failed.

        Args:
            committed: The ledger's last batch.
            keep: How many of the newest batches keep their plan (`KEPT_PLANS`).

        Returns:
            The batches whose plan was deleted.

        Raises:
            StorageError: If the store could not be reached or refused the request.
        """
        keep = KEPT_PLANS if keep is None else keep
        batches = [
            int(m[1])
            for name in list_names(f"{self._uri}/plans", self._options)
            if (m := _PLAN_NAME.match(name))
        ]
        return [b for b in batches if b <= committed - keep and self.forget(b)]
