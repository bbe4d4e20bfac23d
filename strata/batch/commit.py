"""The commit protocol of a batch: its tasks' files reconciled, then each table committed once.

Nothing is committed until the batch reconciles from what was really read and
written: the tasks' pieces tile every planned range, every offset was read once or
confirmed as a gap, and the files hold each offset read exactly once. Commit order is
raw copy, quarantine, data table (then the ledger, by the conductor). Each table's
commit carries the batch's app transaction, checked again inside the commit, so after
a crash at any point, or with a second runner, a re-run sees which commits stand,
rewrites only the files of tables not yet committed, and commits the rest once. The
tables are read back before the ledger commit. The ledger edits (a dropped plan, a
seek) fence the tables with the batch number they take (`fence_table`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Generator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

from deltalake import DeltaTable
from deltalake.transaction import RemoveAction

from strata import faults
from strata.batch.kafka import partition_states
from strata.batch.outcome import RunOutcome
from strata.batch.parquet_files import own_files_on_loss, remove_batch_files
from strata.batch.plan import BatchPlan, drop_command
from strata.batch.planning import check_topic_ids
from strata.batch.reconcile import (
    RANGES_KEY,
    TABLES,
    batch_results,
    planned_results,
    reconcile_files,
    reconcile_resumed,
    reconcile_tables,
)
from strata.batch.task import RangeResult, SplitJob, SplitResult, TaskSpec, execute
from strata.config import KafkaSource, SchemaSpec, TableName
from strata.errors import PlanError, ReconcileError
from strata.log import get_logger
from strata.schema.avro import table_layout
from strata.stages import Stages
from strata.store import iceberg, iceberg_swap
from strata.store.delta import (
    add_missing_columns,
    batch_removes,
    commit_files,
    commit_removes,
    create_with_files,
    ensure_table,
    open_table,
    up_to_date,
    without_ranges,
)
from strata.store.identity import mark_parquet_table, refuse_foreign, vouch
from strata.store.ledger import Vouched, read_ledger
from strata.store.lock import RunLock
from strata.store.parquet import WrittenFile
from strata.store.places import Places
from strata.store.ranges import OffsetRange
from strata.store.tables import batch_record

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


logger = get_logger(__name__)

# Commit metadata of the empty commits and removals a ledger edit makes in the tables.
FENCE_KEY = "strata.fence"
# Commit metadata: the run (its id) whose files a table's commit of a batch holds.
RUN_KEY = "strata.run"


@dataclass(frozen=True)
class BatchWork:
    """How a pipeline's batches are run and committed; built once by the conductor.

    Attributes:
        places: Where the tables are, and their names.
        source: The brokers and the pipeline's topics there.
        task: What each Spark task needs (the decoding among it).
        fingerprint: What decides whether and where a message lands, as now configured.
        session: Starts (or finds) the Spark session.
        master: The Spark master the pipeline names (spark-submit's wins at run time).
        reducers: For the `shuffle` layout, how many tasks write the data table's rows;
            0 for `per_task`.
    """

    places: Places
    source: KafkaSource
    task: TaskSpec
    fingerprint: str
    session: Callable[[], SparkSession]
    master: str
    reducers: int = 0

    @property
    def schemas(self) -> SchemaSpec:
        """What the tables' schemas are made from."""
        return self.task.decoding.schemas


def write_and_commit(
    work: BatchWork,
    plan: BatchPlan,
    tables: tuple[TableName, ...],
    outcome: RunOutcome,
    lock: RunLock,
    resumed: bool,
) -> Steps[BatchWrite]:
    """Run the batch's tasks, reconcile what they wrote, and commit each table once.

    Tables whose commit of the batch already stands are neither rewritten nor
    committed again. Nothing is committed unless the files reconcile with what was
    read, and the tables are read back before the ledger commit.

    The steps yield the batch's tasks (a `TaskRequest`) where they are to run, and go
    on with their results: whoever drives them (`run_steps`) runs the tasks of many
    batches, of the tables of a routed pipeline, in one Spark job.

    Args:
        work: How the pipeline's batches are run and committed.
        plan: The batch's plan.
        tables: The tables the batch writes.
        outcome: What the run did, filled in as it goes.
        lock: The run's lock, checked before each commit.
        resumed: Whether the batch was begun by an earlier run.

    Returns:
        One result per planned range (empty ones included), the files written, and
        this run's id (part of every file name).
    """
    places = work.places
    parquet = places.format == "parquet"
    replacing = None if plan.kind == "ingest" else plan.ranges
    # Each Delta table is opened once for the batch, and the handle passed along: to
    # tell whether the batch stands in it, to commit to it, and to read it back. Plain
    # Parquet tables have no commits of their own (the ledger decides): none is opened.
    handles: dict[TableName, Any] = (
        dict.fromkeys(tables) if parquet else open_tables(places, tables)
    )
    done = tables_done(handles, places.pipeline, plan.batch)
    run_id = uuid.uuid4().hex[:8]
    nothing: dict[TableName, list[WrittenFile]] = {name: [] for name in TABLES}
    if all(done.values()):
        # The handles were read from the logs just now: they are the tables as they stand.
        results = planned_results(plan, stored_results(places, plan.batch, handles.get("table")))
        reconcile_tables({n: places.table(n) for n in tables}, plan, results, tables=handles)
        return BatchWrite(results, nothing, run_id, vouched=vouch(places, handles, plan.batch))
    if plan.offsets == 0:
        return BatchWrite(planned_results(plan, []), nothing, run_id)
    if parquet:
        # A plain Parquet table has no log to be known by: its marker, written before its
        # first files, is what the ledger vouches for.
        for name in tables:
            mark_parquet_table(places.table(name), places.pipeline, name, plan.batch)
    if plan.fingerprint and plan.fingerprint != work.fingerprint and any(done.values()):
        raise PlanError(
            f"batch {plan.batch} was begun with other decode settings (schema, format, event "
            "time or partitioning) and is partly committed; restore the settings it began "
            "with, finish it, then change them. If it must not be finished, "
            f"{drop_command(places.pipeline, plan.batch, force=True)} removes what "
            "it committed, and the next batch reads its offsets again with the new settings"
        )
    source = _source_for(work, plan, done, resumed, outcome)
    # A batch whose own raw commit stands reads back exactly the rows it wrote there.
    raw_batch = plan.batch if done.get("raw") else None
    if parquet and resumed:
        # Plain Parquet readers see every file in a directory: a crashed attempt's files
        # must go before this attempt writes, or rows could show twice.
        remove_batch_files(places, plan.batch, lock=lock)
    write = frozenset(name for name, d in done.items() if not d)
    raw_files = None
    if source == "raw" and places.format == "iceberg":
        raw_files = iceberg.files_to_read(places.table("raw"), raw_batch)
    jobs = [
        SplitJob(work.task, plan.batch, i, split, write, source, run_id, raw_batch, raw_files)
        for i, split in enumerate(plan.splits)
    ]
    split_results = yield TaskRequest(work, jobs, f"{places.pipeline} batch {plan.batch}", outcome)
    for split in split_results:
        outcome.task_stages.merge(Stages.from_dict(split.stages))
    faults.reached(faults.AFTER_FILES)
    results = batch_results(plan, split_results)
    written = {name: [f for s in split_results for f in s.files.get(name, [])] for name in TABLES}
    reconcile_files(plan, results, written, write)
    if any(done.values()):
        stood = next(n for n in TABLES if done.get(n))
        reconcile_resumed(
            places.pipeline, plan, results, stood, places.table(stood), handles.get(stood)
        )
    if parquet:
        # Files of this run's failed task attempts are not the batch's: readers must not
        # see them. Only this run's: other runs' files went at resume, or go once the
        # batch is committed, by the run that commits it.
        kept = {f.path for fs in written.values() for f in fs}
        with own_files_on_loss(places, plan.batch, run_id):
            remove_batch_files(places, plan.batch, keep=kept, only_run=run_id, lock=lock)
    # The run that committed is recorded beside the batch: its id is in every file name.
    meta: dict[str, Any] = {RANGES_KEY: [vars(r) for r in results], RUN_KEY: run_id}
    if plan.kind != "ingest":
        meta[f"strata.{plan.kind}"] = plan.note
    created: dict[TableName, list[WrittenFile]] = {}
    for name in tables:
        outcome.files[name] = len(written[name])
        if not (done[name] or parquet):
            lock.check()
            faults.reached(faults.BEFORE_COMMIT[name])
            with outcome.stages.timed("commit"):
                files, table = written[name], handles[name]
                added, handles[name] = commit_table(
                    places, work.schemas, name, files, plan.batch, meta, replacing, table
                )
                if handles[name] is None:
                    created[name] = files
            if added:
                outcome.warnings.append(
                    f"the schema gained {', '.join(f'`{c}`' for c in added)}: the data table "
                    "has the new column(s) from this batch on; earlier rows read them as null"
                )
    with outcome.stages.timed("read_back"):
        # An Iceberg handle is loaded after its commit already (`commit_files`).
        current = handles if places.format == "iceberg" else up_to_date(handles)
        reconcile_tables(
            {n: places.table(n) for n in tables},
            plan,
            results,
            written if parquet else None,
            current,
            created,
        )
    data = current.get("table")
    return BatchWrite(
        results,
        written,
        run_id,
        data if isinstance(data, DeltaTable) else None,
        vouch(places, current, plan.batch),
    )


class BatchWrite(NamedTuple):
    """What a batch's tasks wrote, once reconciled (and, for Delta, committed).

    Attributes:
        results: One result per planned range.
        files: The files written, per table.
        run_id: This run's id, part of every file name it wrote.
        data: The Delta data table as read back after the batch's commit, for what
            follows to read it again without opening it; None if not at hand.
        vouched: The tables the batch committed to, as found after the commits: what
            the ledger commit records of them (`strata.store.identity.vouch`).
    """

    results: list[RangeResult]
    files: dict[TableName, list[WrittenFile]]
    run_id: str
    data: DeltaTable | None = None
    vouched: dict[str, Vouched] = {}  # noqa: RUF012 - a NamedTuple's default, never mutated


def _source_for(
    work: BatchWork,
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
        check_topic_ids(work.places, work.source, plan)
    missing = kafka_misses(work.source, plan)
    if not missing:
        return "kafka"
    if plan.kind != "ingest" and all(raw_covers(work.places, r) for r in plan.ranges):
        outcome.warnings.append(
            f"{'; '.join(missing)}: read from the raw copy, which holds every committed offset"
        )
        return "raw"
    raise PlanError(
        f"batch {plan.batch}'s saved plan can no longer be read: {'; '.join(missing)}. "
        "Retention deleted the offsets (or the topic was re-created) after the plan was "
        "saved and before its raw copy was committed. Nothing was read. Abandon the plan "
        f"with {drop_command(work.places.pipeline, plan.batch)}; "
        "the next `strata run --accept-loss TEXT` then records the loss and goes on."
    )


def kafka_misses(source: KafkaSource, plan: BatchPlan) -> list[str]:
    """The planned ranges Kafka no longer holds, in words."""
    wanted = {(r.topic, r.partition): r for r in plan.ranges if r.count}
    held = {
        (s.topic, s.partition): (s.low, s.high)
        for s in partition_states(source, {})
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


def raw_covers(places: Places, target: OffsetRange) -> bool:
    """Whether committed ingests cover the range, so the raw copy holds its messages.

    Ranges recorded as lost to retention count as covered: no copy holds them, and
    reading the range counts them as gaps, as the ingest did.
    """
    rows = read_ledger(places).to_pylist()
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


def open_tables(places: Places, names: tuple[TableName, ...]) -> dict[TableName, Any]:
    """A batch's Delta or Iceberg tables, each opened once; None where there is none yet."""
    if places.format == "iceberg":
        return {name: iceberg.open_table(places.table(name)) for name in names}
    return {name: open_table(places.table(name).uri, places.options) for name in names}


def tables_done(
    tables: Mapping[TableName, Any], pipeline: str, batch: int
) -> dict[TableName, bool]:
    """Whether each table (as just opened; None: none) holds the batch's commit."""
    return {name: committed_in(table, pipeline) >= batch for name, table in tables.items()}


def committed_in(table: Any, pipeline: str) -> int:  # noqa: ANN401 - Delta or Iceberg
    """The newest batch of `pipeline` a Delta or Iceberg table (None: none) holds, or 0."""
    if table is None:
        return 0
    if isinstance(table, DeltaTable):
        return table.transaction_version(pipeline) or 0
    return iceberg.committed_batch(table, pipeline) or 0


def stored_results(places: Places, batch: int, table: Any = None) -> list[RangeResult]:  # noqa: ANN401
    """A committed batch's per-partition results, from the data table's commit info.

    The data table is opened, unless given (`table`, at a snapshot holding the commit).
    """
    stored = batch_record(places.table("table"), places.pipeline, batch, RANGES_KEY, table)
    if stored is None:
        raise ReconcileError(
            f"batch {batch}: the data table records it but its commit has no ranges; "
            "the table was written by something other than this pipeline"
        )
    known = {f.name for f in fields(RangeResult)}
    return [RangeResult(**{k: v for k, v in r.items() if k in known}) for r in stored]


def commit_table(
    places: Places,
    schemas: SchemaSpec,
    name: TableName,
    files: list[WrittenFile],
    batch: int,
    meta: dict[str, Any],
    replacing: list[OffsetRange] | None = None,
    table: Any = None,  # noqa: ANN401 - a Delta or an Iceberg table
) -> tuple[list[str], Any]:
    """Commit a batch's files to one Delta (or Iceberg) table, with its app transaction, once.

    A table that did not exist is created with the batch's files in one transaction.

    Args:
        places: Where the tables are, and their names.
        schemas: What the tables' schemas are made from.
        name: `raw`, `quarantine` or `table`.
        files: The batch's files for this table.
        batch: The batch number.
        meta: Commit metadata.
        replacing: Ranges whose existing rows this commit removes (a backfill or
            replay): the files holding them are rewritten without them, in the same
            transaction.
        table: The table as opened earlier in the batch (`open_tables`); None if there
            was none then.

    Returns:
        The columns added to the table first, because the schema gained fields; and the
        table, at the snapshot its commit was built on (`up_to_date` moves it onto
        the commit), or None if this call created it.
    """
    ref = places.table(name)
    schema, partition_by = table_layout(schemas, name)
    if table is None and ref.format == "iceberg":
        # Another runner may have created it since it was looked for: then it is
        # committed to as any table is (and holds the batch, if that runner committed it).
        table = iceberg.open_table(ref)
    if table is None:
        # Never where another table's files are: it would mix with them, and its vacuum
        # would delete files the other still names.
        refuse_foreign(ref, places.pipeline, name)
    if ref.format == "iceberg":
        added, table = iceberg.commit_files(
            ref, schema, partition_by, files, places.pipeline, batch, meta, replacing, table
        )
        faults.reached(faults.AFTER_COMMIT[name])
        return added, table
    if table is None:
        # A new table holds no rows of ranges to replace and has every column of the
        # schema: there is nothing to rewrite or add first. If another runner created
        # it meanwhile, nothing was committed and it is committed to as any table is.
        table = create_with_files(
            ref.uri,
            schema,
            partition_by,
            ref.options,
            ref.name,
            files,
            places.pipeline,
            batch,
            meta,
        )
        if table is None:
            faults.reached(faults.AFTER_COMMIT[name])
            return [], None
    else:
        # Opened before the batch's tasks ran: the commits landed since are read, so the
        # commit builds on the table as it stands, as one opened now would.
        table.update_incremental()
    added = add_missing_columns(table, schema)
    # Adding columns moved the handle onto the version it committed.
    removes: list[RemoveAction] = []
    if replacing:
        fs, root = ref.filesystem()
        removes, rewritten, _ = without_ranges(table, fs, root, partition_by, replacing, batch)
        files = files + rewritten
    commit_files(table, schema, partition_by, files, places.pipeline, batch, meta, removes)
    faults.reached(faults.AFTER_COMMIT[name])
    return added, table


def fence_table(
    places: Places, schemas: SchemaSpec, name: TableName, batch: int, note: str
) -> bool:
    """Commit the batch's number to a Delta table with no files: a fence.

    A ledger edit (a dropped plan, a seek) takes a batch number. A runner still holding
    a plan of that number, woken from a pause, would otherwise commit it to tables the
    ledger will never account for; with the fence its commits are no-ops.

    Returns:
        True if this call committed the fence, False if the table held the batch.
    """
    ref = places.table(name)
    schema, partition_by = table_layout(schemas, name)
    if ref.format == "iceberg":
        found = iceberg.open_table(ref)
        if found is None:
            refuse_foreign(ref, places.pipeline, name)
            found = iceberg.create_table(ref, schema, partition_by)
        return (
            iceberg.commit_batch(ref, places.pipeline, found, [], batch, {FENCE_KEY: note})
            is not None
        )
    table = open_table(ref.uri, ref.options)
    if table is None:
        refuse_foreign(ref, places.pipeline, name)
        table = ensure_table(ref.uri, schema, partition_by, ref.options, ref.name)
    return commit_files(table, schema, partition_by, [], places.pipeline, batch, {FENCE_KEY: note})


def remove_batch_rows(
    places: Places, schemas: SchemaSpec, name: TableName, batch: int, note: str
) -> int:
    """Remove an ingest batch's own files from a Delta or Iceberg table; how many were removed."""
    ref = places.table(name)
    if ref.format == "iceberg":
        return iceberg_swap.remove_batch(ref, batch, {FENCE_KEY: note})
    table = open_table(ref.uri, ref.options)
    if table is None:
        return 0
    removes = batch_removes(table, batch)
    schema, partition_by = table_layout(schemas, name)
    commit_removes(table, schema, partition_by, removes, batch, {FENCE_KEY: note})
    return len(removes)


class TaskRequest(NamedTuple):
    """A batch's tasks, asked for by its steps (`write_and_commit`) where they are to run.

    Attributes:
        work: How the batch's pipeline is run.
        jobs: One per split of the plan.
        label: The batch, in words (Spark's job description, progress lines).
        outcome: The batch's outcome, which the Spark start and the tasks' time join.
    """

    work: BatchWork
    jobs: list[SplitJob]
    label: str
    outcome: RunOutcome


T = TypeVar("T")
Steps = Generator[TaskRequest, list[SplitResult], T]
"""A batch's steps: they yield its tasks where they are to run, and go on with their
results; the batch's result is what they return."""


def run_steps(steps: Sequence[Steps[T]]) -> list[T | Exception]:
    """Drive many batches' steps, running all their tasks in one Spark job.

    The tables of a routed pipeline each have a batch of their own, with its own plan,
    lock, commits and ledger; what they share is the read. Each batch's steps run up to
    its tasks; the tasks of all of them run as one Spark job (tasks spread across topics
    and tables); then each batch goes on, committing on its own. A batch that fails
    (before, in or after its tasks) fails alone, with its error in its place of the
    list; the others commit. When the shared job fails, each batch's tasks run again
    in a job of their own, so a task that fails for one table fails that table alone
    and cannot hold the others back run after run.

    Args:
        steps: The batches' steps (`write_and_commit`, or a step wrapping it).

    Returns:
        Each batch's result, or the error that stopped it, in the order given.
    """
    out: list[T | Exception | None] = [None] * len(steps)
    waiting: dict[int, TaskRequest] = {}
    _each(steps, [(i, None) for i in range(len(steps))], out, waiting)
    shared = [i for i, r in waiting.items() if not r.work.reducers]
    if len(shared) > 1:
        try:
            results = _run_jobs([waiting[i] for i in shared])
        except Exception:  # noqa: BLE001 - each batch's tasks run again alone, below
            # What the failed job's attempts wrote is theirs, by its attempt ids: each
            # batch keeps only what its own job returns (`write_and_commit`).
            logger.warning("the shared job of %d batches failed; each runs alone", len(shared))
        else:
            for i in shared:
                waiting.pop(i)
            _each(steps, list(zip(shared, results, strict=True)), out, waiting)
    for i in sorted(waiting):
        request = waiting.pop(i)
        try:
            got = _run_jobs([request])[0]
        except Exception as exc:  # noqa: BLE001 - this batch fails alone
            _advance(out, waiting, i, steps[i], exc)
        else:
            _advance(out, waiting, i, steps[i], got)
    for i, request in waiting.items():
        out[i] = RuntimeError(f"{request.label} asked for its tasks twice")
    return cast("list[T | Exception]", out)


def run_alone(step: Steps[T]) -> T:
    """Drive one batch's steps to their end, its tasks in a Spark job of their own."""
    got = run_steps([step])[0]
    if isinstance(got, Exception):
        raise got
    return got


# How many batches plan, or commit, at once: the steps around the tasks wait on storage
# (Delta's log, the files' fsync) more than they compute.
STEP_THREADS = 4


def _each(
    steps: Sequence[Steps[Any]],
    given: list[tuple[int, list[SplitResult] | None]],
    out: list[Any],
    waiting: dict[int, TaskRequest],
) -> None:
    """Take the given batches' steps on (`_advance`), a few at once when there are many.

    Each batch is its own: its own lock, plan, tables and ledger. Its steps are taken
    by one thread at a time, and what they touch in common (the Kafka clients,
    `strata.batch._clients`) is made for it.
    """
    if len(given) <= 1 or STEP_THREADS <= 1:
        for i, got in given:
            _advance(out, waiting, i, steps[i], got)
        return
    with ThreadPoolExecutor(min(STEP_THREADS, len(given)), "strata-batch") as pool:
        for future in [pool.submit(_advance, out, waiting, i, steps[i], got) for i, got in given]:
            future.result()


def _advance(
    out: list[Any],
    waiting: dict[int, TaskRequest],
    i: int,
    step: Steps[Any],
    got: list[SplitResult] | Exception | None,
) -> None:
    """Take batch `i`'s steps on to its tasks or its end, with what its tasks gave."""
    try:
        if isinstance(got, Exception):
            waiting[i] = step.throw(got)
        elif got is None:
            waiting[i] = next(step)
        else:
            waiting[i] = step.send(got)
    except StopIteration as stop:
        out[i] = stop.value
    except Exception as exc:  # noqa: BLE001 - one batch's failure must not stop the others
        out[i] = exc


def _run_jobs(requests: list[TaskRequest]) -> list[list[SplitResult]]:
    """Start Spark and run the requests' tasks in one job; each request's results.

    Every file name carries its run's id, so files of another runner, or of an
    earlier attempt, are never overwritten: only the commit decides which count.
    """
    first = requests[0]
    t0, cpu = time.monotonic(), time.thread_time()
    spark = first.work.session()
    started, started_cpu = time.monotonic() - t0, time.thread_time() - cpu
    for request in requests:
        request.outcome.spark_seconds = started
        request.outcome.stages.add("spark_start", started, started_cpu)
        _check_session(spark, request.work)
    jobs = [job for r in requests for job in r.jobs]
    label = first.label if len(requests) == 1 else f"{len(requests)} batches"
    t1, cpu = time.monotonic(), time.thread_time()
    results = execute(spark, jobs, label, first.work.reducers, pack=len(requests) > 1)
    took, took_cpu = time.monotonic() - t1, time.thread_time() - cpu
    out: list[list[SplitResult]] = []
    at = 0
    for request in requests:
        request.outcome.read_seconds = took
        request.outcome.stages.add("tasks", took, took_cpu)
        if first.work.reducers:
            # The shuffle layout's reducers report in a result of their own (task -1).
            out.append(results)
            break
        out.append(results[at : at + len(request.jobs)])
        at += len(request.jobs)
    return out


def _check_session(spark: SparkSession, work: BatchWork) -> None:
    """Refuse a Spark session the batch's tables cannot be written from safely."""
    # Under spark-submit the submitted master wins over the pipeline's.
    shared = work.places.shared_storage_error(spark.sparkContext.master or work.master)
    if shared:
        raise PlanError(shared)
    parquet = work.places.format == "parquet"
    if parquet and spark.conf.get("spark.speculation", "false") == "true":
        # A speculative copy still writing after the batch's files were settled would
        # leave files in directories whose every file is the table.
        raise PlanError(
            "spark.speculation is on; plain Parquet tables need it off (every file in their "
            "directories is read). Set spark.speculation=false for this job."
        )
