"""One batch, end to end: plan, read, decode, write, commit, reconcile, publish offsets.

Commit order is raw copy, quarantine, data table, ledger. Each table's commit
carries the batch's app transaction, so after a crash at any point a re-run sees
which commits stand, rewrites only the files of tables not yet committed, and
commits the rest. The ledger is written last; it marks the batch done.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from deltalake.transaction import RemoveAction

from strata.config import PipelineConfig
from strata.delta import (
    add_missing_columns,
    batch_metadata,
    commit_files,
    committed_batch,
    ensure_table,
    open_table,
    without_ranges,
)
from strata.kafka import partition_states, publish_group_offsets
from strata.ledger import LedgerState, commit_ledger, committed_columns, ledger_state
from strata.lock import run_lock
from strata.plan import (
    BatchPlan,
    OffsetRange,
    PartitionState,
    PlanError,
    PlanStore,
    decode_fingerprint,
    plan_ranges,
    split_ranges,
)
from strata.schema import (
    TABLE_SUFFIXES,
    SchemaError,
    column_signature,
    data_schema,
    load_topic_schema,
    schema_changes,
    table_layout,
)
from strata.storage import filesystem
from strata.task import RangeResult, SplitJob, SplitResult
from strata.write import WrittenFile

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Fault injection for the crash tests: the process kills itself with SIGKILL at the
# named step, exactly as an OOM killer or a lost node would. FAIL_ONCE_ENV instead
# raises once (a marker file remembers), as a task attempt that fails and is retried.
CRASH_ENV = "STRATA_CRASH_AT"
FAIL_ONCE_ENV = "STRATA_FAIL_ONCE_AT"
FAIL_ONCE_MARKER_ENV = "STRATA_FAIL_ONCE_MARKER"
RANGES_KEY = "strata.ranges"
TABLES = ("raw", "quarantine", "table")


class ReconcileError(Exception):
    """Offsets read do not equal rows + quarantined + gaps, or the tables disagree."""


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
        published: What registering the tables in the metastore changed, if configured.
        publish_error: Why registering failed; the batch stands, the run exits non-zero.
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
    published: str | None = None
    publish_error: str | None = None


def crash_point(step: str) -> None:
    """Die by SIGKILL here, or fail once, if the crash tests asked for it."""
    if os.environ.get(CRASH_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(FAIL_ONCE_ENV) == step:
        marker = os.environ.get(FAIL_ONCE_MARKER_ENV, "")
        if marker and not os.path.exists(marker):
            with open(marker, "w") as out:
                out.write(step)
            raise RuntimeError(f"injected failure at {step}")


def run_batch(
    cfg: PipelineConfig,
    *,
    max_offsets: int | None = None,
    session: Callable[[PipelineConfig], SparkSession] | None = None,
    register_tables: bool = True,
    accept_loss: str | None = None,
) -> RunOutcome:
    """Plan and run the next batch of a pipeline, or finish an unfinished one.

    Args:
        cfg: The pipeline configuration.
        max_offsets: Per-partition cap for this run, overriding the config.
        session: Builds the Spark session; only called when there is data to read.
        register_tables: Register the tables in the metastore after the commit. An
            Airflow DAG leaves this to its own publish task.
        accept_loss: Who accepts offsets lost to retention, and why (recorded in the
            ledger); None fails closed unless the pipeline's `on_data_loss` is `accept`.

    Returns:
        The outcome.

    Raises:
        PlanError: If the broker's state makes a safe plan impossible.
        ReconcileError: If the committed batch does not add up.
    """
    began = time.monotonic()
    with run_lock(cfg.lock_path, cfg.name):
        state = ledger_state(cfg)
        batch = state.last_batch + 1
        plan, resumed, states = _load_or_plan(cfg, state, max_offsets, accept_loss)
        if plan is None:
            outcome = RunOutcome(cfg.name, "idle", lag=_lag(states, state.committed))
            # Catch the consumer group up with the ledger, in case a run died before.
            ranges = [OffsetRange(t, p, e, e) for (t, p), e in state.committed.items()]
            _publish(cfg, ranges, outcome)
            if register_tables:
                register(cfg, outcome)
            outcome.seconds = time.monotonic() - began
            return outcome
        fingerprint = decode_fingerprint(cfg)
        outcome = RunOutcome(
            cfg.name,
            "resumed" if resumed else "committed",
            batch,
            new_partitions=plan.new_partitions,
        )
        results, written = _execute_and_commit(cfg, plan, fingerprint, session, outcome, resumed)
        outcome.ranges = results
        ledger_rows = [ledger_row(r, plan.watermarks) for r in results]
        ledger_rows += [loss_row(lost, plan.note) for lost in plan.losses]
        for lost in plan.losses:
            outcome.warnings.append(
                f"{lost.describe()}: {lost.count} messages were deleted by retention before "
                f"they were read; the loss is recorded in the ledger ({plan.note})"
            )
        commit_ledger(cfg, batch, ledger_rows, data_columns(cfg))
        crash_point("after_ledger")
        reconcile(cfg, batch, results, written)
        _publish(cfg, [OffsetRange(r.topic, r.partition, r.start, r.end) for r in results], outcome)
        try:
            after = partition_states(cfg, {(r.topic, r.partition): r.end for r in results})
            committed = dict(state.committed)
            committed.update({(r.topic, r.partition): r.end for r in results})
            outcome.lag = _lag(after, committed)
        except Exception as exc:  # noqa: BLE001 - lag is informational; the batch stands
            outcome.warnings.append(f"lag after the run unknown: {exc}")
        if register_tables:
            register(cfg, outcome)
        outcome.seconds = time.monotonic() - began
        return outcome


def plan_next(cfg: PipelineConfig, max_offsets: int | None = None) -> BatchPlan | None:
    """Plan and persist the next batch without running it (no JVM); None if idle.

    An unfinished batch's saved plan is returned as it is, so the run that follows
    reads exactly what was planned.
    """
    with run_lock(cfg.lock_path, cfg.name):
        plan, _, _ = _load_or_plan(cfg, ledger_state(cfg), max_offsets, None)
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
        batch's, and the partitions' watermarks when a new plan was made.
    """
    store = PlanStore(cfg)
    plan = store.load(state.last_batch + 1)
    if plan is not None:
        return plan, True, []
    states = partition_states(cfg, state.committed)
    plan = _new_plan(cfg, state.last_batch + 1, states, max_offsets, accept_loss, state.committed)
    if plan is not None:
        # Before the plan is saved, so nothing of an incompatible schema is ever read; an
        # idle run skips it.
        check_schema(cfg)
        store.save(plan)
    return plan, False, states


def data_columns(cfg: PipelineConfig) -> list[list[str]]:
    """The data table's column signature under the current schema."""
    return column_signature(table_layout(cfg, "table")[0])


def check_schema(cfg: PipelineConfig) -> list[str]:
    """Stop before reading when the schema changed in a way the tables cannot take.

    Returns:
        The columns the current schema adds to the table (old rows read them as null).

    Raises:
        SchemaError: Naming each incompatible change and its fix.
    """
    recorded = committed_columns(cfg)
    if recorded is None:
        return []
    batch, before = recorded
    topic = load_topic_schema(cfg.schema_path)
    added, problems = schema_changes(before, data_schema(topic, cfg.partitioning), topic.required)
    if problems:
        raise SchemaError(
            f"{cfg.schema_path}: pipeline {cfg.name}'s schema changed since batch {batch} in a "
            "way its tables cannot take; nothing was read.\n  " + "\n  ".join(problems)
        )
    return added


def _new_plan(
    cfg: PipelineConfig,
    batch: int,
    states: list[PartitionState],
    max_offsets: int | None,
    accept_loss: str | None,
    committed: dict[tuple[str, int], int],
) -> BatchPlan | None:
    from strata.spark import default_tasks

    if accept_loss is None and cfg.on_data_loss == "accept":
        accept_loss = "pipeline policy on_data_loss: accept"
    ranges, new, losses = plan_ranges(
        states,
        cfg.starting_offsets,
        max_offsets or cfg.limits.max_offsets_per_partition,
        accept_loss is not None,
        committed,
    )
    if not any(r.count for r in ranges) and not new and not losses:
        return None
    # Empty ranges are kept only for new partitions: they record where reading starts.
    kept = [r for r in ranges if r.count > 0 or (r.topic, r.partition) in new]
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
    )


def _execute_and_commit(
    cfg: PipelineConfig,
    plan: BatchPlan,
    fingerprint: str,
    session: Callable[[PipelineConfig], SparkSession] | None,
    outcome: RunOutcome,
    resumed: bool,
) -> tuple[list[RangeResult], dict[str, list[WrittenFile]] | None]:
    """Run the batch's tasks and commit the tables whose commit does not stand yet.

    Returns:
        Per-partition results, and for plain Parquet tables the files written (the
        ledger commit that follows is their commit point).
    """
    parquet = cfg.table_format == "parquet"
    # Plain Parquet tables have no commits of their own: the ledger decides.
    done = {name: False for name in TABLES} if parquet else tables_done(cfg, TABLES, plan.batch)
    if all(done.values()):
        return stored_results(cfg, plan.batch), None
    if plan.offsets == 0:
        return [RangeResult(r.topic, r.partition, r.start, r.end) for r in plan.ranges], None
    if plan.fingerprint and plan.fingerprint != fingerprint and any(done.values()):
        raise PlanError(
            f"batch {plan.batch} was begun with other decode settings (schema, format, event "
            "time or partitioning) and is partly committed; restore the settings it began "
            "with, finish it, then change them"
        )
    if parquet and resumed:
        # Plain Parquet readers see every file in a directory: a crashed attempt's files
        # must go before this attempt writes, or rows could show twice.
        remove_batch_files(cfg, plan.batch)
    write = frozenset(name for name, d in done.items() if not d)
    split_results = run_tasks(cfg, plan, write, session, outcome)
    crash_point("after_files")
    results = merge_results(split_results)

    meta = {RANGES_KEY: [vars(r) for r in results]}
    written = {name: [f for s in split_results for f in s.files.get(name, [])] for name in TABLES}
    for name in TABLES:
        files = written[name]
        outcome.files[name] = len(files)
        if not (done[name] or parquet):
            added = commit_table(cfg, name, files, plan.batch, meta)
            if added:
                outcome.warnings.append(
                    f"the schema gained {', '.join(f'`{c}`' for c in added)}: the data table "
                    "has the new column(s) from this batch on; earlier rows read them as null"
                )
    return results, written if parquet else None


# The step after which each table's commit stands, for the crash tests.
COMMIT_STEPS = {
    "raw": "after_raw_commit",
    "quarantine": "after_quarantine_commit",
    "table": "after_data_commit",
}


def tables_done(cfg: PipelineConfig, names: tuple[str, ...], batch: int) -> dict[str, bool]:
    """Whether each Delta table already holds the batch's commit (its app transaction)."""
    return {
        name: (committed_batch(cfg.location(name), cfg.name, cfg.storage_options) or 0) >= batch  # type: ignore[arg-type]
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
    return [RangeResult(**r) for r in stored]


def commit_table(
    cfg: PipelineConfig,
    name: str,
    files: list[WrittenFile],
    batch: int,
    meta: dict[str, Any],
    replacing: list[OffsetRange] | None = None,
) -> list[str]:
    """Commit a batch's files to one Delta table, with its app transaction.

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
    uri = cfg.location(name)  # type: ignore[arg-type]
    schema, partition_by = table_layout(cfg, name)
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
    crash_point(COMMIT_STEPS[name])
    return added


def run_tasks(
    cfg: PipelineConfig,
    plan: BatchPlan,
    write: frozenset[str],
    session: Callable[[PipelineConfig], SparkSession] | None,
    outcome: RunOutcome,
) -> list[SplitResult]:
    """Start Spark and run one task per split of the plan, writing the given tables."""
    jobs = [
        SplitJob(cfg, plan.batch, i, split, write, plan.source)
        for i, split in enumerate(plan.splits)
    ]
    if session is None:
        from strata.spark import build_session

        session = build_session
    from strata.spark import default_tasks, execute

    t0 = time.monotonic()
    spark = session(cfg)
    outcome.spark_seconds = time.monotonic() - t0
    t1 = time.monotonic()
    reducers = default_tasks(cfg) if cfg.layout == "shuffle" else 0
    results = execute(spark, jobs, f"{cfg.name} batch {plan.batch}", reducers)
    outcome.read_seconds = time.monotonic() - t1
    return results


def remove_batch_files(cfg: PipelineConfig, batch: int) -> int:
    """Delete every file of `batch` from the plain Parquet tables; returns how many."""
    prefixes = (f"part-b{batch:010d}-", f".part-b{batch:010d}-")
    removed = 0
    for name in TABLES:
        fs, root = filesystem(cfg.location(name), cfg.storage_options)  # type: ignore[arg-type]
        if fs.get_file_info(root).type == pafs.FileType.NotFound:
            continue
        for info in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
            if info.type == pafs.FileType.File and info.base_name.startswith(prefixes):
                fs.delete_file(info.path)
                removed += 1
    return removed


def merge_results(split_results: list[SplitResult]) -> list[RangeResult]:
    """Combine tasks' range results into one result per partition.

    A long range may have been cut across tasks; its pieces are contiguous, so the
    merged range runs from the first piece's start to the last piece's end.
    """
    merged: dict[tuple[str, int], RangeResult] = {}
    for split in split_results:
        for r in split.ranges:
            key = (r.topic, r.partition)
            m = merged.get(key)
            if m is None:
                merged[key] = RangeResult(**vars(r))
                continue
            m.start, m.end = min(m.start, r.start), max(m.end, r.end)
            for name in ("messages", "gaps", "rows", "quarantined", "bytes", "late_rows"):
                setattr(m, name, getattr(m, name) + getattr(r, name))
            m.max_lateness_ms = max(m.max_lateness_ms, r.max_lateness_ms)
            for name, pick in (("min_event_us", min), ("max_event_us", max)):
                values = [v for v in (getattr(m, name), getattr(r, name)) if v is not None]
                setattr(m, name, pick(values) if values else None)
    return [merged[k] for k in sorted(merged)]


def reconcile(
    cfg: PipelineConfig,
    batch: int,
    results: list[RangeResult],
    written: dict[str, list[WrittenFile]] | None = None,
) -> None:
    """Check that the committed batch adds up, partition by partition.

    Offsets spanned must equal rows + quarantined + gaps; and the rows the data,
    quarantine and raw tables hold for the batch must equal what the tasks counted.
    Delta tables are read back through their logs; plain Parquet tables through the
    files the batch wrote.

    Raises:
        ReconcileError: Naming each partition that does not add up.
    """
    problems = []
    for r in results:
        if r.end - r.start != r.rows + r.quarantined + r.gaps:
            problems.append(
                f"partition {r.partition} of `{r.topic}`: offsets [{r.start}, {r.end}) span "
                f"{r.end - r.start}, but rows {r.rows} + quarantined {r.quarantined} + gaps "
                f"{r.gaps} = {r.rows + r.quarantined + r.gaps}"
            )
    counted = {
        name: _batch_counts(cfg, name, batch)
        if written is None
        else _file_counts(cfg, name, written[name])
        for name in TABLES
    }
    for r in results:
        key = (r.topic, r.partition)
        expect = {"table": r.rows, "quarantine": r.quarantined, "raw": r.messages}
        for name, want in expect.items():
            have = counted[name].get(key, 0)
            if have != want:
                problems.append(
                    f"partition {r.partition} of `{r.topic}`: the {name} table holds {have} rows "
                    f"of batch {batch}, the tasks counted {want}"
                )
    if problems:
        raise ReconcileError(f"batch {batch} does not reconcile:\n  " + "\n  ".join(problems))


def _batch_counts(cfg: PipelineConfig, name: str, batch: int) -> dict[tuple[str, int], int]:
    table = open_table(cfg.location(name), cfg.storage_options)  # type: ignore[arg-type]
    if table is None:
        return {}
    data = table.to_pyarrow_dataset().to_table(
        columns=["_topic", "_partition"], filter=ds.field("_batch") == batch
    )
    return count_by_partition(data)


def _file_counts(
    cfg: PipelineConfig, name: str, files: list[WrittenFile]
) -> dict[tuple[str, int], int]:
    fs, root = filesystem(cfg.location(name), cfg.storage_options)  # type: ignore[arg-type]
    if not files:
        return {}
    paths = [f"{root}/{f.path}" for f in files]
    data = ds.dataset(paths, format="parquet", filesystem=fs).to_table(
        columns=["_topic", "_partition"]
    )
    return count_by_partition(data)


def count_by_partition(data: pa.Table) -> dict[tuple[str, int], int]:
    """Rows per (topic, partition) of a table holding `_topic` and `_partition`."""
    if data.num_rows == 0:
        return {}
    grouped = data.group_by(["_topic", "_partition"]).aggregate([("_partition", "count")])
    return {
        (t, p): c
        for t, p, c in zip(
            grouped.column("_topic").to_pylist(),
            grouped.column("_partition").to_pylist(),
            grouped.column("_partition_count").to_pylist(),
            strict=True,
        )
    }


def loss_row(lost: OffsetRange, note: str) -> dict[str, object]:
    """The ledger's record of a range deleted by retention before it was read."""
    return {
        "kind": "loss",
        "note": note,
        "topic": lost.topic,
        "partition": lost.partition,
        "start_offset": lost.start,
        "end_offset": lost.end,
        "messages": 0,
        "rows": 0,
        "quarantined": 0,
        "gaps": lost.count,
        "bytes": 0,
        "late_rows": 0,
        "max_lateness_ms": 0,
        "min_event_time": None,
        "max_event_time": None,
        "high_watermark": None,
    }


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
    from strata.metastore import MetastoreError
    from strata.publish import publish, render_publish

    try:
        outcome.published = render_publish(publish(cfg))
        if cfg.trino.url:
            from strata.sql import run_in_trino, trino_statements

            ran = run_in_trino(cfg, trino_statements(cfg))
            outcome.published += f"; {len(ran)} statement(s) run in Trino at {cfg.trino.url}"
    except MetastoreError as exc:
        done = f"batch {outcome.batch} is committed; " if outcome.batch else ""
        outcome.publish_error = (
            f"{done}registering the tables in the metastore failed: {exc}. The next run, "
            f"or `strata publish --pipeline {cfg.name}`, completes the registration."
        )


def _publish(cfg: PipelineConfig, ranges: list[OffsetRange], outcome: RunOutcome) -> None:
    problem = publish_group_offsets(cfg, ranges)
    if problem:
        outcome.warnings.append(problem + " (the ledger holds the truth; lag tools are behind)")
