"""The ways out of a stop: abandon a plan, move where reading goes on, restore or reset a table.

The edits of the ledger are made the safe way: under the run lock, as a batch of
their own (so no plan saved before the edit can run after it), with who, when and
why in the ledger beside the offsets they concern. Nothing is edited by hand.

- `drop_plan` abandons the saved plan of the unfinished batch when it can no longer
  be finished (retention deleted its offsets before its raw copy was committed, its
  file is damaged). The batch is recorded as `abandon` and reads nothing; the next
  run plans afresh from where the ledger goes on, so `--accept-loss` applies to it.
- `seek` moves where reading goes on in a partition: forward past offsets nobody
  will read (recorded, like a loss), or back to the start of a topic that was
  deleted and created again under the same name.
- `reset_table` accepts that a table the ledger vouches for is gone, replaced or an
  older copy (`strata.store.identity`): recorded as a `reset` batch naming what is not
  in the table any more, it starts the table afresh (or takes the one that stands).
- `restore_table` registers an Iceberg table dropped from the metastore (its files
  left in place) again, from its own newest metadata file: nothing is lost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strata.batch.commit import fence_table, remove_batch_rows
from strata.batch.kafka import partition_states, publish_offsets, topic_ids
from strata.batch.parquet_files import remove_batch_files
from strata.batch.plan import PlanStore, drop_command
from strata.batch.reconcile import RANGES_KEY, TABLES
from strata.config import KafkaSource, SchemaSpec, TableName
from strata.errors import LedgerEditError, PlanError
from strata.store.identity import (
    WRITTEN,
    mark_parquet_table,
    refuse_foreign,
    table_problems,
    vouch,
)
from strata.store.ledger import (
    LedgerState,
    LogIds,
    commit_ledger,
    committed_log_ids,
    ledger_state,
    unread_row,
)
from strata.store.lock import run_lock
from strata.store.places import Places
from strata.store.ranges import OffsetRange
from strata.store.tables import batch_record


@dataclass
class LedgerEdit:
    """What an edit recorded.

    Attributes:
        pipeline: Pipeline name.
        kind: `abandon` or `seek`.
        batch: The ledger batch that records the edit.
        rows: The ledger rows written.
        warnings: What the operator should know.
    """

    pipeline: str
    kind: str
    batch: int
    rows: list[dict[str, Any]]
    warnings: list[str]


def drop_plan(
    places: Places,
    schemas: SchemaSpec,
    batch: int,
    reason: str,
    who: str,
    force: bool = False,
) -> LedgerEdit:
    """Abandon the saved plan of the unfinished batch, recording who, why and what.

    A drop is recorded before anything is changed (a marker beside the plan), so a
    drop cut short is finished by running it again, and no run takes the batch for a
    resumable one meanwhile. Each Delta table that does not hold the batch gets an
    empty commit of its number (a fence): a runner still holding the old plan can then
    commit nothing of it. The ledger commit of the `abandon` rows comes last.

    Args:
        places: The pipeline's places.
        schemas: What its tables' schemas are made from (a fence creates a missing table).
        batch: The unfinished batch; it must be the one after the ledger's last batch.
        reason: Why; recorded in the ledger.
        who: Who drops it (user@host).
        force: Drop an ingest batch that is partly committed too, removing the rows it
            committed (they are read again by the next batch). Without it, such a batch
            is refused: it can be finished.

    Returns:
        What was recorded.

    Raises:
        LedgerEditError: If the batch is not the unfinished one, has no plan, or is
            partly committed and `force` is not given.
    """
    _need_reason(reason)
    with run_lock(places) as lock:
        state = ledger_state(places)
        nxt = state.last_batch + 1
        if batch != nxt:
            raise LedgerEditError(
                f"batch {batch} is not the unfinished batch of pipeline {places.pipeline}: the "
                f"ledger's last batch is {state.last_batch}, so only batch {nxt} can be dropped"
            )
        store = PlanStore(places)
        begun = store.dropping(batch)
        damage = ""
        try:
            plan = store.load(batch, dropping_ok=True)
        except PlanError as exc:
            plan, damage = None, str(exc)
        if plan is None and not damage and begun is None:
            raise LedgerEditError(
                f"batch {batch} of pipeline {places.pipeline} has no saved plan; nothing to drop"
            )
        # Delta and Iceberg tables commit; plain Parquet files count once written.
        logged = places.format != "parquet"
        stood = [name for name in TABLES if logged and _committed(places, name, batch)]
        kind = plan.kind if plan is not None else _committed_kind(places, batch, stood)
        if begun is not None:
            force = bool(begun.get("force"))
        elif stood and not force:
            raise LedgerEditError(
                f"batch {batch} is partly committed ({', '.join(stood)}): its raw copy holds "
                "every message it planned, so it can be finished and is not dropped. Run "
                f"`strata run --pipeline {places.pipeline}`; if it says the decode settings "
                "changed, restore the ones the batch began with, finish it, then change them. "
                "If it cannot be finished, add --force: the rows it committed are removed and "
                "its offsets are read again by the next batch"
            )
        store.mark_dropped(
            batch,
            {"who": who, "reason": reason, "force": force, "at": _now(), "kind": kind or "?"},
        )
        note = f"plan of batch {batch} abandoned by {who}: {reason}"
        # A table gone or replaced by hand gets no fence: one would create a new table in
        # its place, or write into another's. It stays as it is, and runs stop on it.
        broken = _broken(places, state)
        if logged:
            for name in TABLES:
                if name in broken:
                    continue
                lock.check()
                if name in stood and kind == "ingest":
                    # An ingest's files hold only its own rows: removing them undoes it.
                    removed = remove_batch_rows(places, schemas, name, batch, note)
                    note_removed = f"; {removed} file(s) of it removed from {name}"
                    note += note_removed if removed else ""
                elif name not in stood:
                    fence_table(places, schemas, name, batch, note)
                # A backfill or replay that committed a table replaced its ranges' rows
                # there: each offset is still held once, and that stays.
        else:
            # Plain Parquet files are visible as soon as written: the plan's go with it.
            remove_batch_files(places, batch, lock=lock)
        if plan is not None:
            rows = [_abandon_row(r.topic, r.partition, r.start, note, r) for r in plan.ranges]
        else:
            # The plan cannot be read: record the partitions where reading goes on.
            note += " (the saved plan could not be read)"
            rows = [_abandon_row(t, p, e, note, None) for (t, p), e in state.committed.items()]
        lock.check()
        fenced = {n: None for n in TABLES if n not in broken}
        commit_ledger(places, batch, rows, tables=vouch(places, fenced, batch))
        warnings = [
            "the next `strata run` plans afresh from where the ledger goes on; if retention "
            "deleted offsets meanwhile, it stops until `strata run --accept-loss REASON`"
        ]
        if damage:
            warnings.insert(0, damage)
        return LedgerEdit(places.pipeline, "abandon", batch, rows, warnings)


def _committed(places: Places, name: TableName, batch: int) -> bool:
    """Whether a table holds a real commit of the batch (not a drop's empty fence)."""
    return batch_record(places.table(name), places.pipeline, batch, RANGES_KEY) is not None


def _committed_kind(places: Places, batch: int, stood: list[TableName]) -> str | None:
    """The kind of a batch whose plan cannot be read, from its tables' commits."""
    for name in stood:
        ref = places.table(name)
        for kind in ("backfill", "replay"):
            if batch_record(ref, places.pipeline, batch, f"strata.{kind}") is not None:
                return kind
        return "ingest"
    return None


def _now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).isoformat(timespec="seconds")


def _abandon_row(
    topic: str, partition: int, at: int, note: str, planned: OffsetRange | None
) -> dict[str, object]:
    what = f"; it planned [{planned.start}, {planned.end})" if planned is not None else ""
    return unread_row("abandon", topic, partition, at, at, 0, note + what)


def seek(
    places: Places,
    source: KafkaSource,
    schemas: SchemaSpec,
    topic: str,
    partition: int | None,
    to: str,
    reason: str,
    who: str,
    reread: bool = False,
) -> LedgerEdit:
    """Move where reading goes on in one partition (or all of a topic's), recorded.

    Args:
        places: The pipeline's places.
        source: The brokers and the pipeline's topics there.
        schemas: What its tables' schemas are made from (a fence creates a missing table).
        topic: The topic.
        partition: The partition; None for every partition of the topic.
        to: An offset, or `earliest` / `latest` (the log's start or end now).
        reason: Why; recorded in the ledger.
        who: Who seeks (user@host).
        reread: Allow going back over committed offsets of the same topic: they are
            read again and land twice, unless the tables are new.

    Returns:
        What was recorded.

    Raises:
        LedgerEditError: If a batch is unfinished, the target is outside the log, or
            the seek would read committed offsets again without `reread`.
    """
    _need_reason(reason)
    if not source.reads(topic):
        raise LedgerEditError(
            f"topic `{topic}` is not read by pipeline {places.pipeline} ({source.description})"
        )
    with run_lock(places) as lock:
        state = ledger_state(places)
        nxt = state.last_batch + 1
        _refuse_unfinished(places, nxt)
        states = [
            s
            for s in partition_states(source, state.committed)
            if s.topic == topic and partition in (None, s.partition)
        ]
        if not states:
            raise LedgerEditError(f"partition {partition} of `{topic}` is not on the brokers")
        # Only the sought topic's id: the seek vouches for nothing else (`LogIds`).
        now_id = topic_ids(source, [topic]).get(topic)
        recorded = committed_log_ids(places) or LogIds()
        note_base = f"seek by {who}: {reason}"
        rows = []
        warnings = []
        for s in sorted(states, key=lambda s: s.partition):
            was = recorded.of(topic, s.partition)
            # Where the partition's committed offsets belong to a log deleted since.
            new_log = was is not None and now_id not in (None, was)
            target = _target(to, s.low, s.high)
            where = f"partition {s.partition} of `{topic}`"
            if target > s.high or target < s.low:
                raise LedgerEditError(
                    f"{where}: offset {target} is outside the log [{s.low}, {s.high}); nothing "
                    "was changed. Use earliest, latest, or an offset inside it"
                )
            before = state.committed.get((topic, s.partition))
            if before is not None and target < before and not (new_log or reread):
                raise LedgerEditError(
                    f"{where}: offsets [{target}, {before}) are committed already; reading them "
                    "again would land them twice. Nothing was changed. To process committed "
                    "offsets again use `strata backfill` (it replaces their rows); if the topic "
                    "is a new log under the same name, add --reread"
                )
            if before is None or target >= before:
                start = target if before is None else before
                skipped = target - start
                note = f"{note_base}; moved from {before} to {target}"
                if skipped:
                    warnings.append(
                        f"{where}: offsets [{start}, {target}) are skipped: {skipped} messages "
                        "will not be read (recorded in the ledger)"
                    )
                rows.append(unread_row("seek", topic, s.partition, start, target, skipped, note))
            else:
                note = f"{note_base}; moved back from {before} to {target}"
                rows.append(unread_row("seek", topic, s.partition, target, target, 0, note))
                if not new_log:
                    warnings.append(
                        f"{where}: offsets [{target}, {before}) will be read again; their rows "
                        "land twice unless the topic is a new log"
                    )
        # A runner still holding a plan of this batch number commits nothing of it. A
        # table gone or replaced by hand gets no fence (see `drop_plan`).
        broken = _broken(places, state)
        fenced = {n: None for n in TABLES if n not in broken}
        if places.format != "parquet":
            for name in fenced:
                lock.check()
                fence_table(places, schemas, name, nxt, f"seek by {who}: {reason}")
        lock.check()
        # The partitions moved are now read on the topic's current log; no other.
        moved = {(topic, int(str(r["partition"]))): now_id for r in rows} if now_id else None
        commit_ledger(places, nxt, rows, partition_ids=moved, tables=vouch(places, fenced, nxt))
        positions = [
            OffsetRange(topic, int(str(r["partition"])), 0, int(str(r["end_offset"]))) for r in rows
        ]
        problem = publish_offsets(source, positions)
        if problem:
            warnings.append(problem + " (the ledger holds the truth; lag tools are behind)")
        return LedgerEdit(places.pipeline, "seek", nxt, rows, warnings)


def _broken(places: Places, state: LedgerState) -> set[str]:
    """The tables that are not the ones the ledger vouches for."""
    return {p.role for p in table_problems(places, state) if p.role != "ledger"}


def reset_table(
    places: Places, schemas: SchemaSpec, table: TableName, reason: str, who: str
) -> LedgerEdit:
    """Accept that a table the ledger vouches for is gone, replaced or older; start it afresh.

    The reset is a ledger batch of its own, recorded with who and why: one `reset` row
    per partition where reading goes on, noting which batches' rows the table no longer
    holds. A table that is gone is created empty (never where another table's files
    are); one replaced by another table of this pipeline, or an older copy, is taken as
    it stands. Every table the ledger vouches for is fenced with the reset's batch, as
    a seek fences them, and the ledger vouches for the new table from then on.

    Args:
        places: The pipeline's places.
        schemas: What its tables' schemas are made from (the new table's).
        table: `table`, `raw` or `quarantine`.
        reason: Why; recorded in the ledger.
        who: Who resets it (user@host).

    Returns:
        What was recorded.

    Raises:
        LedgerEditError: If a batch is unfinished, the ledger itself is behind the
            tables, the table is the one the ledger vouches for, or it is not this
            pipeline's table.
        TableMismatch: If another table's files are at the place of a table that is gone.
    """
    _need_reason(reason)
    with run_lock(places) as lock:
        state = ledger_state(places)
        nxt = state.last_batch + 1
        _refuse_unfinished(places, nxt)
        problems = {p.role: p for p in table_problems(places, state)}
        what = f"the {_TABLE_WORDS[table]} of pipeline {places.pipeline}"
        if "ledger" in problems:
            raise LedgerEditError(
                f"{problems['ledger'].text}; nothing was changed: a reset is recorded in the "
                "ledger, which must hold every batch the tables do. Restore the ledger first"
            )
        problem = problems.get(table)
        if problem is None:
            raise LedgerEditError(
                f"{what} is the one the ledger vouches for; nothing was changed (there is "
                "nothing to reset)"
            )
        if problem.problem == "foreign":
            raise LedgerEditError(
                f"{problem.text}; nothing was changed: it is not this pipeline's table, and a "
                "reset would take it as one. Point the table elsewhere (its location key), "
                "or remove that table first"
            )
        ref = places.table(table)
        if problem.problem == "gone":
            if ref.format == "iceberg":
                # An entry whose metadata is gone names no file: it makes way.
                from strata.store import iceberg_entries

                iceberg_entries.forget_lost(ref)
            refuse_foreign(ref, places.pipeline, table)
        note = (
            f"{_TABLE_WORDS[table]} reset by {who}: {reason}; it was {problem.problem} "
            f"({problem.text}): rows of batches up to {state.last_batch} are not in it"
        )
        fenced = {n: None for n in WRITTEN if n == table or n not in problems}
        for name in fenced:
            lock.check()
            if places.format == "parquet":
                if name == table:
                    mark_parquet_table(places.table(name), places.pipeline, name, nxt)
            else:
                fence_table(places, schemas, name, nxt, note)
        rows = [
            unread_row("reset", t, p, end, end, 0, note)
            for (t, p), end in sorted(state.committed.items())
        ]
        lock.check()
        commit_ledger(places, nxt, rows, tables=vouch(places, fenced, nxt))
        warnings = [
            f"{what} starts afresh from batch {nxt}: the rows of earlier batches are not in it "
            "(recorded in the ledger)"
        ]
        if table == "raw":
            warnings.append(
                "replays and backfills from the raw copy cannot read the earlier batches any more"
            )
        return LedgerEdit(places.pipeline, "reset", nxt, rows, warnings)


_TABLE_WORDS: dict[str, str] = {
    "table": "data table",
    "raw": "raw copy",
    "quarantine": "quarantine",
}


def restore_table(places: Places, table: TableName) -> str:
    """Register an Iceberg table dropped from the metastore again, from its own metadata.

    A table dropped without purge leaves its metadata and files at its place. The
    newest metadata file of the table the ledger vouches for (by its UUID) is
    registered under the table's name again: every batch it held is back, and nothing
    is recorded because nothing changed.

    Args:
        places: The pipeline's places.
        table: `table`, `raw` or `quarantine`.

    Returns:
        What was done, in words.

    Raises:
        LedgerEditError: If the table is not Iceberg, stands already, was renamed, or
            its metadata is not at its place.
    """
    ref = places.table(table)
    what = f"the {_TABLE_WORDS[table]} of pipeline {places.pipeline}"
    if ref.format != "iceberg":
        raise LedgerEditError(
            f"{what} is a {ref.format} table: Strata cannot restore its files; restore them "
            "from a copy (or the store's object versions) at its place, then run again"
        )
    from strata.store import iceberg, iceberg_entries

    with run_lock(places):
        state = ledger_state(places)
        vouched = state.tables.get(table)
        if vouched is None or not vouched.identity.startswith("iceberg:"):
            raise LedgerEditError(
                f"the ledger vouches for no Iceberg table as {what}; nothing to restore"
            )
        if iceberg.open_table(ref) is not None:
            raise LedgerEditError(
                f"{what} stands in the metastore as {ref.name}; nothing was changed. If it is "
                "another table than the ledger's, drop or rename that one first"
            )
        others = iceberg_entries.named_elsewhere(ref)
        if others:
            database = ref.metastore[1] if ref.metastore else "default"
            raise LedgerEditError(
                f"{what} is in the metastore as {', '.join(others)}: it was renamed. Rename it "
                f"back (in Trino: ALTER TABLE {others[0]} RENAME TO {database}.{ref.name}); a "
                "second entry would let two names write, and vacuum, one table's files"
            )
        uuid = vouched.identity.split(":", 1)[1]
        own = [
            path for path, meta in iceberg_entries.metadata_files(ref) if meta["table-uuid"] == uuid
        ]
        if not own:
            raise LedgerEditError(
                f"no metadata file of table {uuid} is at {ref.uri}/metadata: {what} cannot be "
                "restored from its place. Restore its files from a copy, or rebuild or reset "
                "it (`strata status` lists the ways)"
            )
        iceberg_entries.register_metadata(ref, own[-1])
        back = state.tables[table].batch
        return (
            f"{what} is registered as {ref.name} again, from {own[-1]}; the ledger vouched for "
            f"it at batch {back}"
        )


def _target(to: str, low: int, high: int) -> int:
    if to == "earliest":
        return low
    if to == "latest":
        return high
    try:
        return int(to)
    except ValueError:
        raise LedgerEditError(
            f"--to {to!r} is not an offset; give a number, earliest or latest"
        ) from None


def _refuse_unfinished(places: Places, batch: int) -> None:
    """A plan saved before an edit must never run after it."""
    store = PlanStore(places)
    try:
        plan = store.load(batch)
    except PlanError:
        plan = None
        unreadable = True
    else:
        unreadable = False
    if plan is not None or unreadable:
        what = "an unreadable plan" if plan is None else f"a {plan.kind}"
        raise LedgerEditError(
            f"batch {batch} is unfinished ({what}, {store.describe(batch)}); nothing was "
            f"changed. Finish it with `strata run --pipeline {places.pipeline}`, or drop it with "
            f"{drop_command(places.pipeline, batch)}, then seek"
        )


def _need_reason(reason: str) -> None:
    if not reason.strip():
        raise LedgerEditError("give a --reason; the ledger records why it was edited")


def render_edit(edit: LedgerEdit) -> str:
    """The edit in words, for the command line."""
    what = {"abandon": "plan abandoned", "seek": "reading moved", "reset": "table reset"}[edit.kind]
    lines = [f"pipeline {edit.pipeline}: {what}, recorded as ledger batch {edit.batch}"]
    for r in edit.rows:
        lines.append(
            f"  {r['topic']}:{r['partition']} [{r['start_offset']}, {r['end_offset']}) {r['note']}"
        )
    lines.extend(f"warning: {w}" for w in edit.warnings)
    return "\n".join(lines)
