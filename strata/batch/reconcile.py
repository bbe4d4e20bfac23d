"""Reconciliation: every offset of a batch accounted for once, checked in one place.

The run checks a batch before each commit (the tasks' pieces tile the plan, the files
hold what was read, a resumed batch decides as its first attempt did, the tables hold
the batch once); backfill and replay commit through the same path; the quality report
checks the same rules again, after the fact, from the ledger and the tables. The
rules here take plain figures and table references, never the whole configuration.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from strata.batch.plan import drop_command
from strata.batch.task import RangeResult
from strata.config import TableName
from strata.errors import ReconcileError, TombstoneRefused
from strata.store.places import TableRef
from strata.store.tables import Counts, batch_counts, batch_record, file_counts, range_counts

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyiceberg.table import Table as IcebergTable

    from strata.batch.plan import BatchPlan
    from strata.batch.task import SplitResult
    from strata.store.parquet import WrittenFile

RANGES_KEY = "strata.ranges"
"""Commit metadata of each table's batch commit: what the batch read and decoded."""

TABLES: tuple[TableName, ...] = ("raw", "quarantine", "table")
"""The tables a batch commits, in commit order."""

EXPECTED: dict[TableName, str] = {"table": "rows", "quarantine": "quarantined", "raw": "messages"}
"""Which count of a range each table must hold: its rows, quarantined rows, messages."""


def span_problems(
    span: int, messages: int, gaps: int, rows: int, quarantined: int, skipped: int = 0
) -> list[str]:
    """Offsets of a range = messages read + gaps, and messages = rows + quarantined + skipped.

    Args:
        span: End offset minus start offset.
        messages: Distinct offsets read.
        gaps: Offsets the broker no longer holds (compacted, aborted transactions).
        rows: Rows decoded into the data table.
        quarantined: Rows quarantined.
        skipped: Tombstones skipped and counted (`on_tombstone: skip`).

    Returns:
        A sentence for each rule broken; empty if the range adds up.
    """
    problems = []
    if span != messages + gaps or gaps < 0:
        problems.append(f"offsets span {span}, but {messages} messages were read and {gaps} gaps")
    if rows + quarantined + skipped != messages:
        tombstones = f" and {skipped} tombstones skipped" if skipped else ""
        problems.append(
            f"read {messages} messages but decoded {rows} rows and {quarantined} "
            f"quarantined{tombstones}"
        )
    return problems


def count_problems(expected: Counts, counted: Counts, sentence: str) -> list[str]:
    """Partitions whose counted rows differ from what was expected.

    Args:
        expected: Rows per (topic, partition) that must be there.
        counted: Rows per (topic, partition) found.
        sentence: What a mismatch says, with `{have}` and `{want}` to fill in.

    Returns:
        A sentence per partition that differs, naming it.
    """
    return [
        f"partition {partition} of `{topic}`: "
        + sentence.format(have=counted.get((topic, partition), 0), want=want)
        for (topic, partition), want in expected.items()
        if counted.get((topic, partition), 0) != want
    ]


_COUNTERS = (
    "messages",
    "gaps",
    "rows",
    "quarantined",
    "bytes",
    "late_rows",
    "offset_sum",
    "redelivered",
    "gap_runs",
    "gap_runs_verified",
    "skipped",
    "skipped_offset_sum",
    "refused",
)


def batch_results(plan: BatchPlan, split_results: list[SplitResult]) -> list[RangeResult]:
    """One result per planned range, from the tasks' pieces, checked against the plan.

    A long range may have been cut across tasks. The pieces the tasks report must
    tile each planned range exactly: a piece missing, doubled or outside the plan
    means offsets were not read once, whatever the counts say.

    Raises:
        ReconcileError: Naming each range whose pieces do not tile it.
    """
    pieces: dict[tuple[str, int], list[RangeResult]] = {}
    for split in split_results:
        for r in split.ranges:
            pieces.setdefault((r.topic, r.partition), []).append(r)
    problems = []
    results = []
    for planned in plan.ranges:
        key = (planned.topic, planned.partition)
        mine = sorted(pieces.pop(key, []), key=lambda r: (r.start, r.end))
        merged = RangeResult(planned.topic, planned.partition, planned.start, planned.end)
        reach = planned.start
        for r in mine:
            if r.start != reach or r.end <= r.start or r.end > planned.end:
                problems.append(
                    f"{planned.describe()}: a task reported [{r.start}, {r.end}) where "
                    f"[{reach}, ...) was due"
                )
            reach = max(reach, r.end)
            for name in _COUNTERS:
                setattr(merged, name, getattr(merged, name) + getattr(r, name))
            merged.max_lateness_ms = max(merged.max_lateness_ms, r.max_lateness_ms)
            for name, pick in (
                ("min_event_us", min),
                ("max_event_us", max),
                ("first_refused", min),
            ):
                values = [v for v in (getattr(merged, name), getattr(r, name)) if v is not None]
                setattr(merged, name, pick(values) if values else None)
        if reach != planned.end:
            problems.append(f"{planned.describe()}: the tasks reported offsets up to {reach} only")
        results.append(merged)
    for (topic, partition), extra in sorted(pieces.items()):
        problems.append(
            f"partition {partition} of `{topic}`: a task reported "
            f"{', '.join(f'[{r.start}, {r.end})' for r in extra)}, which the plan does not hold"
        )
    if problems:
        raise ReconcileError(
            f"batch {plan.batch} does not reconcile; nothing was committed:\n  "
            + "\n  ".join(problems)
        )
    refuse_tombstones(plan, results)
    return results


def refuse_tombstones(plan: BatchPlan, results: list[RangeResult]) -> None:
    """Stop a batch that met a tombstone under `on_tombstone: fail`, before any commit.

    Raises:
        TombstoneRefused: Naming each partition, its first tombstone's offset, and the
            setting that lets the batch finish.
    """
    refused = [r for r in results if r.refused]
    if not refused:
        return
    names = "; ".join(
        f"partition {r.partition} of `{r.topic}`: {r.refused} tombstone"
        f"{'s' if r.refused > 1 else ''} (null values), the first at offset {r.first_refused}"
        for r in refused
    )
    raise TombstoneRefused(
        f"batch {plan.batch}: {names}; on_tombstone is `fail`, so nothing was committed. "
        "Set on_tombstone to `skip` (count them and go on) or `quarantine` (keep them in "
        "the quarantine table) in the pipeline's configuration and run again: the batch "
        "finishes with the same offsets."
    )


def planned_results(plan: BatchPlan, stored: list[RangeResult]) -> list[RangeResult]:
    """Stored results completed with an empty result for every planned range they lack.

    Commits made before empty ranges were recorded hold only the ranges that had
    offsets; the ledger must record every planned range's start all the same.
    """
    have = {(r.topic, r.partition): r for r in stored}
    return [
        have.get((r.topic, r.partition)) or RangeResult(r.topic, r.partition, r.start, r.end)
        for r in plan.ranges
    ]


def reconcile_files(
    plan: BatchPlan,
    results: list[RangeResult],
    written: dict[TableName, list[WrittenFile]],
    wrote: Collection[TableName],
) -> None:
    """Before anything is committed: the files hold what was read, once, per partition.

    Per planned range, the offsets read (distinct, counted and summed by the reader)
    must equal the rows plus the quarantined rows, as counted from the rows written
    into the data and quarantine files, and the raw copy's files must hold every
    offset read. The offset sums make a message landed twice in place of another
    visible even where the counts agree.

    Raises:
        ReconcileError: Naming each partition that does not add up; nothing is committed.
    """
    in_files = {name: _file_offsets(written[name]) for name in TABLES if name in wrote}
    problems = []
    for r in results:
        key = f"{r.topic}:{r.partition}"
        where = f"partition {r.partition} of `{r.topic}` [{r.start}, {r.end})"
        problems += [
            f"{where}: {p}"
            for p in span_problems(
                r.end - r.start, r.messages, r.gaps, r.rows, r.quarantined, r.skipped
            )
        ]
        for name, counted in in_files.items():
            rows, _ = counted.get(key, (0, 0))
            want = getattr(r, EXPECTED[name])
            if rows != want:
                problems.append(
                    f"{where}: the {name} files hold {rows} rows of it, {want} expected"
                )
        sums = {name: counted.get(key, (0, 0))[1] for name, counted in in_files.items()}
        if "raw" in sums and sums["raw"] != r.offset_sum:
            problems.append(f"{where}: the raw files hold other offsets than were read")
        if {"table", "quarantine"} <= sums.keys() and (
            sums["table"] + sums["quarantine"] + r.skipped_offset_sum != r.offset_sum
        ):
            problems.append(
                f"{where}: the data and quarantine files hold other offsets than were read"
            )
    if problems:
        raise ReconcileError(
            f"batch {plan.batch} does not reconcile; nothing was committed:\n  "
            + "\n  ".join(problems)
        )


def reconcile_resumed(
    pipeline: str,
    plan: BatchPlan,
    results: list[RangeResult],
    committed: TableName,
    ref: TableRef,
    table: DeltaTable | IcebergTable | None = None,
) -> None:
    """A resumed batch decides as the attempt whose commits already stand did.

    Tables committed by an earlier attempt recorded what it read and decoded, per
    partition. This attempt writes the other tables; if it read or decoded otherwise
    (the decode settings or Strata's decoder changed since, or the raw copy does not
    hold the batch), its commits would put a message in both tables or in neither.

    Args:
        pipeline: The pipeline's name, for the way out.
        plan: The batch.
        results: What this attempt read and decoded.
        committed: A table whose commit of the batch stands.
        ref: That table.
        table: That table opened already, at a snapshot holding the batch's commit;
            without, it is opened.

    Raises:
        ReconcileError: Naming the partition, before anything more is committed.
    """
    name = committed
    stored = batch_record(ref, pipeline, plan.batch, RANGES_KEY, table)
    if stored is None:
        return
    before = {(r["topic"], r["partition"]): r for r in stored}
    problems = []
    for r in results:
        earlier = before.get((r.topic, r.partition))
        if earlier is None:
            if r.messages:
                problems.append(f"partition {r.partition} of `{r.topic}`: not in that commit")
            continue
        for field_name in ("messages", "gaps", "rows", "quarantined", "skipped", "offset_sum"):
            was, now = earlier.get(field_name), getattr(r, field_name)
            # Commits made before a counter existed carry none of it.
            if was is not None and was != now:
                problems.append(
                    f"partition {r.partition} of `{r.topic}`: {field_name} {was} then, {now} now"
                )
    if problems:
        raise ReconcileError(
            f"batch {plan.batch} does not decide as the attempt whose {name} commit stands; "
            "nothing more was committed:\n  " + "\n  ".join(problems) + "\nThe decode "
            "settings or Strata's decoder changed since that commit, or the raw copy does not "
            "hold the batch. Finish the batch with the settings and Strata version it began "
            f"with, or drop it with {drop_command(pipeline, plan.batch, force=True)} (its "
            "committed rows are removed and its "
            "offsets read again by the next batch)."
        )


def _file_offsets(files: list[WrittenFile]) -> dict[str, tuple[int, int]]:
    """Rows and offset sums per `topic:partition` over a table's written files."""
    out: dict[str, tuple[int, int]] = {}
    for f in files:
        for key, (rows, total) in f.offsets.items():
            have = out.get(key, (0, 0))
            out[key] = (have[0] + rows, have[1] + total)
    return out


def reconcile_tables(
    refs: dict[TableName, TableRef],
    plan: BatchPlan,
    results: list[RangeResult],
    written: dict[TableName, list[WrittenFile]] | None = None,
    tables: Mapping[TableName, DeltaTable | IcebergTable | None] | None = None,
    created: Mapping[TableName, list[WrittenFile]] | None = None,
) -> None:
    """Before the ledger commit: each table holds the batch's rows exactly once.

    An ingest's rows are counted by their batch number; a backfill's or replay's by
    their ranges, which its commits replaced. Delta tables are read back through their
    logs, plain Parquet tables through the files the batch wrote. A mismatch stops
    before the ledger commit, so the batch is not done and no run goes on past it.

    Args:
        refs: The tables.
        plan: The batch.
        results: What the batch read and decoded, per planned range.
        written: For plain Parquet, the files the batch wrote, per table.
        tables: Delta tables opened already, each at a snapshot read from its log after
            the batch's commit (`DeltaTable.update_incremental` after it); a table not
            given, or given as None, is opened.
        created: Delta tables the batch's commit created, with the files it committed.

    Raises:
        ReconcileError: Naming each partition and table that does not add up.
    """
    problems = []
    for name, ref in refs.items():
        table = None if tables is None else tables.get(name)
        if written is not None:
            counted = file_counts(ref, [f.path for f in written[name]])
        elif plan.kind == "ingest" and created is not None and name in created:
            # The table's log is not read again: its version 0, written only if absent,
            # is the commit that created it with exactly these files. No later commit
            # adds rows of the batch (its app transaction stands, so every other commit
            # of it is refused), and none removes them but under the run lock this run
            # holds (a drop) or with its rows rewritten (a compaction). The files
            # themselves are read, as from any table.
            counted = file_counts(ref, [f.path for f in created[name]], plan.batch)
        elif plan.kind == "ingest":
            counted = batch_counts(ref, plan.batch, table)
        else:
            counted = range_counts(ref, plan.ranges, table)
        expected = {(r.topic, r.partition): getattr(r, EXPECTED[name]) for r in results}
        problems += count_problems(
            expected,
            counted,
            f"the {name} table holds {{have}} rows of batch {plan.batch}, "
            "the tasks counted {want}",
        )
    if problems:
        raise ReconcileError(
            f"batch {plan.batch} does not reconcile; the ledger was not committed:\n  "
            + "\n  ".join(problems)
        )


def ledger_continuity(ledger: pa.Table) -> tuple[list[str], list[str]]:
    """Overlaps between ingested ranges, and holes nothing recorded explains.

    Each partition's position is followed batch by batch: an ingest or a recorded loss
    must start where the position is and moves it to its end; a seek (an operator's
    recorded edit) moves it wherever it says, skipped offsets included.

    Args:
        ledger: Every ledger row.

    Returns:
        Sentences naming each overlap, and each hole.
    """
    order = {"seek": 0, "loss": 1, "ingest": 2}
    moves = sorted(
        (
            (r["topic"], r["partition"]),
            r["batch"],
            order[r["kind"]],
            r["start_offset"],
            r["end_offset"],
        )
        for r in ledger.to_pylist()
        if r["kind"] in order
    )
    # Per partition: where reading goes on, and the batch and start of the range that
    # put it there.
    position: dict[tuple[str, int], tuple[int, int, int]] = {}
    overlaps, holes = [], []
    for key, batch, kind, start, end in moves:
        where = f"partition {key[1]} of `{key[0]}`"
        if kind == order["seek"]:
            position[key] = (end, batch, start)
            continue
        at, since, since_start = position.get(key, (start, batch, start))
        if start < at:
            overlaps.append(
                f"{where}: batch {batch} [{start}, {end}) overlaps batch {since} "
                f"[{since_start}, {at})"
            )
        elif start > at:
            holes.append(
                f"{where}: offsets [{at}, {start}) between batch {since} and batch {batch} were "
                "never read and no loss is recorded for them"
            )
        if end >= at:
            position[key] = (end, batch, start)
    return overlaps, holes
