"""Planning a batch: the checks a plan must pass, and the next batch's plan from the brokers.

The pure decisions live in `strata.batch.plan`; here they meet the world: the topics'
ids on the brokers against the ledger's record, the schema against the columns the
table was written with, a saved plan against where the ledger goes on.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime

from strata.batch.decode import DecodeRules
from strata.batch.kafka import pipeline_topics, topic_ids
from strata.batch.plan import (
    BatchPlan,
    PartitionState,
    PlanStore,
    decode_fingerprint,
    drop_command,
    first_start,
    plan_ranges,
    read_topics,
    split_ranges,
    vanished_topics,
)
from strata.config import Decoding, KafkaSource, LimitsConfig, SchemaSpec
from strata.errors import KafkaUnavailable, PlanError, SchemaError
from strata.schema.avro import (
    column_signature,
    data_schema,
    schema_changes,
    table_layout,
)
from strata.store.ledger import (
    LedgerState,
    LogIds,
    Opened,
    committed_columns,
    committed_log_ids,
)
from strata.store.places import Places
from strata.store.ranges import OffsetRange


def check_topic_ids(
    places: Places,
    source: KafkaSource,
    planned: BatchPlan | None = None,
    topics: Collection[str] | None = None,
    committed: Collection[tuple[str, int]] = (),
    ledger: Opened = "open",
) -> dict[str, str]:
    """Stop when a partition's log is not the one its committed offsets (or a plan) belong to.

    A topic deleted and created again under the same name starts its offsets at 0;
    once it has grown past the committed offset, its watermarks look like progress
    and only its id tells the new log from the old one. The ledger records which log
    each partition's offsets belong to (`strata.store.ledger.LogIds`): a topic's id, or a
    partition's own where an operator moved it alone onto a re-created topic.

    Args:
        places: The pipeline's places (its ledger, its name).
        source: The brokers and the pipeline's topics there.
        planned: A saved plan, whose topics' ids are checked instead of the ledger's.
        topics: The topics read now, when the caller has listed them already; by
            default they are asked of the brokers.
        committed: The partitions the ledger holds offsets for (for the ledger's check).
        ledger: The ledger, if the caller opened it already (`Opened`).

    Returns:
        The brokers' id of each topic (empty where they keep none).

    Raises:
        PlanError: Naming each partition, both ids and the ways on.
    """
    if planned is not None:
        asked = sorted({r.topic for r in planned.ranges})
    else:
        asked = sorted(pipeline_topics(source) if topics is None else topics)
    current = topic_ids(source, asked)
    drop = ""
    recorded: LogIds
    if planned is not None:
        # A plan is made after the ledger's check passed: its topics' ids are its own.
        recorded, since = (
            LogIds(planned.batch, planned.topic_ids),
            f"batch {planned.batch} was planned",
        )
        parts = {(r.topic, r.partition) for r in planned.ranges}
        drop = (
            f"Drop batch {planned.batch}'s plan first "
            f"({drop_command(places.pipeline, planned.batch)}). "
        )
    else:
        newest = committed_log_ids(places, ledger)
        if newest is None:
            return current
        recorded, since = newest, f"batch {newest.batch} was committed"
        parts = set(committed)
    # Only the topics asked about: a topic a pattern matched may be gone for good.
    known = set(recorded.topics) | set(recorded.partitions)
    unknown = sorted(t for t in known if t in asked and t not in current)
    if unknown:
        # Fail closed: a topic once read with an id is only read again once it is known
        # to be the same topic.
        raise KafkaUnavailable(
            f"the brokers at {source.kafka.bootstrap_servers} did not give the id of "
            f"{', '.join(f'`{t}`' for t in unknown)}, recorded when {since}; nothing was "
            "read. Run again once the brokers answer"
        )
    changed: dict[str, list[tuple[int, str]]] = {}
    for topic, partition in sorted(parts):
        was = recorded.of(topic, partition)
        if topic in current and was is not None and was != current[topic]:
            changed.setdefault(topic, []).append((partition, was))
    if changed:
        names = "; ".join(
            f"`{t}` (id {', '.join(sorted({w for _, w in found}))} when {since}, {current[t]} "
            f"now; partition{'s' if len(found) > 1 else ''} {', '.join(str(p) for p, _ in found)})"
            for t, found in changed.items()
        )
        raise PlanError(
            f"topic {names} was deleted and created again under the same name: the committed "
            "offsets of those partitions belong to the old topic, and the new one's offsets "
            f"are other messages. Nothing was read. {drop}If the new topic is the one to read, "
            f"record it with `strata ledger seek --pipeline {places.pipeline} --topic TOPIC --to "
            "earliest --reason TEXT` (for each partition named: a seek vouches only for the "
            "partitions it moves); or point the pipeline at new tables. If this is the wrong "
            "cluster, fix kafka.bootstrap_servers."
        )
    return current


def check_continues(places: Places, plan: BatchPlan, state: LedgerState) -> None:
    """An ingest plan's ranges start exactly where the ledger says reading goes on.

    This holds for every plan made since the ledger last changed; a plan that does not
    continue the ledger is stale (the ledger was edited, or another runner moved it),
    and running it would read offsets twice or skip them.

    Raises:
        PlanError: Naming each partition and the way on.
    """
    lost = {(x.topic, x.partition): x for x in plan.losses}
    new = set(plan.new_partitions)
    problems = []
    for r in plan.ranges:
        key = (r.topic, r.partition)
        committed = state.committed.get(key)
        where = f"partition {r.partition} of `{r.topic}`"
        if committed is None:
            if key not in new:
                problems.append(f"{where}: the ledger holds no offsets for it")
            continue
        expected = committed
        if key in lost:
            if lost[key].start != committed:
                problems.append(
                    f"{where}: the plan records a loss from {lost[key].start}, the ledger "
                    f"goes on at {committed}"
                )
            expected = lost[key].end
        if r.start != expected:
            problems.append(
                f"{where}: the plan starts at {r.start}, the ledger goes on at {expected}"
            )
    if problems:
        raise PlanError(
            f"{PlanStore(places).describe(plan.batch)}: the saved plan of batch "
            f"{plan.batch} does not continue the ledger ("
            + "; ".join(problems)
            + "); the ledger changed after the plan was saved. Nothing was read. Drop the "
            f"plan with {drop_command(places.pipeline, plan.batch)}, then run again."
        )


def data_columns(schemas: SchemaSpec) -> list[list[str]]:
    """The data table's column signature under the schema read with."""
    return column_signature(table_layout(schemas, "table")[0])


def check_schema(places: Places, decoding: Decoding, ledger: Opened = "open") -> list[str]:
    """Stop before reading when the schema changed in a way the tables cannot take.

    Args:
        places: The pipeline's places (its ledger, its name).
        decoding: How messages are decoded, the schema read with included.
        ledger: The ledger, if the caller opened it already (`Opened`).

    Returns:
        The columns the current schema adds to the table (old rows read them as null).

    Raises:
        SchemaError: Naming each incompatible change and its fix.
    """
    # The decode rules first, before any batch is committed too: a schema or event-time
    # setting the decoder refuses must stop the plan, not fail every task of the batch.
    topic = DecodeRules.of_decoding(decoding).topic
    recorded = committed_columns(places, ledger)
    if recorded is None:
        return []
    batch, before = recorded
    partitioning = decoding.schemas.partitioning
    added, problems = schema_changes(before, data_schema(topic, partitioning), topic.required)
    if problems:
        raise SchemaError(
            f"{decoding.schemas.path}: pipeline {places.pipeline}'s schema changed since batch "
            f"{batch} in a way its tables cannot take; nothing was read.\n  "
            + "\n  ".join(problems)
        )
    return added


@dataclass(frozen=True)
class PlanSettings:
    """How a pipeline's batches are planned; built once by the conductor.

    Attributes:
        pipeline: The pipeline's (or routed table's) name.
        source: The brokers and the pipeline's topics there.
        limits: The bounds on one batch.
        accept_losses: `on_data_loss: accept`: offsets lost to retention are recorded
            and skipped without being asked.
        tasks: The least number of tasks a batch is split into (the cluster's cores).
        decoding: How messages are decoded, as now configured; a plan keeps its
            fingerprint (`decode_fingerprint`), and the schema a table that follows its
            registry evolved to.
        master: The Spark master the batch runs on (spark-submit's, else the
            pipeline's): a cluster needs storage its executors share.
    """

    pipeline: str
    source: KafkaSource
    limits: LimitsConfig
    accept_losses: bool
    tasks: int
    decoding: Decoding
    master: str

    @property
    def fingerprint(self) -> str:
        """What decides whether and where a message lands, as a plan keeps it."""
        return decode_fingerprint(self.decoding)


def recovered_plan(places: Places, settings: PlanSettings, state: LedgerState) -> BatchPlan | None:
    """The plan of the unfinished batch, read back from a table that committed it.

    A batch's plan is saved before anything is read, and a table's commit of the batch
    records the ranges it read (`RANGES_KEY`): when the saved plan is gone (its folder
    removed by hand) while a table holds the batch, that record is the plan, and the
    batch is finished as it began instead of planned again over other offsets. The
    plan is saved again before it runs.

    Returns:
        The plan, saved; None if no table records the batch's ranges.
    """
    from strata.batch.reconcile import RANGES_KEY, TABLES
    from strata.store.tables import batch_record

    batch = state.last_batch + 1
    for name in TABLES:
        ref = places.table(name)
        recorded = batch_record(ref, places.pipeline, batch, RANGES_KEY)
        if not recorded:
            continue
        kind, note = "ingest", ""
        for other in ("backfill", "replay"):
            why = batch_record(ref, places.pipeline, batch, f"strata.{other}")
            if why is not None:
                kind, note = other, str(why)
        ranges = [OffsetRange(r["topic"], r["partition"], r["start"], r["end"]) for r in recorded]
        limits = settings.limits
        plan = BatchPlan(
            pipeline=places.pipeline,
            batch=batch,
            ranges=ranges,
            splits=split_ranges(ranges, settings.tasks, limits.max_offsets_per_task),
            new_partitions=[
                (r.topic, r.partition)
                for r in ranges
                if (r.topic, r.partition) not in state.committed
            ],
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            kind=kind,
            note=note or f"recovered from the {name} table's commit: its saved plan was gone",
            # A backfill's or replay's rest is read from the raw copy it committed, or
            # from Kafka where the raw copy was not committed yet (`_source_for`).
            source="raw" if kind == "replay" else "kafka",
        )
        return PlanStore(places).create(plan)
    return None


def new_plan(
    settings: PlanSettings,
    batch: int,
    states: list[PartitionState],
    max_offsets: int | None,
    accept_loss: str | None,
    committed: dict[tuple[str, int], int],
) -> BatchPlan | None:
    """The next batch's plan from the partitions' watermarks; None when nothing is new.

    Args:
        settings: How the pipeline's batches are planned.
        batch: The batch number.
        states: Every partition's watermarks and committed offset.
        max_offsets: Per-partition cap for this batch, overriding the config.
        accept_loss: Who accepts offsets lost to retention, and why; None fails closed
            unless the pipeline's `on_data_loss` is `accept`.
        committed: Where reading goes on per partition, from the ledger.
    """
    source, limits = settings.source, settings.limits
    if accept_loss is None and settings.accept_losses:
        accept_loss = "pipeline policy on_data_loss: accept"
    # A topic taken out of `topics` keeps its rows in the ledger; it is no longer read,
    # and its partitions are not missing from the brokers' answer. Nor are those of a
    # topic a pattern matched and that was deleted since (the run reports it).
    gone = set(vanished_topics(source, states, committed))
    committed = {
        key: end for key, end in committed.items() if source.reads(key[0]) and key[0] not in gone
    }
    ranges, new, losses = plan_ranges(
        states,
        source.starting_offsets,
        max_offsets or limits.max_offsets_per_partition,
        accept_loss is not None,
        committed,
    )
    if not any(r.count for r in ranges) and not new and not losses:
        return None
    # An empty range is kept where it moves where reading goes on: the start of a new
    # partition, or the log start after an accepted loss. The ledger records its start
    # even when the batch reads nothing there, so no later plan starts anywhere else.
    moved = set(new) | {(x.topic, x.partition) for x in losses}
    kept = [r for r in ranges if r.count > 0 or (r.topic, r.partition) in moved]
    read = read_topics(states, committed)
    fresh = set(new)
    began = {
        f"{s.topic}:{s.partition}": first_start(s, source.starting_offsets, s.topic in read)[1]
        for s in states
        if (s.topic, s.partition) in fresh
    }
    return BatchPlan(
        pipeline=settings.pipeline,
        batch=batch,
        ranges=kept,
        splits=split_ranges(kept, settings.tasks, limits.max_offsets_per_task),
        new_partitions=new,
        fingerprint=settings.fingerprint,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        watermarks={f"{s.topic}:{s.partition}": s.high for s in states},
        losses=losses,
        note=f"loss accepted by {accept_loss}" if losses else "",
        began=began,
    )
