"""Backfill: re-ingest one committed offset range, replacing its rows exactly.

After an incident (a decoder bug, a bad deploy upstream, a table damaged by hand) an
on-call engineer re-ingests `[start, end)` of one partition. The rows of that range
already in the tables are removed and the re-read ones added in the same Delta
transaction, so readers never see the range twice or not at all; rows outside the
range are untouched. The ledger records the backfill with its reason. When Kafka's
retention has deleted the range, the raw copy is read instead, and the run says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pyarrow.dataset as ds

from strata.config import PipelineConfig
from strata.delta import open_table
from strata.kafka import KafkaUnavailable, partition_states
from strata.ledger import LedgerState, commit_ledger, ledger_state, read_ledger
from strata.lock import run_lock
from strata.plan import BatchPlan, OffsetRange, PlanStore, decode_fingerprint, split_ranges
from strata.run import (
    RANGES_KEY,
    ReconcileError,
    RunOutcome,
    commit_table,
    crash_point,
    ledger_row,
    merge_results,
    register,
    run_tasks,
    stored_results,
    tables_done,
)
from strata.task import RangeResult

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class BackfillError(Exception):
    """The backfill cannot be done as asked; nothing was changed."""


def backfill(
    cfg: PipelineConfig,
    target: OffsetRange,
    reason: str,
    *,
    session: Callable[[PipelineConfig], SparkSession] | None = None,
) -> RunOutcome:
    """Re-ingest one committed range of one partition, replacing its rows.

    Args:
        cfg: The pipeline configuration.
        target: The topic, partition and `[start, end)` to re-ingest.
        reason: Why; recorded in the ledger.
        session: Builds the Spark session.

    Returns:
        The outcome, with status `backfilled`.

    Raises:
        BackfillError: If the range is invalid, not committed yet, or held by
            neither Kafka nor the raw copy.
    """
    began = time.monotonic()
    _check_request(cfg, target, reason)
    with run_lock(cfg.lock_path, cfg.name):
        state = ledger_state(cfg)
        _check_committed(state, target)
        batch = state.last_batch + 1
        store = PlanStore(cfg)
        plan = store.load(batch)
        if plan is not None and (plan.kind != "backfill" or plan.ranges != [target]):
            what = f"a {plan.kind} of {', '.join(f'{r.topic}:{r.partition}' for r in plan.ranges)}"
            raise BackfillError(
                f"batch {batch} is unfinished ({what}); finish it first with "
                f"`strata {'run' if plan.kind == 'ingest' else 'backfill'}` as it began"
            )
        if plan is None:
            from strata.spark import default_tasks

            plan = BatchPlan(
                pipeline=cfg.name,
                batch=batch,
                ranges=[target],
                splits=split_ranges([target], default_tasks(cfg), cfg.limits.max_offsets_per_task),
                fingerprint=decode_fingerprint(cfg),
                created_at=datetime.now(UTC).isoformat(timespec="seconds"),
                kind="backfill",
                note=reason,
                source=_source(cfg, target, state),
            )
            store.save(plan)
        outcome = RunOutcome(cfg.name, "backfilled", batch)
        if plan.source == "raw":
            outcome.warnings.append(
                f"{target.describe()} are no longer in Kafka; they were read from the raw copy"
            )
        results = _replace(cfg, plan, target, session, outcome)
        outcome.ranges = results
        commit_ledger(cfg, batch, [ledger_row(r, {}, "backfill", plan.note) for r in results])
        crash_point("after_ledger")
        _reconcile_range(cfg, target, results, plan.source)
        register(cfg, outcome)
        outcome.seconds = time.monotonic() - began
        return outcome


def _check_request(cfg: PipelineConfig, target: OffsetRange, reason: str) -> None:
    if cfg.table_format != "delta":
        raise BackfillError(
            "backfill replaces rows inside a Delta transaction; plain Parquet tables "
            "(table_format: parquet) cannot be backfilled yet"
        )
    if target.topic not in cfg.topics:
        raise BackfillError(
            f"topic `{target.topic}` is not read by pipeline {cfg.name} ({', '.join(cfg.topics)})"
        )
    if target.partition < 0 or target.start < 0 or target.end <= target.start:
        raise BackfillError(
            f"[{target.start}, {target.end}) of partition {target.partition} is not a range; "
            "give --from below --to, both at least 0"
        )
    if not reason.strip():
        raise BackfillError("give a --reason; the ledger records why each backfill ran")


def _check_committed(state: LedgerState, target: OffsetRange) -> None:
    committed = state.committed.get((target.topic, target.partition))
    if committed is None or target.end > committed:
        upto = "nothing" if committed is None else f"offsets below {committed}"
        raise BackfillError(
            f"partition {target.partition} of `{target.topic}` has committed {upto}; only a "
            f"committed range can be backfilled, and offsets up to {target.end} come with "
            "the next `strata run`"
        )


def _source(cfg: PipelineConfig, target: OffsetRange, state: LedgerState) -> str:
    """`kafka` if the broker still holds the range, else `raw` if the raw copy does."""
    kafka_says = ""
    try:
        for s in partition_states(cfg, state.committed):
            if (s.topic, s.partition) == (target.topic, target.partition):
                if s.low <= target.start and target.end <= s.high:
                    return "kafka"
                kafka_says = f"Kafka holds [{s.low}, {s.high})"
        kafka_says = kafka_says or "Kafka has no such partition"
    except KafkaUnavailable as exc:
        kafka_says = f"Kafka is unreachable ({exc})"
    if _raw_covers(cfg, target):
        return "raw"
    raise BackfillError(
        f"{target.describe()} are held by neither Kafka ({kafka_says}) nor the raw copy "
        "(no committed ingest covers them); nothing was done"
    )


def _raw_covers(cfg: PipelineConfig, target: OffsetRange) -> bool:
    """Whether committed ingests cover the range, so the raw copy holds its messages."""
    rows = read_ledger(cfg).to_pylist()
    spans = sorted(
        (r["start_offset"], r["end_offset"])
        for r in rows
        if r["kind"] == "ingest"
        and (r["topic"], r["partition"]) == (target.topic, target.partition)
    )
    reach = target.start
    for start, end in spans:
        if start > reach:
            break
        reach = max(reach, end)
    return reach >= target.end


def _replace(
    cfg: PipelineConfig,
    plan: BatchPlan,
    target: OffsetRange,
    session: Callable[[PipelineConfig], SparkSession] | None,
    outcome: RunOutcome,
) -> list[RangeResult]:
    # From Kafka, the raw copy's rows of the range are replaced too; from the raw copy,
    # it stays as it is.
    tables = ("quarantine", "table") if plan.source == "raw" else ("raw", "quarantine", "table")
    done = tables_done(cfg, tables, plan.batch)
    if all(done.values()):
        return stored_results(cfg, plan.batch)
    write = frozenset(name for name in tables if not done[name])
    split_results = run_tasks(cfg, plan, write, session, outcome)
    crash_point("after_files")
    results = merge_results(split_results)
    meta = {RANGES_KEY: [vars(r) for r in results], "strata.backfill": plan.note}
    for name in tables:
        files = [f for s in split_results for f in s.files.get(name, [])]
        outcome.files[name] = len(files)
        if not done[name]:
            commit_table(cfg, name, files, plan.batch, meta, replacing=target)
    return results


def _reconcile_range(
    cfg: PipelineConfig, target: OffsetRange, results: list[RangeResult], source: str
) -> None:
    """After a backfill, each table holds the range's rows exactly once."""
    [r] = results
    problems = []
    if r.end - r.start != r.rows + r.quarantined + r.gaps:
        problems.append(
            f"offsets span {r.end - r.start}, but rows {r.rows} + quarantined {r.quarantined} "
            f"+ gaps {r.gaps} = {r.rows + r.quarantined + r.gaps}"
        )
    expect = {"table": r.rows, "quarantine": r.quarantined, "raw": r.messages}
    wanted = (
        (ds.field("_topic") == target.topic)
        & (ds.field("_partition") == target.partition)
        & (ds.field("_offset") >= target.start)
        & (ds.field("_offset") < target.end)
    )
    for name, want in expect.items():
        table = open_table(cfg.location(name), cfg.storage_options)  # type: ignore[arg-type]
        have = 0 if table is None else table.to_pyarrow_dataset().count_rows(filter=wanted)
        if have != want:
            problems.append(f"the {name} table holds {have} rows of the range, expected {want}")
    if problems:
        raise ReconcileError(
            f"backfill of {target.describe()} does not reconcile:\n  " + "\n  ".join(problems)
        )
