"""The ledger: a queryable Delta table with one row per batch and partition.

It is the source of truth for what has been committed: the next plan starts where
its highest batch ended, and consumer-group offsets (which expire on quiet topics)
are only a copy of it for lag tools.

Row kinds: `ingest` (a batch read these offsets), `loss` (retention deleted these
offsets before they were read, and someone accepted it), `backfill` and `replay`
(committed offsets processed again; they never move where reading goes on), `seek`
(an operator moved where reading goes on, with the reason) and `abandon` (an operator
dropped an unfinished batch's plan; it read nothing).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from deltalake import DeltaTable

# The state is the ledger's: its users import it from here.
from strata.store._ledger_state import LedgerCommit as LedgerCommit
from strata.store._ledger_state import LedgerState as LedgerState
from strata.store._ledger_state import Mark as Mark
from strata.store._ledger_state import Traffic as Traffic
from strata.store._ledger_state import Vouched as Vouched
from strata.store._ledger_state import fold_rows as fold_rows
from strata.store._ledger_state import from_us as from_us
from strata.store._ledger_state import recorded as recorded
from strata.store._log_ids import PARTITION_IDS_KEY as PARTITION_IDS_KEY
from strata.store._log_ids import TOPIC_IDS_KEY as TOPIC_IDS_KEY
from strata.store._log_ids import LogIds as LogIds
from strata.store.delta import (
    BATCH_KEY,
    commit_files,
    create_with_files,
    newest_commit,
    open_table,
)
from strata.store.files import filesystem
from strata.store.identity import refuse_foreign
from strata.store.parquet import write_file
from strata.store.places import Places

# Commit metadata of the ledger: the data table's columns as each batch wrote them
# (the brokers' topic ids are `LogIds`').
COLUMNS_KEY = "strata.columns"
# The Avro schema a batch was read with, when its table follows its registry subject.
READER_SCHEMA_KEY = "strata.reader_schema"
# The state after the batch (`LedgerState.record`): where reading goes on and the
# watermark's facts, so a run reads one commit's info instead of every row.
STATE_KEY = "strata.state"
# How many of the newest commits are searched for the state: commits that record none
# (a compaction's, a maintenance fence) are few between two batches.
_STATE_SEARCH = 20
# The kinds of row that say where reading goes on, in batch order.
POSITION_KINDS = ("ingest", "seek")
READ_KINDS = ("ingest", "backfill", "replay")
"""Ledger kinds whose rows record offsets that were read (not a loss or a seek)."""

LEDGER_SCHEMA = pa.schema(
    [
        pa.field("pipeline", pa.string(), nullable=False),
        pa.field("batch", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("start_offset", pa.int64(), nullable=False),
        pa.field("end_offset", pa.int64(), nullable=False),
        pa.field("messages", pa.int64(), nullable=False),
        pa.field("rows", pa.int64(), nullable=False),
        pa.field("quarantined", pa.int64(), nullable=False),
        pa.field("gaps", pa.int64(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("late_rows", pa.int64(), nullable=False),
        pa.field("max_lateness_ms", pa.int64(), nullable=False),
        pa.field("min_event_time", pa.timestamp("us", tz="UTC")),
        pa.field("max_event_time", pa.timestamp("us", tz="UTC")),
        pa.field("high_watermark", pa.int64()),
        pa.field("committed_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("note", pa.string()),
        # Added after the first release: a ledger made before holds it from its next
        # batch on (`_evolve`), and its older rows read it as null.
        pa.field("skipped", pa.int64()),
    ]
)
"""The ledger's columns. A column added to it goes last, nullable, in `ADDED_COLUMNS` too."""

ADDED_COLUMNS = ("skipped",)
"""Columns the ledger gained after its first release: a ledger made before gains them."""


RUN_COLUMNS = [
    "batch",
    "kind",
    "topic",
    "partition",
    "end_offset",
    "messages",
    "bytes",
    "max_event_time",
    "high_watermark",
    "committed_at",
]
"""The ledger's columns a run reads of its newest batches: what an idle run's summary and
metrics show (lag trend, produce rate); where reading goes on is the state's."""


def read_ledger(places: Places, columns: list[str] | None = None) -> pa.Table:
    """Every ledger row of the pipeline (empty if nothing was committed yet).

    Args:
        places: The pipeline's places (its ledger, its name).
        columns: The columns to read; all of them if None.
    """
    table = open_table(places.ledger.uri, places.options)
    if table is None:
        empty = LEDGER_SCHEMA.empty_table()
        return empty if columns is None else empty.select(columns)
    return _rows(places, table, columns)


RECENT_BATCHES = 80
"""The batches `recent_ledger` reads: enough for a run's view of the newest batches (the
lag trend looks back over 64 ingest batches, the produce rate over 10)."""


def recent_ledger(
    places: Places, columns: list[str] | None = None, batches: int = RECENT_BATCHES
) -> pa.Table:
    """The ledger rows of the newest `batches` batches (empty if nothing was committed yet).

    Only the files that can hold them are read, told by their `batch` statistics: what a
    run reads of the ledger stays the same however many batches it holds.

    Args:
        places: The pipeline's places (its ledger, its name).
        columns: The columns to read; all of them if None.
        batches: How many of the newest batch numbers.
    """
    table = open_table(places.ledger.uri, places.options)
    if table is None:
        empty = LEDGER_SCHEMA.empty_table()
        return empty if columns is None else empty.select(columns)
    return _recent(places, table, columns, batches)


Opened = DeltaTable | None | Literal["open"]
"""A ledger its caller opened already (None: there is none yet), or "open" it here.

Opening the ledger loads its whole file list, a file per batch until `strata compact`:
a run opens it once and hands the handle to each step that reads it before its commit.
"""


def open_ledger(places: Places) -> DeltaTable | None:
    """The pipeline's ledger, opened at its newest version; None before its first batch."""
    return open_table(places.ledger.uri, places.options)


def _opened(places: Places, ledger: Opened) -> DeltaTable | None:
    return open_ledger(places) if isinstance(ledger, str) else ledger


def recent_state(
    places: Places, columns: list[str], ledger: Opened = "open"
) -> tuple[pa.Table, LedgerState]:
    """The newest batches' rows (`recent_ledger`) and the state (`ledger_state`) at once.

    One snapshot of the ledger serves both: a run opens its ledger once, which a
    pipeline routing to hundreds of tables does hundreds of times.

    Args:
        places: The pipeline's places (its ledger, its name).
        columns: The columns of the rows to read.
        ledger: The ledger, if opened already (`Opened`).
    """
    table = _opened(places, ledger)
    if table is None:
        return LEDGER_SCHEMA.empty_table().select(columns), LedgerState(0, {})
    # The last batch is read from the snapshot once, for both.
    last = table.transaction_version(places.pipeline) or 0
    return (
        _recent(places, table, columns, RECENT_BATCHES, last),
        _current_state(places, table, last=last),
    )


def _recent(
    places: Places,
    table: DeltaTable,
    columns: list[str] | None,
    batches: int,
    last: int | None = None,
) -> pa.Table:
    """The rows of the snapshot's newest `batches` batches (`last`: its last batch, if read)."""
    if last is None:
        last = table.transaction_version(places.pipeline) or 0
    since = last - batches
    return _rows(places, table, columns, ds.field("batch") > since, since)


def _rows(
    places: Places,
    table: DeltaTable,
    columns: list[str] | None = None,
    where: ds.Expression | None = None,
    after: int | None = None,
) -> pa.Table:
    """Rows of the ledger's current files, read as plain Parquet.

    The ledger has no partitions and one schema, so its files are read directly: a
    Delta dataset costs about a millisecond per file more to build, which a ledger of
    many small files (before `strata compact` merges them) pays on every run.

    Args:
        places: The pipeline's places.
        table: The ledger.
        columns: The columns to read; all of them if None.
        where: Which rows.
        after: Read only the files that may hold batches after this one: a batch's own
            file by its name (`ledger_file_prefix`); any other (a compaction's) is read.
    """
    fs, root = places.ledger.filesystem()
    paths = pa.table(table.get_add_actions()).column("path").to_pylist()
    if after is not None:
        # By name, not statistics: parsing every file's statistics costs more than the
        # read it saves, on a ledger of a file per batch.
        floor = ledger_file_prefix(after + 1)
        paths = [p for p in paths if not p.startswith("ledger-b") or p >= floor]
    found = ds.dataset(
        [f"{root}/{p}" for p in paths],
        schema=LEDGER_SCHEMA,
        format="parquet",
        filesystem=fs,
    )
    return found.to_table(columns=columns, filter=where)


def ledger_state(places: Places, rows: pa.Table | None = None) -> LedgerState:
    """The last committed batch, where reading goes on in every partition, and the watermark.

    Read from the newest ledger commit's info, which records the whole state after its
    batch (`STATE_KEY`): what a run reads stays the same however long the pipeline has
    run. A ledger whose newest batch recorded none (written before the state was
    recorded) is folded from its rows instead, until its next commit records it.

    Args:
        places: The pipeline's places (its ledger, its name).
        rows: The ledger, if already read; only used for a ledger without a recorded
            state.
    """
    table = open_table(places.ledger.uri, places.options)
    if table is None:
        return LedgerState(0, {})
    return _current_state(places, table, rows)


def _current_state(
    places: Places,
    table: DeltaTable,
    rows: pa.Table | None = None,
    last: int | None = None,
    recent: list[dict[str, Any]] | None = None,
) -> LedgerState:
    """The state as of the table's snapshot: recorded by its newest batch, else folded.

    `last` is the snapshot's last batch and `recent` its newest commits' infos
    (`recorded_state`), each if read already.
    """
    # A batch can be committed without rows (an abandoned plan of a pipeline that has
    # read nothing yet): its number is taken all the same.
    if last is None:
        last = table.transaction_version(places.pipeline) or 0
    recorded = recorded_state(table, last, recent)
    if recorded is not None:
        return recorded
    if rows is None:
        columns = [c for c in RUN_COLUMNS if c != "batch"]
        rows = _rows(places, table, ["batch", *columns])
    return fold_rows(rows, last)


def recorded_state(
    table: DeltaTable, last: int, recent: list[dict[str, Any]] | None = None
) -> LedgerState | None:
    """The state the ledger's batch `last` recorded in its commit, or None.

    None when no recent commit records a state, or the newest that does is of an older
    batch: a runner of an earlier version committed since, so the rows decide.

    Args:
        table: The ledger.
        last: The snapshot's last batch.
        recent: The snapshot's newest `_STATE_SEARCH` commits' infos, newest first, if
            read already (reading them lists the log, which grows with every commit).
    """
    for commit in table.history(_STATE_SEARCH) if recent is None else recent:
        if STATE_KEY in commit:
            state = LedgerState.from_record(recorded(commit, STATE_KEY))
            return state if state.last_batch == last else None
    return None


def batch_state(places: Places, batch: int, table: DeltaTable | None = None) -> LedgerState | None:
    """The state right after `batch`, as its ledger commit recorded it; None if it recorded
    none (or is not among the newest commits, which a run asks about).

    `table` is the ledger opened already, at a snapshot holding the batch's commit.
    """
    if table is None:
        table = open_table(places.ledger.uri, places.options)
    if table is None:
        return None
    found = newest_commit(table, lambda c: c.get(BATCH_KEY) == batch and STATE_KEY in c, False)
    return None if found is None else LedgerState.from_record(recorded(found, STATE_KEY))


def lag_after(rows: list[dict[str, Any]]) -> int | None:
    """Messages left behind the planned high watermarks by a batch's ingest rows.

    Args:
        rows: Ledger rows, each with `high_watermark` (None when unknown) and `end_offset`.

    Returns:
        The sum over rows whose watermark is known, or None if none is.
    """
    known = [r for r in rows if r["high_watermark"] is not None]
    if not known:
        return None
    return sum(max(int(r["high_watermark"]) - int(r["end_offset"]), 0) for r in known)


FIGURES = (
    "messages",
    "rows",
    "quarantined",
    "gaps",
    "skipped",
    "bytes",
    "late_rows",
    "max_lateness_ms",
)
"""A range's counts, as the ledger's columns, a batch's results (`RangeResult`) and the run
summary name them: every row holds offsets = rows + quarantined + skipped + gaps (skipped:
tombstones counted and left out, `on_tombstone: skip`)."""


class RangeFigures(Protocol):
    """What a batch's result for one range offers its ledger row (`RangeResult`), beside
    the counts named in `FIGURES`."""

    topic: str
    partition: int
    start: int
    end: int
    min_event_us: int | None
    max_event_us: int | None


def _row(
    kind: str, note: str | None, topic: str, partition: int, start: int, end: int
) -> dict[str, object]:
    """A ledger row's coordinates, with every count 0 and no event time."""
    return {
        "kind": kind,
        "note": note,
        "topic": topic,
        "partition": partition,
        "start_offset": start,
        "end_offset": end,
        **dict.fromkeys(FIGURES, 0),
        "min_event_time": None,
        "max_event_time": None,
        "high_watermark": None,
    }


def ledger_row(
    r: RangeFigures, watermarks: dict[str, int], kind: str = "ingest", note: str | None = None
) -> dict[str, object]:
    """A batch's ledger row for one partition.

    Args:
        r: The batch's result for the partition's range.
        watermarks: Each partition's high watermark when the batch was planned
            (`topic:partition`); the row records how far behind the log it ended.
        kind: `ingest`, `backfill` or `replay`.
        note: Why, where there is one to keep.
    """

    def ts(us: int | None) -> datetime | None:
        return None if us is None else datetime.fromtimestamp(us / 1_000_000, tz=UTC)

    row = _row(kind, note, r.topic, r.partition, r.start, r.end)
    row.update({name: getattr(r, name) for name in FIGURES})
    row["min_event_time"], row["max_event_time"] = ts(r.min_event_us), ts(r.max_event_us)
    row["high_watermark"] = watermarks.get(f"{r.topic}:{r.partition}")
    return row


def unread_row(
    kind: str, topic: str, partition: int, start: int, end: int, gaps: int, note: str
) -> dict[str, object]:
    """A ledger row for a range nothing was read from: a loss, a seek, an abandoned plan.

    Offsets that are gone or skipped count as gaps, so offsets = rows + quarantined +
    gaps holds for it as for every row.
    """
    row = _row(kind, note, topic, partition, start, end)
    row["gaps"] = gaps
    return row


def loss_row(topic: str, partition: int, start: int, end: int, note: str) -> dict[str, object]:
    """The ledger's record of offsets deleted by retention before they were read."""
    return unread_row("loss", topic, partition, start, end, end - start, note)


def commit_ledger(
    places: Places,
    batch: int,
    rows: list[dict[str, object]],
    columns: list[list[str]] | None = None,
    topic_ids: dict[str, str] | None = None,
    reader_schema: dict[str, Any] | None = None,
    partition_ids: dict[tuple[str, int], str] | None = None,
    ledger: DeltaTable | None = None,
    tables: Mapping[str, Vouched] | None = None,
) -> LedgerCommit | None:
    """Append a batch's rows to the ledger in one transaction, unless already there.

    Each attempt writes a file of its own name and commits it only if the ledger does
    not hold the batch yet (checked again inside the commit), so a paused runner
    waking up late can neither commit a batch twice nor overwrite the file another
    runner committed. Once the batch stands, other attempts' files of the batch are
    removed: the ledger of a plain Parquet pipeline is read as a directory too.

    Args:
        places: The pipeline's places (its ledger, its name).
        batch: The batch number.
        rows: Ledger rows without `pipeline`, `batch` and `committed_at`.
        columns: The data table's column signature the batch was written with; the
            next plan checks the schema against it.
        topic_ids: The brokers' id of each whole topic the batch checked (an ingest):
            every committed partition of it was found on that log.
        reader_schema: The Avro schema the batch was read with, when the table follows
            its Schema Registry subject; the next plan starts from it.
        partition_ids: The brokers' topic id of each partition the batch moved onto a
            log (a seek). Ids of topics and partitions the batch did not touch stay
            as the ledger recorded them (`LogIds.vouched`).
        ledger: The ledger as the caller holds it open, at the snapshot to build on;
            opened here if not given. Opening a Delta table loads its whole file list,
            a file per batch until `strata compact`: a caller committing batch after
            batch keeps one handle and brings it forward after each commit
            (`DeltaTable.update_incremental`). The checks are the same either way:
            the batch is looked for in that snapshot, and delta-rs refuses the commit
            if another batch's commit landed after it.
        tables: The tables the batch committed to (or fenced), as found after their
            commits (`strata.store.identity.vouch`): the state records them over what it
            held, so the next run can tell them from a table deleted or replaced since.

    Returns:
        The commit as it landed (its state and rows, so that the caller need not read
        them back), or None if the ledger already held the batch.
    """
    uri = places.ledger.uri
    table = open_table(uri, places.options) if ledger is None else ledger
    if table is not None and (table.transaction_version(places.pipeline) or 0) >= batch:
        return None
    now = datetime.now(UTC)
    full = [
        {"pipeline": places.pipeline, "batch": batch, "committed_at": now, "note": None, **r}
        for r in rows
    ]

    def metadata(table: DeltaTable | None) -> dict[str, object]:
        """The commit's metadata, read from the snapshot it builds on (None: no ledger)."""
        meta: dict[str, object] = {} if columns is None else {COLUMNS_KEY: columns}
        # The newest commits' infos are read once, for the ids and the state both.
        recent = None if table is None else table.history(_STATE_SEARCH)
        if topic_ids or partition_ids:
            # Read from the snapshot this commit builds on, not a table opened again.
            recorded = (None if table is None else _log_ids(table, recent)) or LogIds()
            meta.update(recorded.vouched(topic_ids or {}, partition_ids or {}).metadata())
        if reader_schema is not None:
            meta[READER_SCHEMA_KEY] = reader_schema
        # Folded from the state this commit builds on: another runner's commit landing
        # after this snapshot makes delta-rs refuse this one, so the state never skips a
        # batch. Before the ledger exists the state is that of an empty one.
        state = (
            LedgerState(0, {}) if table is None else _current_state(places, table, recent=recent)
        )
        made.append(state.after(batch, now, full).vouching(tables or {}).record())
        meta[STATE_KEY] = made[-1]
        return meta

    # The state each commit attempt records; the last one made is the one that lands.
    made: list[dict[str, Any]] = []
    # A batch with nothing to record (an abandoned first plan) still takes its number.
    files = []
    data = pa.Table.from_pylist(full, schema=LEDGER_SCHEMA)
    if full:
        fs, root = filesystem(uri, places.options)
        name = f"{ledger_file_prefix(batch)}{uuid.uuid4().hex[:12]}.parquet"
        # No statistics: the ledger is read by its files' names, never pruned by them,
        # and every open of it parses the whole file list's statistics (12 MB of JSON in
        # its checkpoint after 10,000 batches). Compaction knows a file's batch by name.
        files.append(replace(write_file(fs, root, name, data, {}), stats=None))
    committed = True
    if table is None:
        # Never where another table's files are (a ledger deleted by hand and something
        # else put there, or a table of another pipeline).
        refuse_foreign(places.ledger, places.pipeline, "ledger")
        # The first batch creates the ledger and commits its rows in one transaction.
        # None back: it did; a ledger back: another runner created it meanwhile.
        table = create_with_files(
            uri,
            LEDGER_SCHEMA,
            [],
            places.options,
            places.ledger.name,
            files,
            places.pipeline,
            batch,
            metadata(None),
        )
    if table is not None:
        _evolve(table)
        committed = commit_files(
            table, LEDGER_SCHEMA, [], files, places.pipeline, batch, metadata(table)
        )
    if files and (places.format == "parquet" or not committed):
        _remove_other_attempts(places, batch, keep=files[0].path if committed else None)
    if not committed:
        return None
    # Through JSON, as the commit info is read back (`batch_state`).
    return LedgerCommit(LedgerState.from_record(json.loads(json.dumps(made[-1]))), data)


def _evolve(table: DeltaTable) -> None:
    """Add the columns a ledger made by an earlier release lacks (`ADDED_COLUMNS`).

    Delta's schema evolution: a commit of the new nullable columns alone, before the
    batch's own, so every reader of the table (Spark, Trino, delta-rs) sees them and
    reads them as null in the files written before. Two runners may race to add them:
    the one that loses finds them added.
    """
    from deltalake import Field

    def missing() -> list[pa.Field]:
        have = {f.name for f in table.schema().fields}
        return [LEDGER_SCHEMA.field(name) for name in ADDED_COLUMNS if name not in have]

    wanted = missing()
    if not wanted:
        return
    try:
        table.alter.add_columns([Field.from_arrow(f) for f in wanted])
    except Exception:
        # Another runner added them first (delta-rs refuses a column that exists, or the
        # commit that raced it); anything else stays an error.
        table.update_incremental()
        if missing():
            raise


def ledger_file_prefix(batch: int) -> str:
    """How the names of a batch's ledger files begin."""
    return f"ledger-b{batch:010d}-"


def ledger_file_batch(path: str) -> int | None:
    """The batch a ledger file was written for, by its name; None for a compaction's."""
    name = path.rsplit("/", 1)[-1]
    digits = name[len("ledger-b") : len("ledger-b") + 10]
    if name.startswith("ledger-b") and digits.isdigit():
        return int(digits)
    return None


def _remove_other_attempts(places: Places, batch: int, keep: str | None) -> None:
    """Delete the batch's ledger files that its commit does not hold.

    It lists the ledger's folder, which grows by a file a batch until `strata compact`:
    a Delta pipeline's ledger is read through its log, so there it is called only by an
    attempt that lost, for its own file; other attempts' files are vacuum's. A plain
    Parquet pipeline's ledger is read as a directory too, and is cleared at every commit.
    """
    uri = places.ledger.uri
    table = open_table(uri, places.options)
    if table is None:
        return
    prefix = ledger_file_prefix(batch)
    held = {p for p in table.file_uris() if p.rsplit("/", 1)[-1].startswith(prefix)}
    held_names = {p.rsplit("/", 1)[-1] for p in held}
    if keep is not None:
        held_names.add(keep)
    fs, root = filesystem(uri, places.options)
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=False)):
        if info.base_name.startswith(prefix) and info.base_name not in held_names:
            fs.delete_file(info.path)


def committed_columns(
    places: Places, ledger: Opened = "open"
) -> tuple[int, list[list[str]]] | None:
    """The data table's columns as of the newest batch that recorded them, with its number.

    Returns:
        (batch, column signature), or None before the first batch (`ledger`: `Opened`).
    """
    return _newest_recorded(_opened(places, ledger), COLUMNS_KEY)


def committed_log_ids(places: Places, ledger: Opened = "open") -> LogIds | None:
    """Which log each partition's committed offsets belong to, as the newest record says.

    Returns:
        The map recorded by the newest batch that recorded one, or None before any did
        (`ledger`: `Opened`).
    """
    table = _opened(places, ledger)
    return None if table is None else _log_ids(table)


def _log_ids(table: DeltaTable, recent: list[dict[str, Any]] | None = None) -> LogIds | None:
    """The newest recorded map: among `recent` (the newest commits' infos) if given and
    one records it, else searched for in the log."""
    commit = next((c for c in recent or [] if TOPIC_IDS_KEY in c), None)
    if commit is None:
        commit = newest_commit(table, lambda c: TOPIC_IDS_KEY in c)
    return None if commit is None else LogIds.from_commit(commit)


def batch_log_ids(places: Places, batches: Collection[int]) -> dict[int, LogIds]:
    """The maps of log ids as the given batches recorded them (those that recorded one).

    The ledger's history is read once, whatever the number of batches asked about.
    """
    table = open_table(places.ledger.uri, places.options)
    wanted = set(batches)
    if table is None or not wanted:
        return {}
    return {
        int(commit[BATCH_KEY]): LogIds.from_commit(commit)
        for commit in table.history()
        if commit.get(BATCH_KEY) in wanted and TOPIC_IDS_KEY in commit
    }


def committed_reader_schema(places: Places) -> tuple[int, dict[str, Any]] | None:
    """The Avro schema the newest batch that recorded one was read with, with its number.

    Returns:
        (batch, schema), or None before any batch recorded one.
    """
    return _newest_recorded(open_ledger(places), READER_SCHEMA_KEY)


def _newest_recorded(table: DeltaTable | None, key: str) -> tuple[int, Any] | None:
    if table is None:
        return None
    commit = newest_commit(table, lambda c: key in c)
    return None if commit is None else (int(commit[BATCH_KEY]), recorded(commit, key))
