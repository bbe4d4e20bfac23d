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
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import pyarrow as pa

from strata import faults
from strata.batch.commit import (
    BatchWork,
    Steps,
    run_alone,
    run_steps,
    write_and_commit,
)
from strata.batch.kafka import asked_together, partition_states, publish_offsets
from strata.batch.outcome import RunOutcome, Seen
from strata.batch.parquet_files import own_files_on_loss, remove_batch_files
from strata.batch.plan import (
    KEPT_PLANS,
    BatchPlan,
    PartitionState,
    PlanStore,
    Reprocess,
    decode_fingerprint,
    vanished_topics,
)
from strata.batch.planning import (
    PlanSettings,
    check_continues,
    check_schema,
    check_topic_ids,
    data_columns,
    new_plan,
    recovered_plan,
)
from strata.batch.reconcile import TABLES
from strata.batch.task import TaskSpec
from strata.config import KafkaSource, PipelineConfig, TrinoConfig
from strata.edge import registration
from strata.errors import PlanError, StorageError
from strata.operations.routes import (
    remember_table,
    require_one_table,
    retire_table,
    revive_table,
)
from strata.schema.evolve import evolved, table_schema
from strata.stages import Stages
from strata.store.identity import check_tables
from strata.store.ledger import (
    RUN_COLUMNS,
    LedgerState,
    Opened,
    commit_ledger,
    ledger_row,
    ledger_state,
    loss_row,
    open_ledger,
    recent_state,
)
from strata.store.locations import void_unfinished_moves
from strata.store.lock import BothLocks, RunLock, run_lock
from strata.store.ranges import OffsetRange

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import SparkSession

    from strata.catalog.register import Registration
    from strata.store.places import Places


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
    return run_alone(_run_steps(cfg, max_offsets, session, register_tables, accept_loss))


def run_batches(
    tables: Sequence[PipelineConfig],
    *,
    max_offsets: int | None = None,
    session: Callable[[PipelineConfig], SparkSession] | None = None,
    register_tables: bool = True,
    accept_loss: str | None = None,
) -> list[RunOutcome | Exception]:
    """Run the next batch of each table of a routed pipeline, reading them in one Spark job.

    Each table's batch is what `run_batch` makes of it, with its own lock, plan,
    commits and ledger, exactly once by the same rules: only the tasks are shared, so
    the pipeline pays for one Spark job, not one per table. A table that fails (its
    plan, its tasks or its commits) fails alone.

    Args:
        tables: The tables, each configured (`strata.edge.table_configs`).
        max_offsets: Per-partition cap for this run, overriding the config.
        session: Builds the Spark session; only called when there is data to read.
        register_tables: Register each table in the metastore after its commit.
        accept_loss: Who accepts offsets lost to retention, and why.

    Returns:
        Each table's outcome, or the error that stopped it, in the order given.
    """
    # Every table's questions to the brokers (its partitions and their watermarks, the
    # topics' ids), asked once for all, as the run begins.
    with asked_together([c.source() for c in tables]):
        return run_steps(
            [_run_steps(c, max_offsets, session, register_tables, accept_loss) for c in tables]
        )


def _run_steps(
    cfg: PipelineConfig,
    max_offsets: int | None,
    session: Callable[[PipelineConfig], SparkSession] | None,
    register_tables: bool,
    accept_loss: str | None,
) -> Steps[RunOutcome]:
    """A pipeline's run (`run_batch`) as steps, which yield its tasks where they are to run."""
    began = time.monotonic()
    planning = Stages()
    places = cfg.places()
    require_one_table(places, cfg.source(), cfg.routing, "run_batch")
    remember_table(places)
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
            # Where reading goes on is the state the newest ledger commit recorded; an
            # idle run's summary (`strata.operations.metrics.after_run`) reads the newest
            # batches' rows only: neither grows with the pipeline's history.
            # The ledger is opened once, for the plan's checks and the ledger commit.
            ledger = open_ledger(places)
            rows, state = recent_state(places, RUN_COLUMNS, ledger)
            plan, resumed, states = _load_or_plan(
                places, plan_settings(cfg), state, max_offsets, accept_loss, ledger
            )
        if plan is not None:
            # A plan reads with the schema it was saved with; one saved without (a
            # backfill's) with the schema the table has evolved to.
            cfg = cfg.with_schema_text(plan.reader_schema or table_schema(places, cfg.decoding()))
        if plan is None:
            outcome = RunOutcome(cfg.name, "idle", lag=_lag(states, state.committed))
            outcome.seen = Seen(rows, state, states)
            # Catch the consumer group up with the ledger, in case a run died before.
            ranges = [OffsetRange(t, p, e, e) for (t, p), e in state.committed.items()]
            _publish_offsets(cfg.source(), ranges, outcome)
            if places.route_of is not None and not states:
                retire_table(places)
                outcome.warnings.append(
                    f"no topic on the brokers is routed to table {cfg.name} now: the "
                    "pipeline's runs leave it out until one is again (its tables, ledger "
                    "and status stay)"
                )
        elif plan.kind == "ingest":
            outcome = yield from _ingest(
                batch_work(cfg, session), plan, state, resumed, lock, ledger
            )
            if outcome.recorded is not None:
                # The summary's view: the newest rows and the state as this commit left
                # them, not read back from the ledger (hundreds of times when routed).
                landed = outcome.recorded.rows.select(RUN_COLUMNS).cast(rows.schema)
                outcome.seen = Seen(pa.concat_tables([rows, landed]), outcome.recorded.state, None)
        else:
            outcome = yield from execute_reprocess(
                batch_work(cfg, session), plan, lock, resumed=True
            )
            outcome.warnings.insert(
                0,
                f"batch {plan.batch} is a {plan.kind} planned at {plan.created_at or 'an earlier '}"
                f"run ({plan.note}) and left unfinished; it was finished as a {plan.kind}, "
                "replacing its ranges' rows. New offsets are read by the next run.",
            )
        for topic in vanished_topics(cfg.source(), states, state.committed):
            outcome.warnings.append(
                f"topic `{topic}` matched topics_pattern and has committed offsets, but the "
                "brokers no longer list it: it was deleted, and is no longer read. Its rows "
                "and ledger rows stay"
            )
        if plan is not None and plan.kind == "ingest" and outcome.batch is not None:
            _late_after_completion(registration(cfg), outcome)
        outcome.stages.merge(planning)
        if register_tables:
            with outcome.stages.timed("register"):
                register(registration(cfg), cfg.trino, outcome)
        outcome.seconds = time.monotonic() - began
        return outcome


def batch_work(
    cfg: PipelineConfig, session: Callable[[PipelineConfig], SparkSession] | None = None
) -> BatchWork:
    """How the pipeline's batches are run and committed, built from its configuration.

    Args:
        cfg: The pipeline configuration, reading with the schema the batch reads with.
        session: Builds the Spark session; by default, from the pipeline's settings.
    """
    from strata.spark.session import build_session, default_tasks

    def start() -> SparkSession:
        if session is not None:
            return session(cfg)
        return build_session(cfg.spark, cfg.name)

    places = cfg.places()
    spec = TaskSpec(places, cfg.decoding(), cfg.kafka, cfg.group_id, cfg.limits)
    shuffle = cfg.layout == "shuffle"
    return BatchWork(
        places,
        cfg.source(),
        spec,
        decode_fingerprint(spec.decoding),
        start,
        cfg.spark.master,
        default_tasks(cfg.spark, cfg.name, cfg.airflow.spark_mode == "spark_submit")
        if shuffle
        else 0,
    )


def plan_settings(cfg: PipelineConfig) -> PlanSettings:
    """How the pipeline's batches are planned, built from its configuration.

    Args:
        cfg: The pipeline configuration, reading with the schema its table evolved to.
    """
    from strata.spark.session import default_tasks, submitted_master

    return PlanSettings(
        cfg.name,
        cfg.source(),
        cfg.limits,
        cfg.on_data_loss == "accept",
        default_tasks(cfg.spark, cfg.name, cfg.airflow.spark_mode == "spark_submit"),
        cfg.decoding(),
        # Before anything is saved: spark-submit may name a cluster the YAML does not.
        submitted_master() or cfg.spark.master,
    )


def _ingest(
    work: BatchWork,
    plan: BatchPlan,
    state: LedgerState,
    resumed: bool,
    lock: RunLock,
    ledger: DeltaTable | None = None,
) -> Steps[RunOutcome]:
    """Read, check and commit an ingest batch, then publish its offsets.

    `ledger` is the ledger as the run opened it to plan (None: opened when needed); the
    ledger commit builds on it, and delta-rs refuses the commit if another landed since.
    """
    places = work.places
    outcome = RunOutcome(
        places.pipeline,
        "resumed" if resumed else "committed",
        plan.batch,
        new_partitions=plan.new_partitions,
    )
    check_continues(places, plan, state)
    if resumed:
        check_schema(places, work.task.decoding, "open" if ledger is None else ledger)
    written = yield from write_and_commit(work, plan, TABLES, outcome, lock, resumed)
    results = outcome.ranges = written.results
    outcome.data_table = written.data
    ledger_rows = [
        ledger_row(r, plan.watermarks, note=_began(plan, r.topic, r.partition, r.start))
        for r in results
    ]
    ledger_rows += [loss_row(x.topic, x.partition, x.start, x.end, plan.note) for x in plan.losses]
    for lost in plan.losses:
        outcome.warnings.append(
            f"{lost.describe()}: {lost.count} messages were deleted by retention before "
            f"they were read; the loss is recorded in the ledger ({plan.note})"
        )
    with own_files_on_loss(places, plan.batch, written.run_id), outcome.stages.timed("ledger"):
        lock.check()
        landed = outcome.recorded = commit_ledger(
            places,
            plan.batch,
            ledger_rows,
            data_columns(work.schemas),
            plan.topic_ids,
            json.loads(plan.reader_schema) if plan.reader_schema else None,
            ledger=ledger,
            tables=written.vouched,
        )
    faults.reached(faults.AFTER_LEDGER)
    if not landed:
        # Another runner committed the batch first; this run's commits were no-ops.
        if places.format == "parquet":
            remove_batch_files(places, plan.batch, only_run=written.run_id)
        outcome.warnings.append(
            f"batch {plan.batch} was committed by another run first; this run committed "
            "nothing and left the consumer group as it was"
        )
        return outcome
    if places.format == "parquet":
        # The ledger holds the batch with this run's files: any other file of it (an
        # attempt of a runner that lost its lease) is not the batch's.
        kept = {f.path for fs in written.files.values() for f in fs}
        if kept:
            remove_batch_files(places, plan.batch, keep=kept)
    _publish_offsets(
        work.source, [OffsetRange(r.topic, r.partition, r.start, r.end) for r in results], outcome
    )
    _forget_plan(places, plan.batch - KEPT_PLANS, outcome)
    try:
        after = partition_states(work.source, {(r.topic, r.partition): r.end for r in results})
        committed = dict(state.committed)
        committed.update({(r.topic, r.partition): r.end for r in results})
        outcome.lag = _lag(after, committed)
    except Exception as exc:  # noqa: BLE001 - lag is informational; the batch stands
        outcome.warnings.append(f"lag after the run unknown: {exc}")
    return outcome


def _forget_plan(places: Places, batch: int, outcome: RunOutcome) -> None:
    """Delete an old committed batch's saved plan, so the plans kept stay `KEPT_PLANS`."""
    if batch < 1:
        return
    try:
        PlanStore(places).forget(batch)
    except StorageError as exc:
        # The batch stands; the plan is only clutter, which the next vacuum clears.
        outcome.warnings.append(
            f"the saved plan of batch {batch} could not be deleted ({exc}); "
            f"`strata vacuum --pipeline {places.pipeline}` deletes it"
        )


def _began(plan: BatchPlan, topic: str, partition: int, start: int) -> str | None:
    """The ledger's note on a partition's first range: where it began and why."""
    why = plan.began.get(f"{topic}:{partition}")
    return None if why is None else f"began at offset {start}: {why}"


def execute_reprocess(
    work: BatchWork, plan: BatchPlan, lock: RunLock, resumed: bool
) -> Steps[RunOutcome]:
    """Run a saved backfill or replay plan: its ranges' rows are replaced, once.

    From Kafka, the raw copy's rows of the ranges are replaced too; from the raw copy,
    it stays as it is. The ledger records the batch with its kind and reason and
    never moves where reading goes on.
    """
    status = "replayed" if plan.kind == "replay" else "backfilled"
    places = work.places
    outcome = RunOutcome(places.pipeline, status, plan.batch)
    if plan.source == "raw" and plan.kind == "backfill":
        outcome.warnings.append(
            f"{', '.join(r.describe() for r in plan.ranges)} are no longer in Kafka; they were "
            "read from the raw copy"
        )
    tables = ("quarantine", "table") if plan.source == "raw" else TABLES
    # It rewrites files a compaction may be merging: the two never run at once.
    with run_lock(places, "maintenance") as maintenance:
        written = yield from write_and_commit(
            work, plan, tables, outcome, BothLocks(lock, maintenance), resumed
        )
        results = outcome.ranges = written.results
    lock.check()
    commit_ledger(
        places,
        plan.batch,
        [ledger_row(r, {}, plan.kind, plan.note) for r in results],
        data_columns(work.schemas),
        tables=written.vouched,
    )
    faults.reached(faults.AFTER_LEDGER)
    return outcome


def plan_next(
    places: Places, settings: PlanSettings, max_offsets: int | None = None
) -> BatchPlan | None:
    """Plan and persist the next batch without running it (no JVM); None if idle.

    An unfinished batch's saved plan is returned as it is, so the run that follows
    reads exactly what was planned.

    Args:
        places: The pipeline's places.
        settings: How its batches are planned (`plan_settings`).
        max_offsets: Per-partition cap for this batch, overriding the config.
    """
    with run_lock(places):
        plan, _, _ = _load_or_plan(places, settings, ledger_state(places), max_offsets, None)
        return plan


def _load_or_plan(
    places: Places,
    settings: PlanSettings,
    state: LedgerState,
    max_offsets: int | None,
    accept_loss: str | None,
    ledger: Opened = "open",
) -> tuple[BatchPlan | None, bool, list[PartitionState]]:
    """The unfinished batch's saved plan, or a new one saved before any read.

    `ledger` is the ledger if the caller opened it already (`strata.store.ledger.Opened`).

    Returns:
        The plan (None when there is nothing new), whether it was an unfinished
        batch's (or another runner's, saved first), and the partitions' watermarks
        when a new plan was made.
    """
    shared = places.shared_storage_error(settings.master)
    if shared:
        raise PlanError(shared)
    source, decoding = settings.source, settings.decoding
    store = PlanStore(places)
    plan = store.load(state.last_batch + 1)
    if plan is not None:
        # Before anything is read or written: the tables are those the ledger's batches
        # went to (none deleted, dropped or replaced by hand), and the ledger is theirs. A
        # recorded rebuild's plan makes its tables afresh.
        check_tables(places, state, rebuilding=plan.rebuild)
        return plan, True, []
    states = partition_states(source, state.committed)
    plan = new_plan(
        settings, state.last_batch + 1, states, max_offsets, accept_loss, state.committed
    )
    if plan is None:
        return None, False, states
    # Before the plan is saved, so nothing is read into or written beside a table that is
    # not the ledger's; an idle run, which writes nothing, skips it (`strata status` tells).
    if check_tables(places, state) > state.last_batch:
        # A table committed the batch, but its saved plan is gone (the state folder was
        # removed by hand): the commit recorded what the batch read, and is the plan.
        recovered = recovered_plan(places, settings, state)
        if recovered is not None:
            return recovered, True, states
    # Before the plan is saved, so nothing of a re-created topic or an incompatible
    # schema is ever read; an idle run skips both.
    plan = replace(
        plan,
        topic_ids=check_topic_ids(
            places,
            source,
            topics={s.topic for s in states},
            committed=state.committed.keys(),
            ledger=ledger,
        ),
    )
    if decoding.registry.evolve:
        # The schema is settled with the plan and saved in it: a resumed batch reads
        # with it whatever the registry holds by then.
        decoding = decoding.reading(table_schema(places, decoding))
        decoding = decoding.reading(evolved(decoding, {r.topic for r in plan.ranges}))
        plan = replace(
            plan, reader_schema=decoding.schemas.text, fingerprint=decode_fingerprint(decoding)
        )
    check_schema(places, decoding, ledger)
    saved = store.create(plan)
    return saved, saved is not plan, states


def _lag(
    states: list[PartitionState], committed: dict[tuple[str, int], int]
) -> dict[tuple[str, int], int]:
    return {
        (s.topic, s.partition): max(
            s.high_watermark - committed.get((s.topic, s.partition), s.low), 0
        )
        for s in states
    }


def register(catalog: Registration, trino: TrinoConfig | None, outcome: RunOutcome) -> None:
    """Register the tables in the metastore, after the commit; a failure loses nothing.

    Args:
        catalog: What registering the tables needs (`strata.edge.registration`).
        trino: The Trino told of new partitions at its `url`; None when Trino is told
            another way (an Airflow connection).
        outcome: The run's outcome: what was registered, or why not, is noted in it.
    """
    if not catalog.metastore.uri:
        return
    from strata.catalog.register import register_tables, render_registration
    from strata.errors import MetastoreError
    from strata.quality.table import register_written

    places = catalog.places
    try:
        report = register_tables(catalog)
        register_written(places, catalog.metastore, catalog.warehouse, report)
        outcome.registered = render_registration(report)
        if trino is not None and trino.url:
            from strata.catalog.sql import run_in_trino, trino_statements

            ran = run_in_trino(trino, trino_statements(places, catalog.metastore, trino))
            outcome.registered += f"; {len(ran)} statement(s) run in Trino at {trino.url}"
    except MetastoreError as exc:
        done = f"batch {outcome.batch} is committed; " if outcome.batch else ""
        outcome.register_error = (
            f"{done}registering the tables in the metastore failed: {exc}. The next run, "
            f"or `strata register --pipeline {places.pipeline}`, completes the registration."
        )


def _late_after_completion(catalog: Registration, outcome: RunOutcome) -> None:
    """Warn of the batch's rows that landed in partitions already complete before it."""
    if not catalog.completeness.enabled:
        return
    from strata.catalog.completeness import batch_facts, completeness, late_warnings

    try:
        if outcome.batch is not None:
            # Read once for this and for the completeness published after the gate.
            recorded = None if outcome.recorded is None else outcome.recorded.state
            outcome.facts = batch_facts(catalog.places, outcome.batch, outcome.data_table, recorded)
        found = completeness(
            catalog.places,
            catalog.completeness,
            catalog.schemas.partitioning,
            catalog.gate,
            catalog.asset,
            outcome.batch,
            totals=False,
            quality=False,
            facts=outcome.facts,
        )
        outcome.late_after_completion = found.late
        outcome.warnings.extend(late_warnings(found))
    except Exception as exc:  # noqa: BLE001 - the batch stands; this is a report
        outcome.warnings.append(f"rows late after completion not counted: {exc}")


def _publish_offsets(source: KafkaSource, ranges: list[OffsetRange], outcome: RunOutcome) -> None:
    problem = publish_offsets(source, ranges)
    if problem:
        outcome.warnings.append(problem + " (the ledger holds the truth; lag tools are behind)")


def reprocess(
    cfg: PipelineConfig,
    kind: Reprocess,
    targets: list[OffsetRange],
    reason: str,
    *,
    session: Callable[[PipelineConfig], SparkSession] | None = None,
    rebuild: tuple[str, ...] = (),
) -> RunOutcome:
    """Backfill or replay committed ranges, replacing their rows; or finish one unfinished.

    A backfill re-ingests its ranges from Kafka (or, for offsets Kafka no longer
    holds, from the raw copy) and replaces their rows in every table. A replay
    re-decodes them from the raw copy with the current schema and decoder and replaces
    their rows in the data and quarantine tables, one transaction per table; the raw
    copy is left as it is and Kafka is never contacted.

    Args:
        cfg: The pipeline configuration.
        kind: `backfill` or `replay`.
        targets: At most one range per partition; a replay's may come from
            `strata.operations.backfill.replay_targets`.
        reason: Why; recorded in the ledger.
        session: Builds the Spark session.
        rebuild: For a replay of every batch, the tables gone or replaced that it makes
            afresh (`strata.operations.backfill.rebuild_request`).

    Returns:
        The outcome, with status `backfilled` or `replayed`.

    Raises:
        BackfillError: If a range is invalid, not committed yet, or held by no copy; or
            another backfill or replay is unfinished.
    """
    from strata.operations.backfill import reprocess_plan

    began = time.monotonic()
    work = batch_work(cfg, session)
    with run_lock(work.places) as lock:
        plan, resumed = reprocess_plan(
            work.places, plan_settings(cfg), targets, reason, kind, rebuild
        )
        # A plan left unfinished is finished by the next run: the table must be among them.
        revive_table(work.places)
        outcome = run_alone(execute_reprocess(work, plan, lock, resumed))
        register(registration(cfg), cfg.trino, outcome)
        outcome.seconds = time.monotonic() - began
        return outcome
