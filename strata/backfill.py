"""Backfill and replay: process committed offset ranges again, replacing their rows.

After an incident (a decoder bug, a bad deploy upstream, a table damaged by hand) an
on-call engineer re-ingests `[start, end)` of one partition: a backfill. The rows of
that range already in the tables are removed and the re-read ones added in the same
Delta transaction, so readers never see the range twice or not at all; rows outside
the range are untouched. When Kafka's retention has deleted the range, the raw copy
is read instead, and the run says so.

A replay re-decodes whole batches (or a range) from the raw copy alone, with the
current schema and decoder, without touching Kafka: after a decoder or schema fix,
quarantined messages that now decode move into the data table. The ledger records
every backfill and replay with its reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from strata.config import PipelineConfig
from strata.delta import open_table, range_filter
from strata.kafka import KafkaUnavailable, partition_states
from strata.ledger import LedgerState, commit_ledger, ledger_state, read_ledger
from strata.lock import run_lock
from strata.plan import BatchPlan, OffsetRange, PlanStore, decode_fingerprint, split_ranges
from strata.run import (
    RANGES_KEY,
    ReconcileError,
    RunOutcome,
    check_schema,
    commit_table,
    crash_point,
    data_columns,
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
    return _reprocess(cfg, [target], reason, "backfill", session)


def replay(
    cfg: PipelineConfig,
    targets: list[OffsetRange],
    reason: str,
    *,
    session: Callable[[PipelineConfig], SparkSession] | None = None,
) -> RunOutcome:
    """Re-decode committed ranges from the raw copy with the current schema and decoder.

    The ranges' rows in the data and quarantine tables are replaced, one transaction
    per table; the raw copy is left as it is and Kafka is never contacted.

    Args:
        cfg: The pipeline configuration.
        targets: At most one range per partition (see `batch_ranges`).
        reason: Why; recorded in the ledger.
        session: Builds the Spark session.

    Returns:
        The outcome, with status `replayed`.

    Raises:
        BackfillError: If a range is invalid, not committed, or not in the raw copy.
    """
    return _reprocess(cfg, targets, reason, "replay", session)


def batch_ranges(cfg: PipelineConfig, first: int, last: int) -> list[OffsetRange]:
    """The ranges ingested by batches `first` to `last`, one per partition.

    A range spans from the first batch's start to the last batch's end on each
    partition; offsets lost to retention in between are in no copy, and a replay
    counts them as gaps again.

    Raises:
        BackfillError: If the batches ingested nothing.
    """
    if first < 1 or last < first:
        raise BackfillError(
            f"batches {first} to {last} are not a range; give --from-batch at least 1 and "
            "--to-batch not below it"
        )
    spans: dict[tuple[str, int], tuple[int, int]] = {}
    for r in read_ledger(cfg).to_pylist():
        if r["kind"] != "ingest" or not first <= r["batch"] <= last:
            continue
        if r["end_offset"] == r["start_offset"]:
            continue
        key = (r["topic"], r["partition"])
        start, end = spans.get(key, (r["start_offset"], r["end_offset"]))
        spans[key] = (min(start, r["start_offset"]), max(end, r["end_offset"]))
    if not spans:
        raise BackfillError(
            f"batches {first} to {last} of pipeline {cfg.name} ingested no messages; "
            "`strata status` lists the committed batches"
        )
    return [OffsetRange(t, p, start, end) for (t, p), (start, end) in sorted(spans.items())]


def _reprocess(
    cfg: PipelineConfig,
    targets: list[OffsetRange],
    reason: str,
    kind: str,
    session: Callable[[PipelineConfig], SparkSession] | None,
) -> RunOutcome:
    """Plan (or resume) a backfill or replay batch, run it, commit and reconcile it."""
    began = time.monotonic()
    for target in targets:
        _check_request(cfg, target, reason)
    if len({(t.topic, t.partition) for t in targets}) != len(targets):
        raise BackfillError("give at most one range per partition")
    with run_lock(cfg.lock_path, cfg.name):
        state = ledger_state(cfg)
        for target in targets:
            _check_committed(state, target)
        batch = state.last_batch + 1
        store = PlanStore(cfg)
        plan = store.load(batch)
        if plan is not None and (plan.kind != kind or plan.ranges != targets):
            what = f"a {plan.kind} of {', '.join(f'{r.topic}:{r.partition}' for r in plan.ranges)}"
            raise BackfillError(
                f"batch {batch} is unfinished ({what}); finish it first with "
                f"`strata {'run' if plan.kind == 'ingest' else plan.kind}` as it began"
            )
        if plan is None:
            from strata.spark import default_tasks

            check_schema(cfg)
            if kind == "replay":
                source = _raw_source(cfg, targets)
            else:
                source = _source(cfg, targets[0], state)
            plan = BatchPlan(
                pipeline=cfg.name,
                batch=batch,
                ranges=targets,
                splits=split_ranges(targets, default_tasks(cfg), cfg.limits.max_offsets_per_task),
                fingerprint=decode_fingerprint(cfg),
                created_at=datetime.now(UTC).isoformat(timespec="seconds"),
                kind=kind,
                note=reason,
                source=source,
            )
            store.save(plan)
        outcome = RunOutcome(cfg.name, "replayed" if kind == "replay" else "backfilled", batch)
        if plan.source == "raw" and kind == "backfill":
            outcome.warnings.append(
                f"{targets[0].describe()} are no longer in Kafka; they were read from the raw copy"
            )
        results = _replace(cfg, plan, targets, session, outcome)
        outcome.ranges = results
        commit_ledger(
            cfg, batch, [ledger_row(r, {}, kind, plan.note) for r in results], data_columns(cfg)
        )
        crash_point("after_ledger")
        _reconcile_ranges(cfg, kind, targets, results)
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


def _raw_source(cfg: PipelineConfig, targets: list[OffsetRange]) -> str:
    """`raw`, once it is sure the raw copy holds every range."""
    for target in targets:
        if not _raw_covers(cfg, target):
            raise BackfillError(
                f"{target.describe()} are not all in the raw copy (no committed ingest covers "
                "them); nothing was done"
            )
    return "raw"


def _raw_covers(cfg: PipelineConfig, target: OffsetRange) -> bool:
    """Whether committed ingests cover the range, so the raw copy holds its messages.

    Ranges recorded as lost to retention count as covered: no copy holds them, and
    reading the range counts them as gaps, as the ingest did.
    """
    rows = read_ledger(cfg).to_pylist()
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


def _replace(
    cfg: PipelineConfig,
    plan: BatchPlan,
    targets: list[OffsetRange],
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
    meta = {RANGES_KEY: [vars(r) for r in results], f"strata.{plan.kind}": plan.note}
    for name in tables:
        files = [f for s in split_results for f in s.files.get(name, [])]
        outcome.files[name] = len(files)
        if not done[name]:
            commit_table(cfg, name, files, plan.batch, meta, replacing=targets)
    return results


def _reconcile_ranges(
    cfg: PipelineConfig, kind: str, targets: list[OffsetRange], results: list[RangeResult]
) -> None:
    """Afterwards, each table holds each range's rows exactly once."""
    problems = []
    found = {(r.topic, r.partition): r for r in results}
    tables = {
        name: open_table(cfg.location(name), cfg.storage_options)
        for name in ("table", "quarantine", "raw")
    }
    for target in targets:
        where = target.describe()
        r = found.get((target.topic, target.partition))
        if r is None:
            problems.append(f"{where}: no result")
            continue
        if r.end - r.start != r.rows + r.quarantined + r.gaps:
            problems.append(
                f"{where}: offsets span {r.end - r.start}, but rows {r.rows} + quarantined "
                f"{r.quarantined} + gaps {r.gaps} = {r.rows + r.quarantined + r.gaps}"
            )
        expect = {"table": r.rows, "quarantine": r.quarantined, "raw": r.messages}
        wanted = range_filter(target)
        for name, want in expect.items():
            table = tables[name]
            have = 0 if table is None else table.to_pyarrow_dataset().count_rows(filter=wanted)
            if have != want:
                problems.append(f"{where}: the {name} table holds {have} rows, expected {want}")
    if problems:
        raise ReconcileError(f"the {kind} does not reconcile:\n  " + "\n  ".join(problems))
