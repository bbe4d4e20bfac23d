"""One batch, end to end: plan, read, decode, write, reconcile, commit, publish offsets.

A batch is planned once, and its plan saved before anything is read. Whoever runs it
afterwards (a retry, the next scheduled run, a runner on another host) finishes that
plan with the semantics of the operation that made it: an ingest appends its offsets,
a backfill or replay replaces its ranges' rows.

Nothing is committed until the batch reconciles from what was really read and
written: the tasks' pieces tile every planned range, every offset was read once or
confirmed as a gap, and the files hold each offset read exactly once. Commit order is
raw copy, quarantine, data table, ledger. Each table's commit carries the batch's app
transaction, checked again inside the commit, so after a crash at any point, or with
a second runner, a re-run sees which commits stand, rewrites only the files of tables
not yet committed, and commits the rest once. The tables are read back before the
ledger commit, which is last and marks the batch done.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake.transaction import RemoveAction

from strata import faults
from strata.batch.decode import DecodeRules
from strata.batch.kafka import partition_states, pipeline_topics, publish_offsets, topic_ids
from strata.batch.plan import (
    BatchPlan,
    OffsetRange,
    PartitionState,
    PlanStore,
    decode_fingerprint,
    first_start,
    plan_ranges,
    read_topics,
    split_ranges,
    vanished_topics,
)
from strata.batch.reconcile import (
    RANGES_KEY,
    TABLES,
    batch_results,
    planned_results,
    reconcile_files,
    reconcile_resumed,
    reconcile_tables,
)
from strata.batch.task import RangeResult, SplitJob, SplitResult
from strata.batch.write import WrittenFile, is_batch_file
from strata.config import PipelineConfig, TableName
from strata.errors import KafkaUnavailable, LeaseLost, PlanError, ReconcileError, SchemaError
from strata.operations.routes import remember_table, require_one_table
from strata.schema.avro import (
    TABLE_SUFFIXES,
    column_signature,
    data_schema,
    schema_changes,
    table_layout,
)
from strata.schema.evolve import evolved, table_schema
from strata.stages import Stages
from strata.store.delta import (
    add_missing_columns,
    batch_metadata,
    batch_removes,
    commit_files,
    commit_removes,
    committed_batch,
    ensure_table,
    open_table,
    without_ranges,
)
from strata.store.files import filesystem
from strata.store.ledger import (
    RUN_COLUMNS,
    LedgerState,
    LogIds,
    commit_ledger,
    committed_columns,
    committed_log_ids,
    ledger_state,
    read_ledger,
    unread_row,
)
from strata.store.locations import void_unfinished_moves
from strata.store.lock import BothLocks, RunLock, run_lock

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Commit metadata of the empty commits and removals a ledger edit makes in the tables.
FENCE_KEY = "strata.fence"


@dataclass(frozen=True)
class Seen:
    """What an idle run read, for its summary's view: nothing was committed since.

    Attributes:
        rows: The ledger's `RUN_COLUMNS`.
        state: Where reading goes on.
        states: The partitions' watermarks on the brokers.
    """

    rows: pa.Table
    state: LedgerState
    states: list[PartitionState]


@dataclass
class RunOutcome:
    """What a run did, for the summary.

    Attributes:
        pipeline: Pipeline name.
        status: `committed`, `resumed` (an unfinished batch was completed) or `idle`.
        batch: Batch number, or None when idle.
        ranges: Per-partition results of the batch.
        files: Files committed per table.
        new_partitions: Partitions read for the first time.
        lag: Messages behind the high watermark per (topic, partition), after the run.
        seconds: Wall time of the whole run.
        spark_seconds: Time to start Spark (0 when no JVM was needed).
        read_seconds: Time the tasks took, Spark start-up excluded.
        warnings: Things the operator should know that did not fail the run.
        registered: What registering the tables in the metastore changed, if configured.
        register_error: Why registering failed; the batch stands, the run exits non-zero.
        stages: The driver's wall and CPU seconds per stage.
        task_stages: The tasks' wall and CPU seconds per stage, summed over tasks.
        late_after_completion: Rows the batch landed per event-time partition that was
            already complete before it (see `strata.catalog.completeness`).
        seen: What an idle run read of the ledger and the brokers, which its summary's
            view takes instead of asking again.
    """

    pipeline: str
    status: str
    batch: int | None = None
    ranges: list[RangeResult] = field(default_factory=list)
    files: dict[str, int] = field(default_factory=dict)
    new_partitions: list[tuple[str, int]] = field(default_factory=list)
    lag: dict[tuple[str, int], int] = field(default_factory=dict)
    seconds: float = 0.0
    spark_seconds: float = 0.0
    read_seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)
    registered: str | None = None
    register_error: str | None = None
    stages: Stages = field(default_factory=Stages)
    task_stages: Stages = field(default_factory=Stages)
    late_after_completion: dict[str, int] = field(default_factory=dict)
    seen: Seen | None = field(default=None, repr=False, compare=False)


def run_batch(
    cfg: PipelineConfig,
    *,
    max_offsets: int | None = None,
    session: Callable[[PipelineConfig], SparkSession] | None = None,
    register_tables: bool = True,
    accept_loss: str | None = None,
) -> RunOutcome:
    """Plan and run the next batch of a pipeline, or finish an unfinished one.

    An unfinished batch is finished by the operation that planned it: an ingest
    appends its offsets; a backfill or replay replaces its ranges' rows (and never
    moves where reading goes on). New offsets then come with the next run.

    Args:
        cfg: The pipeline configuration.
        max_offsets: Per-partition cap for this run, overriding the config.
        session: Builds the Spark session; only called when there is data to read.
        register_tables: Register the tables in the metastore after the commit. An
            Airflow DAG leaves this to its own register task.
        accept_loss: Who accepts offsets lost to retention, and why (recorded in the
            ledger); None fails closed unless the pipeline's `on_data_loss` is `accept`.

    Returns:
        The outcome.

    Raises:
        PlanError: If the broker's state makes a safe plan impossible.
        ReconcileError: If the batch does not add up; nothing of it was committed.
    """
    began = time.monotonic()
    planning = Stages()
    require_one_table(cfg, "run_batch")
    remember_table(cfg)
    with run_lock(cfg.places()) as lock:
        if cfg.table_format == "parquet":
            # A compaction that held the run lock before this run (and lost it, paused
            # or killed) may have moves announced and not made: they are voided before
            # this run writes, so a marker landing late moves no partition away from
            # the rows this run adds to it.
            void_unfinished_moves(
                cfg.location("table"), cfg.storage_options, f"voided by a run of {cfg.name}"
            )
        with planning.timed("plan"):
            # One read of the ledger serves the plan and, for an idle run, what its
            # summary shows (`strata.operations.metrics.after_run`).
            rows = read_ledger(cfg.places(), RUN_COLUMNS)
            state = ledger_state(cfg.places(), rows)
            plan, resumed, states = _load_or_plan(cfg, state, max_offsets, accept_loss)
        if plan is not None:
            # A plan reads with the schema it was saved with; one saved without (a
            # backfill's) with the schema the table has evolved to.
            cfg = (
                cfg.with_schema_text(plan.reader_schema)
                if plan.reader_schema
                else table_schema(cfg)
            )
        if plan is None:
            outcome = RunOutcome(cfg.name, "idle", lag=_lag(states, state.committed))
            outcome.seen = Seen(rows, state, states)
            # Catch the consumer group up with the ledger, in case a run died before.
            ranges = [OffsetRange(t, p, e, e) for (t, p), e in state.committed.items()]
            _publish_offsets(cfg, ranges, outcome)
        elif plan.kind == "ingest":
            outcome = _ingest(cfg, plan, state, resumed, session, lock)
        else:
            outcome = execute_reprocess(cfg, plan, session, lock, resumed=True)
            outcome.warnings.insert(
                0,
                f"batch {plan.batch} is a {plan.kind} planned at {plan.created_at or 'an earlier '}"
                f"run ({plan.note}) and left unfinished; it was finished as a {plan.kind}, "
                "replacing its ranges' rows. New offsets are read by the next run.",
            )
        for topic in vanished_topics(cfg, states, state.committed):
            outcome.warnings.append(
                f"topic `{topic}` matched topics_pattern and has committed offsets, but the "
                "brokers no longer list it: it was deleted, and is no longer read. Its rows "
                "and ledger rows stay"
            )
        if plan is not None and plan.kind == "ingest" and outcome.batch is not None:
            _late_after_completion(cfg, outcome)
        outcome.stages.merge(planning)
        if register_tables:
            with outcome.stages.timed("register"):
                register(cfg, outcome)
        outcome.seconds = time.monotonic() - began
        return outcome


def _ingest(
    cfg: PipelineConfig,
    plan: BatchPlan,
    state: LedgerState,
    resumed: bool,
    session: Callable[[PipelineConfig], SparkSession] | None,
    lock: RunLock,
) -> RunOutcome:
    """Read, check and commit an ingest batch, then publish its offsets."""
    outcome = RunOutcome(
        cfg.name,
        "resumed" if resumed else "committed",
        plan.batch,
        new_partitions=plan.new_partitions,
    )
    check_continues(cfg, plan, state)
    if resumed:
        check_schema(cfg)
    written = write_and_commit(cfg, plan, TABLES, session, outcome, lock, resumed)
    results = outcome.ranges = written.results
    ledger_rows = [
        ledger_row(r, plan.watermarks, note=_began(plan, r.topic, r.partition, r.start))
        for r in results
    ]
    ledger_rows += [loss_row(lost, plan.note) for lost in plan.losses]
    for lost in plan.losses:
        outcome.warnings.append(
            f"{lost.describe()}: {lost.count} messages were deleted by retention before "
            f"they were read; the loss is recorded in the ledger ({plan.note})"
        )
    with own_files_on_loss(cfg, plan.batch, written.run_id), outcome.stages.timed("ledger"):
        lock.check()
        landed = commit_ledger(
            cfg.places(),
            plan.batch,
            ledger_rows,
            data_columns(cfg),
            plan.topic_ids,
            json.loads(plan.reader_schema) if plan.reader_schema else None,
        )
    faults.reached(faults.AFTER_LEDGER)
    if not landed:
        # Another runner committed the batch first; this run's commits were no-ops.
        if cfg.table_format == "parquet":
            remove_batch_files(cfg, plan.batch, only_run=written.run_id)
        outcome.warnings.append(
            f"batch {plan.batch} was committed by another run first; this run committed "
            "nothing and left the consumer group as it was"
        )
        return outcome
    if cfg.table_format == "parquet":
        # The ledger holds the batch with this run's files: any other file of it (an
        # attempt of a runner that lost its lease) is not the batch's.
        kept = {f.path for fs in written.files.values() for f in fs}
        if kept:
            remove_batch_files(cfg, plan.batch, keep=kept)
    _publish_offsets(
        cfg, [OffsetRange(r.topic, r.partition, r.start, r.end) for r in results], outcome
    )
    try:
        after = partition_states(cfg.source(), {(r.topic, r.partition): r.end for r in results})
        committed = dict(state.committed)
        committed.update({(r.topic, r.partition): r.end for r in results})
        outcome.lag = _lag(after, committed)
    except Exception as exc:  # noqa: BLE001 - lag is informational; the batch stands
        outcome.warnings.append(f"lag after the run unknown: {exc}")
    return outcome


def _began(plan: BatchPlan, topic: str, partition: int, start: int) -> str | None:
    """The ledger's note on a partition's first range: where it began and why."""
    why = plan.began.get(f"{topic}:{partition}")
    return None if why is None else f"began at offset {start}: {why}"


def execute_reprocess(
    cfg: PipelineConfig,
    plan: BatchPlan,
    session: Callable[[PipelineConfig], SparkSession] | None,
    lock: RunLock,
    resumed: bool,
) -> RunOutcome:
    """Run a saved backfill or replay plan: its ranges' rows are replaced, once.

    From Kafka, the raw copy's rows of the ranges are replaced too; from the raw copy,
    it stays as it is. The ledger records the batch with its kind and reason and
    never moves where reading goes on.
    """
    status = "replayed" if plan.kind == "replay" else "backfilled"
    outcome = RunOutcome(cfg.name, status, plan.batch)
    if plan.source == "raw" and plan.kind == "backfill":
        outcome.warnings.append(
            f"{', '.join(r.describe() for r in plan.ranges)} are no longer in Kafka; they were "
            "read from the raw copy"
        )
    tables = ("quarantine", "table") if plan.source == "raw" else TABLES
    # It rewrites files a compaction may be merging: the two never run at once.
    with run_lock(cfg.places(), "maintenance") as maintenance:
        results = outcome.ranges = write_and_commit(
            cfg, plan, tables, session, outcome, BothLocks(lock, maintenance), resumed
        ).results
    lock.check()
    commit_ledger(
        cfg.places(),
        plan.batch,
        [ledger_row(r, {}, plan.kind, plan.note) for r in results],
        data_columns(cfg),
    )
    faults.reached(faults.AFTER_LEDGER)
    return outcome


def plan_next(cfg: PipelineConfig, max_offsets: int | None = None) -> BatchPlan | None:
    """Plan and persist the next batch without running it (no JVM); None if idle.

    An unfinished batch's saved plan is returned as it is, so the run that follows
    reads exactly what was planned.
    """
    with run_lock(cfg.places()):
        plan, _, _ = _load_or_plan(cfg, ledger_state(cfg.places()), max_offsets, None)
        return plan


def _load_or_plan(
    cfg: PipelineConfig,
    state: LedgerState,
    max_offsets: int | None,
    accept_loss: str | None,
) -> tuple[BatchPlan | None, bool, list[PartitionState]]:
    """The unfinished batch's saved plan, or a new one saved before any read.

    Returns:
        The plan (None when there is nothing new), whether it was an unfinished
        batch's (or another runner's, saved first), and the partitions' watermarks
        when a new plan was made.
    """
    from strata.spark.session import submitted_master

    # Before anything is saved: spark-submit may name a cluster the YAML does not.
    shared = cfg.shared_storage_error(submitted_master() or cfg.spark.master)
    if shared:
        raise PlanError(shared)
    store = PlanStore(cfg.places())
    plan = store.load(state.last_batch + 1)
    if plan is not None:
        return plan, True, []
    states = partition_states(cfg.source(), state.committed)
    plan = new_plan(cfg, state.last_batch + 1, states, max_offsets, accept_loss, state.committed)
    if plan is None:
        return None, False, states
    # Before the plan is saved, so nothing of a re-created topic or an incompatible
    # schema is ever read; an idle run skips both.
    plan = replace(
        plan,
        topic_ids=check_topic_ids(
            cfg, topics={s.topic for s in states}, committed=state.committed.keys()
        ),
    )
    if cfg.schema_registry.evolve:
        # The schema is settled with the plan and saved in it: a resumed batch reads
        # with it whatever the registry holds by then.
        cfg = evolved(table_schema(cfg), {r.topic for r in plan.ranges})
        plan = replace(plan, reader_schema=cfg.schema_text, fingerprint=decode_fingerprint(cfg))
    check_schema(cfg)
    saved = store.create(plan)
    return saved, saved is not plan, states


def check_topic_ids(
    cfg: PipelineConfig,
    planned: BatchPlan | None = None,
    topics: Collection[str] | None = None,
    committed: Collection[tuple[str, int]] = (),
) -> dict[str, str]:
    """Stop when a partition's log is not the one its committed offsets (or a plan) belong to.

    A topic deleted and created again under the same name starts its offsets at 0;
    once it has grown past the committed offset, its watermarks look like progress
    and only its id tells the new log from the old one. The ledger records which log
    each partition's offsets belong to (`strata.store.ledger.LogIds`): a topic's id, or a
    partition's own where an operator moved it alone onto a re-created topic.

    Args:
        cfg: The pipeline configuration.
        planned: A saved plan, whose topics' ids are checked instead of the ledger's.
        topics: The topics read now, when the caller has listed them already; by
            default they are asked of the brokers.
        committed: The partitions the ledger holds offsets for (for the ledger's check).

    Returns:
        The brokers' id of each topic (empty where they keep none).

    Raises:
        PlanError: Naming each partition, both ids and the ways on.
    """
    if planned is not None:
        asked = sorted({r.topic for r in planned.ranges})
    else:
        asked = sorted(pipeline_topics(cfg.source()) if topics is None else topics)
    current = topic_ids(cfg.source(), asked)
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
            f"Drop batch {planned.batch}'s plan first (`strata plan drop --pipeline {cfg.name} "
            f"--batch {planned.batch} --reason TEXT`). "
        )
    else:
        newest = committed_log_ids(cfg.places())
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
            f"the brokers at {cfg.kafka.bootstrap_servers} did not give the id of "
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
            f"record it with `strata ledger seek --pipeline {cfg.name} --topic TOPIC --to "
            "earliest --reason TEXT` (for each partition named: a seek vouches only for the "
            "partitions it moves); or point the pipeline at new tables. If this is the wrong "
            "cluster, fix kafka.bootstrap_servers."
        )
    return current


def check_continues(cfg: PipelineConfig, plan: BatchPlan, state: LedgerState) -> None:
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
            f"{PlanStore(cfg.places()).describe(plan.batch)}: the saved plan of batch "
            f"{plan.batch} does not continue the ledger ("
            + "; ".join(problems)
            + "); the ledger changed after the plan was saved. Nothing was read. Drop the "
            f"plan with `strata plan drop --pipeline {cfg.name} --batch {plan.batch} --reason "
            "TEXT`, then run again."
        )


def data_columns(cfg: PipelineConfig) -> list[list[str]]:
    """The data table's column signature under the current schema."""
    return column_signature(table_layout(cfg.schemas(), "table")[0])


def check_schema(cfg: PipelineConfig) -> list[str]:
    """Stop before reading when the schema changed in a way the tables cannot take.

    Returns:
        The columns the current schema adds to the table (old rows read them as null).

    Raises:
        SchemaError: Naming each incompatible change and its fix.
    """
    # The decode rules first, before any batch is committed too: a schema or event-time
    # setting the decoder refuses must stop the plan, not fail every task of the batch.
    topic = DecodeRules.from_config(cfg).topic
    recorded = committed_columns(cfg.places())
    if recorded is None:
        return []
    batch, before = recorded
    added, problems = schema_changes(before, data_schema(topic, cfg.partitioning), topic.required)
    if problems:
        raise SchemaError(
            f"{cfg.schema_path}: pipeline {cfg.name}'s schema changed since batch {batch} in a "
            "way its tables cannot take; nothing was read.\n  " + "\n  ".join(problems)
        )
    return added


def new_plan(
    cfg: PipelineConfig,
    batch: int,
    states: list[PartitionState],
    max_offsets: int | None,
    accept_loss: str | None,
    committed: dict[tuple[str, int], int],
) -> BatchPlan | None:
    """The next batch's plan from the partitions' watermarks; None when nothing is new.

    Args:
        cfg: The pipeline configuration.
        batch: The batch number.
        states: Every partition's watermarks and committed offset.
        max_offsets: Per-partition cap for this batch, overriding the config.
        accept_loss: Who accepts offsets lost to retention, and why; None fails closed
            unless the pipeline's `on_data_loss` is `accept`.
        committed: Where reading goes on per partition, from the ledger.
    """
    from strata.spark.session import default_tasks

    if accept_loss is None and cfg.on_data_loss == "accept":
        accept_loss = "pipeline policy on_data_loss: accept"
    # A topic taken out of `topics` keeps its rows in the ledger; it is no longer read,
    # and its partitions are not missing from the brokers' answer. Nor are those of a
    # topic a pattern matched and that was deleted since (the run reports it).
    gone = set(vanished_topics(cfg, states, committed))
    committed = {
        key: end for key, end in committed.items() if cfg.reads_topic(key[0]) and key[0] not in gone
    }
    ranges, new, losses = plan_ranges(
        states,
        cfg.starting_offsets,
        max_offsets or cfg.limits.max_offsets_per_partition,
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
    began = {
        f"{s.topic}:{s.partition}": first_start(s, cfg.starting_offsets, s.topic in read)[1]
        for s in states
        if (s.topic, s.partition) in set(new)
    }
    return BatchPlan(
        pipeline=cfg.name,
        batch=batch,
        ranges=kept,
        splits=split_ranges(kept, default_tasks(cfg), cfg.limits.max_offsets_per_task),
        new_partitions=new,
        fingerprint=decode_fingerprint(cfg),
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        watermarks={f"{s.topic}:{s.partition}": s.high for s in states},
        losses=losses,
        note=f"loss accepted by {accept_loss}" if losses else "",
        began=began,
    )


def write_and_commit(
    cfg: PipelineConfig,
    plan: BatchPlan,
    tables: tuple[TableName, ...],
    session: Callable[[PipelineConfig], SparkSession] | None,
    outcome: RunOutcome,
    lock: RunLock,
    resumed: bool,
) -> BatchWrite:
    """Run the batch's tasks, reconcile what they wrote, and commit each table once.

    Tables whose commit of the batch already stands are neither rewritten nor
    committed again. Nothing is committed unless the files reconcile with what was
    read, and the tables are read back before the ledger commit.

    Returns:
        One result per planned range (empty ones included), the files written, and
        this run's id (part of every file name).
    """
    parquet = cfg.table_format == "parquet"
    replacing = None if plan.kind == "ingest" else plan.ranges
    # Plain Parquet tables have no commits of their own: the ledger decides.
    done = {name: False for name in tables} if parquet else tables_done(cfg, tables, plan.batch)
    run_id = uuid.uuid4().hex[:8]
    nothing: dict[TableName, list[WrittenFile]] = {name: [] for name in TABLES}
    if all(done.values()):
        results = planned_results(plan, stored_results(cfg, plan.batch))
        reconcile_tables({n: cfg.places().table(n) for n in tables}, plan, results)
        return BatchWrite(results, nothing, run_id)
    if plan.offsets == 0:
        return BatchWrite(planned_results(plan, []), nothing, run_id)
    fingerprint = decode_fingerprint(cfg)
    if plan.fingerprint and plan.fingerprint != fingerprint and any(done.values()):
        raise PlanError(
            f"batch {plan.batch} was begun with other decode settings (schema, format, event "
            "time or partitioning) and is partly committed; restore the settings it began "
            "with, finish it, then change them. If it must not be finished, `strata plan drop "
            f"--pipeline {cfg.name} --batch {plan.batch} --force --reason TEXT` removes what "
            "it committed, and the next batch reads its offsets again with the new settings"
        )
    source = _source_for(cfg, plan, done, resumed, outcome)
    # A batch whose own raw commit stands reads back exactly the rows it wrote there.
    raw_batch = plan.batch if done.get("raw") else None
    if parquet and resumed:
        # Plain Parquet readers see every file in a directory: a crashed attempt's files
        # must go before this attempt writes, or rows could show twice.
        remove_batch_files(cfg, plan.batch, lock=lock)
    write = frozenset(name for name, d in done.items() if not d)
    split_results = run_tasks(cfg, plan, write, session, outcome, source, raw_batch, run_id)
    for split in split_results:
        outcome.task_stages.merge(Stages.from_dict(split.stages))
    faults.reached(faults.AFTER_FILES)
    results = batch_results(plan, split_results)
    written = {name: [f for s in split_results for f in s.files.get(name, [])] for name in TABLES}
    reconcile_files(plan, results, written, write)
    if any(done.values()):
        stood = next(n for n in TABLES if done.get(n))
        reconcile_resumed(cfg.name, plan, results, stood, cfg.places().table(stood))
    if parquet:
        # Files of this run's failed task attempts are not the batch's: readers must not
        # see them. Only this run's: other runs' files went at resume, or go once the
        # batch is committed, by the run that commits it.
        kept = {f.path for fs in written.values() for f in fs}
        with own_files_on_loss(cfg, plan.batch, run_id):
            remove_batch_files(cfg, plan.batch, keep=kept, only_run=run_id, lock=lock)
    meta: dict[str, Any] = {RANGES_KEY: [vars(r) for r in results]}
    if plan.kind != "ingest":
        meta[f"strata.{plan.kind}"] = plan.note
    for name in tables:
        outcome.files[name] = len(written[name])
        if not (done[name] or parquet):
            lock.check()
            faults.reached(faults.BEFORE_COMMIT[name])
            with outcome.stages.timed("commit"):
                added = commit_table(cfg, name, written[name], plan.batch, meta, replacing)
            if added:
                outcome.warnings.append(
                    f"the schema gained {', '.join(f'`{c}`' for c in added)}: the data table "
                    "has the new column(s) from this batch on; earlier rows read them as null"
                )
    with outcome.stages.timed("read_back"):
        reconcile_tables(
            {n: cfg.places().table(n) for n in tables},
            plan,
            results,
            written if parquet else None,
        )
    return BatchWrite(results, written, run_id)


class BatchWrite(NamedTuple):
    """What a batch's tasks wrote, once reconciled (and, for Delta, committed).

    Attributes:
        results: One result per planned range.
        files: The files written, per table.
        run_id: This run's id, part of every file name it wrote.
    """

    results: list[RangeResult]
    files: dict[TableName, list[WrittenFile]]
    run_id: str


@contextmanager
def own_files_on_loss(cfg: PipelineConfig, batch: int, run_id: str) -> Iterator[None]:
    """On a lost lease, delete this run's own plain Parquet files of the batch, then stop.

    They are not committed and never will be by this run; their names carry its id, so
    they are told from the files of the run that took over.
    """
    try:
        yield
    except LeaseLost:
        if cfg.table_format == "parquet":
            remove_batch_files(cfg, batch, only_run=run_id)
        raise


def _source_for(
    cfg: PipelineConfig,
    plan: BatchPlan,
    done: dict[TableName, bool],
    resumed: bool,
    outcome: RunOutcome,
) -> str:
    """Where the batch's messages are read from: Kafka, or the raw copy.

    Once a batch's raw copy is committed it holds exactly the batch's messages, so the
    rest of the batch is read from it: Kafka's retention, or a topic re-created since,
    can no longer stop the batch. Before that, a resumed batch checks that Kafka still
    holds what was planned, and stops with the way on if it does not.
    """
    if done.get("raw"):
        if plan.source == "kafka" and plan.offsets:
            outcome.warnings.append(
                f"batch {plan.batch}'s raw copy was committed before the run stopped; the rest "
                "of the batch was read from it"
            )
        return "raw"
    if plan.source != "kafka" or not resumed:
        return plan.source
    if plan.topic_ids:
        check_topic_ids(cfg, plan)
    missing = kafka_misses(cfg, plan)
    if not missing:
        return "kafka"
    if plan.kind != "ingest" and all(raw_covers(cfg, r) for r in plan.ranges):
        outcome.warnings.append(
            f"{'; '.join(missing)}: read from the raw copy, which holds every committed offset"
        )
        return "raw"
    raise PlanError(
        f"batch {plan.batch}'s saved plan can no longer be read: {'; '.join(missing)}. "
        "Retention deleted the offsets (or the topic was re-created) after the plan was "
        "saved and before its raw copy was committed. Nothing was read. Abandon the plan "
        f"with `strata plan drop --pipeline {cfg.name} --batch {plan.batch} --reason TEXT`; "
        "the next `strata run --accept-loss TEXT` then records the loss and goes on."
    )


def kafka_misses(cfg: PipelineConfig, plan: BatchPlan) -> list[str]:
    """The planned ranges Kafka no longer holds, in words."""
    wanted = {(r.topic, r.partition): r for r in plan.ranges if r.count}
    held = {
        (s.topic, s.partition): (s.low, s.high)
        for s in partition_states(cfg.source(), {})
        if (s.topic, s.partition) in wanted
    }
    missing = []
    for key, r in sorted(wanted.items()):
        low, high = held.get(key, (None, None))
        if low is None or high is None:
            missing.append(f"{r.describe()}: the broker no longer lists the partition")
        elif r.start < low or r.end > high:
            missing.append(f"{r.describe()}: Kafka now holds [{low}, {high})")
    return missing


def raw_covers(cfg: PipelineConfig, target: OffsetRange) -> bool:
    """Whether committed ingests cover the range, so the raw copy holds its messages.

    Ranges recorded as lost to retention count as covered: no copy holds them, and
    reading the range counts them as gaps, as the ingest did.
    """
    rows = read_ledger(cfg.places()).to_pylist()
    spans = sorted(
        (r["start_offset"], r["end_offset"])
        for r in rows
        if r["kind"] in ("ingest", "loss")
        and (r["topic"], r["partition"]) == (target.topic, target.partition)
    )
    reach = target.start
    for start, end in spans:
        if start > reach:
            break
        reach = max(reach, end)
    return reach >= target.end


def tables_done(
    cfg: PipelineConfig, names: tuple[TableName, ...], batch: int
) -> dict[TableName, bool]:
    """Whether each Delta table already holds the batch's commit (its app transaction)."""
    return {
        name: (committed_batch(cfg.location(name), cfg.name, cfg.storage_options) or 0) >= batch
        for name in names
    }


def stored_results(cfg: PipelineConfig, batch: int) -> list[RangeResult]:
    """A committed batch's per-partition results, from the data table's commit info."""
    stored = batch_metadata(cfg.location("table"), batch, cfg.storage_options, RANGES_KEY)
    if stored is None:
        raise ReconcileError(
            f"batch {batch}: the data table records it but its commit has no ranges; "
            "the table was written by something other than this pipeline"
        )
    known = {f.name for f in fields(RangeResult)}
    return [RangeResult(**{k: v for k, v in r.items() if k in known}) for r in stored]


def commit_table(
    cfg: PipelineConfig,
    name: TableName,
    files: list[WrittenFile],
    batch: int,
    meta: dict[str, Any],
    replacing: list[OffsetRange] | None = None,
) -> list[str]:
    """Commit a batch's files to one Delta table, with its app transaction, once.

    Args:
        cfg: The pipeline configuration.
        name: `raw`, `quarantine` or `table`.
        files: The batch's files for this table.
        batch: The batch number.
        meta: Commit metadata.
        replacing: Ranges whose existing rows this commit removes (a backfill or
            replay): the files holding them are rewritten without them, in the same
            transaction.

    Returns:
        The columns added to the table first, because the schema gained fields.
    """
    uri = cfg.location(name)
    schema, partition_by = table_layout(cfg.schemas(), name)
    table = ensure_table(
        uri, schema, partition_by, cfg.storage_options, cfg.name + TABLE_SUFFIXES[name]
    )
    added = add_missing_columns(table, schema)
    if added:
        table = ensure_table(
            uri, schema, partition_by, cfg.storage_options, cfg.name + TABLE_SUFFIXES[name]
        )
    removes: list[RemoveAction] = []
    if replacing:
        fs, root = filesystem(uri, cfg.storage_options)
        removes, rewritten, _ = without_ranges(table, fs, root, partition_by, replacing, batch)
        files = files + rewritten
    commit_files(table, schema, partition_by, files, cfg.name, batch, meta, removes)
    faults.reached(faults.AFTER_COMMIT[name])
    return added


def fence_table(cfg: PipelineConfig, name: TableName, batch: int, note: str) -> bool:
    """Commit the batch's number to a Delta table with no files: a fence.

    A ledger edit (a dropped plan, a seek) takes a batch number. A runner still holding
    a plan of that number, woken from a pause, would otherwise commit it to tables the
    ledger will never account for; with the fence its commits are no-ops.

    Returns:
        True if this call committed the fence, False if the table held the batch.
    """
    uri = cfg.location(name)
    schema, partition_by = table_layout(cfg.schemas(), name)
    table = ensure_table(
        uri, schema, partition_by, cfg.storage_options, cfg.name + TABLE_SUFFIXES[name]
    )
    return commit_files(table, schema, partition_by, [], cfg.name, batch, {FENCE_KEY: note})


def remove_batch_rows(cfg: PipelineConfig, name: TableName, batch: int, note: str) -> int:
    """Remove an ingest batch's own files from a Delta table; how many were removed."""
    table = open_table(cfg.location(name), cfg.storage_options)
    if table is None:
        return 0
    removes = batch_removes(table, batch)
    schema, partition_by = table_layout(cfg.schemas(), name)
    commit_removes(table, schema, partition_by, removes, batch, {FENCE_KEY: note})
    return len(removes)


def run_tasks(
    cfg: PipelineConfig,
    plan: BatchPlan,
    write: frozenset[TableName],
    session: Callable[[PipelineConfig], SparkSession] | None,
    outcome: RunOutcome,
    source: str,
    raw_batch: int | None,
    run_id: str,
) -> list[SplitResult]:
    """Start Spark and run one task per split of the plan, writing the given tables.

    Every file name carries this run's id, so files of another runner, or of an
    earlier attempt, are never overwritten: only the commit decides which count.
    """
    jobs = [
        SplitJob(cfg, plan.batch, i, split, write, source, run_id, raw_batch)
        for i, split in enumerate(plan.splits)
    ]
    if session is None:
        from strata.spark.session import build_session

        session = build_session
    from strata.spark.session import default_tasks, execute

    t0 = time.monotonic()
    with outcome.stages.timed("spark_start"):
        spark = session(cfg)
    outcome.spark_seconds = time.monotonic() - t0
    # Under spark-submit the submitted master wins over the pipeline's.
    shared = cfg.shared_storage_error(spark.sparkContext.master or cfg.spark.master)
    if shared:
        raise PlanError(shared)
    if cfg.table_format == "parquet" and spark.conf.get("spark.speculation", "false") == "true":
        # A speculative copy still writing after the batch's files were settled would
        # leave files in directories whose every file is the table.
        raise PlanError(
            "spark.speculation is on; plain Parquet tables need it off (every file in their "
            "directories is read). Set spark.speculation=false for this job."
        )
    t1 = time.monotonic()
    reducers = default_tasks(cfg) if cfg.layout == "shuffle" else 0
    with outcome.stages.timed("tasks"):
        results = execute(spark, jobs, f"{cfg.name} batch {plan.batch}", reducers)
    outcome.read_seconds = time.monotonic() - t1
    return results


def remove_batch_files(
    cfg: PipelineConfig,
    batch: int,
    keep: Collection[str] = (),
    only_run: str | None = None,
    lock: RunLock | None = None,
) -> int:
    """Delete files of `batch` from the plain Parquet tables, but those in `keep`.

    Without a table log the files in the directories are the table, so a runner must
    never delete what another one committed: with a `lock`, the files are listed first,
    the ledger is then checked not to hold the batch, and the lease is checked before
    each deletion.

    Args:
        cfg: The pipeline configuration.
        batch: The batch.
        keep: Paths relative to their table's root that stay (the batch's own files).
        only_run: Delete only files this run (by its id) wrote.
        lock: The run's lock, when files of other runs may be deleted.

    Returns:
        How many files were deleted.

    Raises:
        PlanError: If the ledger holds the batch: another run committed it meanwhile.
    """
    doomed: list[tuple[pafs.FileSystem, str]] = []
    for name in TABLES:
        fs, root = filesystem(cfg.location(name), cfg.storage_options)
        if fs.get_file_info(root).type == pafs.FileType.NotFound:
            continue
        for info in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
            if not (info.type == pafs.FileType.File and is_batch_file(info.base_name, batch)):
                continue
            if info.path[len(root) :].lstrip("/") in keep:
                continue
            if only_run is not None and f"-{only_run}-" not in info.base_name:
                continue
            doomed.append((fs, info.path))
    if lock is not None and doomed:
        lock.check()
        if (committed_batch(cfg.location("ledger"), cfg.name, cfg.storage_options) or 0) >= batch:
            raise PlanError(
                f"batch {batch} was committed by another run while this one ran; nothing of "
                "this run was committed, and that run's files were left as they are"
            )
    for fs, path in doomed:
        if lock is not None:
            lock.check()
        fs.delete_file(path)
    return len(doomed)


def loss_row(lost: OffsetRange, note: str) -> dict[str, object]:
    """The ledger's record of a range deleted by retention before it was read."""
    return unread_row("loss", lost.topic, lost.partition, lost.start, lost.end, lost.count, note)


def ledger_row(
    r: RangeResult, watermarks: dict[str, int], kind: str = "ingest", note: str | None = None
) -> dict[str, object]:
    """A batch's ledger row for one partition."""

    def ts(us: int | None) -> datetime | None:
        return None if us is None else datetime.fromtimestamp(us / 1_000_000, tz=UTC)

    return {
        "kind": kind,
        "note": note,
        "topic": r.topic,
        "partition": r.partition,
        "start_offset": r.start,
        "end_offset": r.end,
        "messages": r.messages,
        "rows": r.rows,
        "quarantined": r.quarantined,
        "gaps": r.gaps,
        "bytes": r.bytes,
        "late_rows": r.late_rows,
        "max_lateness_ms": r.max_lateness_ms,
        "min_event_time": ts(r.min_event_us),
        "max_event_time": ts(r.max_event_us),
        "high_watermark": watermarks.get(f"{r.topic}:{r.partition}"),
    }


def _lag(
    states: list[PartitionState], committed: dict[tuple[str, int], int]
) -> dict[tuple[str, int], int]:
    return {
        (s.topic, s.partition): max(s.high - committed.get((s.topic, s.partition), s.low), 0)
        for s in states
    }


def register(cfg: PipelineConfig, outcome: RunOutcome) -> None:
    """Register the tables in the metastore, after the commit; a failure loses nothing."""
    if not cfg.metastore.uri:
        return
    from strata.catalog.register import register_tables, render_registration
    from strata.errors import MetastoreError

    try:
        # The columns of a table that follows its registry are those it evolved to.
        from strata.quality.table import register_written

        report = register_tables(table_schema(cfg))
        register_written(cfg, report)
        outcome.registered = render_registration(report)
        if cfg.trino.url:
            from strata.catalog.sql import run_in_trino, trino_statements

            ran = run_in_trino(cfg, trino_statements(cfg))
            outcome.registered += f"; {len(ran)} statement(s) run in Trino at {cfg.trino.url}"
    except MetastoreError as exc:
        done = f"batch {outcome.batch} is committed; " if outcome.batch else ""
        outcome.register_error = (
            f"{done}registering the tables in the metastore failed: {exc}. The next run, "
            f"or `strata register --pipeline {cfg.name}`, completes the registration."
        )


def _late_after_completion(cfg: PipelineConfig, outcome: RunOutcome) -> None:
    """Warn of the batch's rows that landed in partitions already complete before it."""
    if not cfg.completeness.enabled:
        return
    from strata.catalog.completeness import completeness, late_warnings

    try:
        found = completeness(cfg, outcome.batch, totals=False, quality=False)
        outcome.late_after_completion = found.late
        outcome.warnings.extend(late_warnings(found))
    except Exception as exc:  # noqa: BLE001 - the batch stands; this is a report
        outcome.warnings.append(f"rows late after completion not counted: {exc}")


def _publish_offsets(cfg: PipelineConfig, ranges: list[OffsetRange], outcome: RunOutcome) -> None:
    problem = publish_offsets(cfg.source(), ranges)
    if problem:
        outcome.warnings.append(problem + " (the ledger holds the truth; lag tools are behind)")
