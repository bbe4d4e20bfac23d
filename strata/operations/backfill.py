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

Here is what such a request may do and where its messages are read from; the batch
itself is run by the conductor (`strata.run.reprocess`), as every batch is.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from strata.batch.commit import raw_covers
from strata.batch.kafka import partition_states, topic_ids
from strata.batch.plan import BatchPlan, PlanStore, Reprocess, drop_command, split_ranges
from strata.batch.planning import PlanSettings, check_schema
from strata.config import KafkaSource
from strata.errors import BackfillError, KafkaUnavailable
from strata.store.identity import TableProblem, check_tables, foreign_files, table_problems
from strata.store.ledger import (
    LedgerState,
    batch_log_ids,
    committed_log_ids,
    ledger_state,
    read_ledger,
)
from strata.store.places import Places
from strata.store.ranges import OffsetRange

if TYPE_CHECKING:
    pass


def batch_ranges(places: Places, first: int, last: int) -> list[OffsetRange]:
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
    for r in read_ledger(places).to_pylist():
        if r["kind"] != "ingest" or not first <= r["batch"] <= last:
            continue
        if r["end_offset"] == r["start_offset"]:
            continue
        key = (r["topic"], r["partition"])
        start, end = spans.get(key, (r["start_offset"], r["end_offset"]))
        spans[key] = (min(start, r["start_offset"]), max(end, r["end_offset"]))
    if not spans:
        raise BackfillError(
            f"batches {first} to {last} of pipeline {places.pipeline} ingested no messages; "
            "`strata status` lists the committed batches"
        )
    return [OffsetRange(t, p, start, end) for (t, p), (start, end) in sorted(spans.items())]


def replay_targets(
    places: Places,
    from_batch: int | None,
    to_batch: int | None,
    target: tuple[str | None, int | None, int | None, int | None],
) -> list[OffsetRange]:
    """What a replay request names: batches `from_batch` to `to_batch`, or one range.

    Args:
        places: The pipeline's places (its ledger).
        from_batch: The first batch, or None for a range.
        to_batch: The last batch; None is `from_batch`.
        target: Topic, partition, first offset and first offset after, all None for
            batches.

    Raises:
        BackfillError: If the request names both, or neither, or part of a range.
    """
    if from_batch is not None and all(v is None for v in target):
        return batch_ranges(places, from_batch, from_batch if to_batch is None else to_batch)
    topic, partition, start, end = target
    if from_batch is None and to_batch is None:
        if topic is not None and partition is not None and start is not None and end is not None:
            return [OffsetRange(topic, partition, start, end)]
    raise BackfillError(
        "give either --from-batch (and --to-batch), or --topic, --partition, --from and --to"
    )


def reprocess_plan(
    places: Places,
    settings: PlanSettings,
    targets: list[OffsetRange],
    reason: str,
    kind: Reprocess,
    rebuild: tuple[str, ...] = (),
) -> tuple[BatchPlan, bool]:
    """Check a backfill or replay and plan it, or find it planned and unfinished.

    Called under the run lock: the plan is saved before anything is read, as every
    batch's is.

    Args:
        places: The pipeline's places.
        settings: How the pipeline's batches are planned (and split into tasks), and
            how messages are decoded, as now configured.
        targets: At most one range per partition.
        reason: Why; recorded in the ledger.
        kind: `backfill` or `replay`.
        rebuild: For a replay of every batch, the tables gone or replaced that it makes
            afresh from the raw copy (`strata replay --rebuild`).

    Returns:
        The batch's plan, and whether it was an unfinished batch's.

    Raises:
        BackfillError: If a range is invalid, not committed, or held by no copy; or
            another backfill or replay is unfinished.
    """
    for target in targets:
        _check_request(places, settings.source, target, reason)
    if len({(t.topic, t.partition) for t in targets}) != len(targets):
        raise BackfillError("give at most one range per partition")
    state = ledger_state(places)
    for target in targets:
        _check_committed(state, target)
    batch = state.last_batch + 1
    store = PlanStore(places)
    plan = store.load(batch)
    resumed = plan is not None
    # The tables are those the ledger's batches went to; a rebuild makes its own afresh.
    check_tables(places, state, rebuilding=rebuild if plan is None else plan.rebuild)
    if plan is None:
        if rebuild:
            _prepare_rebuild(places, state, rebuild)
        check_schema(places, settings.decoding)
        for target in targets:
            _one_log(places, target)
        ids: dict[str, str] = {}
        if kind == "replay":
            source = _raw_source(places, targets)
        else:
            source, ids = _source(places, settings.source, targets[0], state)
        made = BatchPlan(
            pipeline=places.pipeline,
            batch=batch,
            ranges=targets,
            splits=split_ranges(targets, settings.tasks, settings.limits.max_offsets_per_task),
            fingerprint=settings.fingerprint,
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            kind=kind,
            note=reason,
            source=source,
            topic_ids=ids,
            rebuild=rebuild,
        )
        plan = store.create(made)
        resumed = plan is not made
    if plan.kind != kind or plan.ranges != targets or plan.rebuild != rebuild:
        what = f"a {plan.kind} of {', '.join(r.describe() for r in plan.ranges)}"
        raise BackfillError(
            f"batch {batch} is unfinished ({what}); nothing was done. `strata run "
            f"--pipeline {places.pipeline}` finishes it as it began; or drop it with "
            f"{drop_command(places.pipeline, batch)}"
        )
    return plan, resumed


def rebuild_request(places: Places) -> tuple[list[OffsetRange], tuple[str, ...]]:
    """What `strata replay --rebuild` replays, and the tables it makes afresh.

    Every committed batch, one range per partition, from the raw copy; into the data
    table and the quarantine wherever one of them is gone or replaced.

    Raises:
        BackfillError: If neither table needs it, or the raw copy (its source) is gone.
    """
    state = ledger_state(places)
    problems = {p.role for p in table_problems(places, state)}
    if "raw" in problems:
        raise BackfillError(
            f"the raw copy of {places.pipeline} is not the one the ledger vouches for, and a "
            "rebuild reads it: restore it, or accept its loss with `strata ledger reset "
            f"--pipeline {places.pipeline} --table raw --reason TEXT` first"
        )
    rebuild = tuple(role for role in ("quarantine", "table") if role in problems)
    if not rebuild:
        raise BackfillError(
            f"the data table and the quarantine of {places.pipeline} are the ones the ledger "
            "vouches for: there is nothing to rebuild"
        )
    return batch_ranges(places, 1, state.last_batch), rebuild


def _prepare_rebuild(places: Places, state: LedgerState, rebuild: tuple[str, ...]) -> None:
    """A rebuild makes only tables that are gone, or are this pipeline's own, afresh.

    An Iceberg table whose metadata is gone leaves an entry in the metastore that names
    no file: it is dropped, so that the rebuild can create the table under its name.

    Raises:
        BackfillError: If a table it names is the one the ledger vouches for (nothing to
            rebuild), is not the pipeline's, or another table's files are at its place.
    """
    problems: dict[str, TableProblem] = {p.role: p for p in table_problems(places, state)}
    if "ledger" in problems:
        raise BackfillError(
            f"{problems['ledger'].text}: a rebuild needs the ledger that holds every batch"
        )
    for role in rebuild:
        problem = problems.get(role)
        what = f"the {'data table' if role == 'table' else role} of {places.pipeline}"
        if problem is None:
            raise BackfillError(
                f"{what} is the one the ledger vouches for: there is nothing to rebuild. To "
                f"decode its batches again, `strata replay --pipeline {places.pipeline} "
                "--from-batch N --to-batch M --reason TEXT`"
            )
        if problem.problem == "foreign":
            raise BackfillError(
                f"{problem.text}: a rebuild would write into it. Point the table elsewhere "
                "(its location key), or remove that table first"
            )
        if problem.problem == "gone":
            ref = places.table(role)  # type: ignore[arg-type]
            if ref.format == "iceberg":
                from strata.store import iceberg_entries

                iceberg_entries.forget_lost(ref)
            other = foreign_files(ref)
            if other:
                raise BackfillError(
                    f"{what} is gone, but its place ({ref.uri}) holds another table's files "
                    f"({', '.join(other)}): a rebuild would mix with them. Restore the table, "
                    "or point it elsewhere (its location key), or move those files away"
                )


def _check_request(places: Places, source: KafkaSource, target: OffsetRange, reason: str) -> None:
    if places.format == "parquet":
        raise BackfillError(
            "backfill replaces rows inside a Delta or Iceberg commit; plain Parquet tables "
            "(table_format: parquet) cannot be backfilled yet"
        )
    if not source.reads(target.topic):
        raise BackfillError(
            f"topic `{target.topic}` is not read by pipeline {places.pipeline} "
            f"({source.description})"
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


def _source(
    places: Places, source: KafkaSource, target: OffsetRange, state: LedgerState
) -> tuple[str, dict[str, str]]:
    """`kafka` if the broker still holds the range's log, else `raw` if the raw copy does.

    Kafka holds the range only if it holds its offsets *and* the topic is the one they
    were read from: a topic deleted and created again keeps its name, and its offsets
    are other messages.

    Returns:
        The source, and the topics' ids when it is Kafka (the plan keeps them).
    """
    kafka_says = ""
    try:
        current = topic_ids(source)
        was = _read_from(places, target)
        now = current.get(target.topic)
        if was and was != {now}:
            kafka_says = (
                f"`{target.topic}` was created again since (id {', '.join(sorted(was))}, now {now})"
                if now is not None
                else f"the id of `{target.topic}` could not be read to check it is the same log"
            )
        else:
            for s in partition_states(source, state.committed):
                if (s.topic, s.partition) == (target.topic, target.partition):
                    if s.low <= target.start and target.end <= s.high:
                        return "kafka", current
                    kafka_says = f"Kafka holds [{s.low}, {s.high})"
            kafka_says = kafka_says or "Kafka has no such partition"
    except KafkaUnavailable as exc:
        kafka_says = f"Kafka is unreachable ({exc})"
    if raw_covers(places, target):
        return "raw", {}
    raise BackfillError(
        f"{target.describe()} are held by neither Kafka ({kafka_says}) nor the raw copy "
        "(no committed ingest covers them); nothing was done"
    )


def _read_from(places: Places, target: OffsetRange) -> set[str]:
    """The ids of the logs a committed range's offsets were read from, where recorded.

    Each ingest batch records which log each partition was read on (`LogIds`); the
    newest record would name the log reading goes on in now, which a seek may have
    moved onto a re-created topic since the range was read.
    """
    rows = read_ledger(
        places, ["batch", "kind", "topic", "partition", "start_offset", "end_offset"]
    )
    batches = sorted(
        {
            r["batch"]
            for r in rows.to_pylist()
            if r["kind"] == "ingest"
            and (r["topic"], r["partition"]) == (target.topic, target.partition)
            and r["start_offset"] < target.end
            and r["end_offset"] > target.start
        }
    )
    found = set()
    for recorded in batch_log_ids(places, batches).values():
        uid = recorded.of(target.topic, target.partition)
        if uid is not None:
            found.add(uid)
    if not found:
        # No ingest read the range, or it was read before ids were recorded: the log
        # reading goes on in now is all the ledger can say.
        newest = committed_log_ids(places)
        uid = None if newest is None else newest.of(target.topic, target.partition)
        found = set() if uid is None else {uid}
    return found


def _one_log(places: Places, target: OffsetRange) -> None:
    """Refuse a range two logs cover: its rows could not be told apart.

    After a topic was deleted, created again and read again from its start (a seek
    back), the same offsets name messages of both logs, in the tables and in the raw
    copy alike; replacing a range's rows would replace both logs' rows with one's.

    Raises:
        BackfillError: Naming the batches that read the range's offsets twice.
    """
    spans = sorted(
        (max(r["start_offset"], target.start), min(r["end_offset"], target.end), r["batch"])
        for r in read_ledger(places).to_pylist()
        if r["kind"] == "ingest"
        and (r["topic"], r["partition"]) == (target.topic, target.partition)
        and r["start_offset"] < target.end
        and r["end_offset"] > target.start
    )
    for (_, end0, b0), (start1, _, b1) in zip(spans, spans[1:], strict=False):
        if start1 < end0:
            raise BackfillError(
                f"{target.describe()}: batches {b0} and {b1} both read offsets from {start1}: "
                "two logs under one topic name (it was created again and read from its start). "
                "Their rows cannot be told apart; nothing was done. Give a range only one log "
                "covers."
            )


def _raw_source(places: Places, targets: list[OffsetRange]) -> str:
    """`raw`, once it is sure the raw copy holds every range."""
    for target in targets:
        if not raw_covers(places, target):
            raise BackfillError(
                f"{target.describe()} are not all in the raw copy (no committed ingest covers "
                "them); nothing was done"
            )
    return "raw"
