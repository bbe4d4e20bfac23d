"""Table identities: the ledger and the tables vouch for each other.

Operators change a lakehouse outside Strata: a table's directory removed, an Iceberg
table dropped or renamed in the metastore, another table created at the same place,
a ledger restored from an old copy. A run that went on would create a new table
holding only the batches after the edit, while the ledger still counts the earlier
ones as landed: data lost without a word.

So each table has an identity, and the ledger records it with each batch committed to
the table (`strata.store.ledger.Vouched`):

- Delta: the table's `metaData.id`, fixed when its log is created;
- Iceberg: the table's UUID, fixed when its first metadata file is written;
- plain Parquet: a marker file Strata writes at the table's root when its first batch
  is written (`_strata_table.json`; readers skip names that begin with `_`).

Every run with something to read, every ledger edit, backfill and replay, and `strata
status` compare the tables with what the ledger holds (`table_problems`); a run with
nothing new writes nothing, and opens no table. A table gone, replaced by another,
older than the batches it was vouched for, or not the pipeline's at all stops the run
before anything is read or written, naming the table, what the ledger holds and the
ways out. The
tables vouch for the ledger in turn: a table holding batches the ledger has no record
of means the ledger is gone or older than the tables.

A table is never created where another one's files are (`foreign_files`): another
table's log, metadata or marker, or files Strata did not write, stop the creation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import pyarrow.fs as pafs

from strata.errors import StorageError, TableMismatch
from strata.store._ledger_state import LedgerState, Vouched
from strata.store.files import put_if_absent, read_object
from strata.store.parquet import file_batch, is_compaction_file
from strata.store.places import LOCATION_KEYS

if TYPE_CHECKING:
    from strata.store.places import Places, Role, TableName, TableRef

MARKER = "_strata_table.json"
"""A plain Parquet table's identity marker, at its root."""

WRITTEN: tuple[TableName, ...] = ("raw", "quarantine", "table")
"""The tables a batch writes, whose identities the ledger records."""

_WHAT = {"raw": "raw copy", "quarantine": "quarantine", "table": "data table", "ledger": "ledger"}
# How many of a location's unknown files a refusal names.
_NAMED = 3


@dataclass(frozen=True)
class Found:
    """A table as it stands now at its place and name.

    Attributes:
        identity: Its identity (`delta:<id>`, `iceberg:<uuid>`, `parquet:<id>`), or None
            where no table stands.
        batch: The newest batch of the pipeline it holds (None: plain Parquet, which
            has no log to tell).
        holds_rows: Whether it holds any file at all.
        note: What else an operator should know of it (a metastore entry whose
            metadata is gone, the name a renamed table has now).
    """

    identity: str | None
    batch: int | None = None
    holds_rows: bool = False
    note: str = ""


def find(ref: TableRef, pipeline: str, table: Any = None) -> Found:  # noqa: ANN401
    """The table at `ref` as it stands: its identity, newest batch and whether it holds files.

    Args:
        ref: The table.
        pipeline: Whose batches count.
        table: The Delta or Iceberg table opened already; without, it is opened.
    """
    if ref.format == "delta":
        from strata.store.delta import open_table

        delta = table if table is not None else open_table(ref.uri, ref.options)
        if delta is None:
            return Found(None)
        batch = delta.transaction_version(pipeline) or 0
        # Whether it holds files matters only for a table that holds no batch of ours
        # (another's); listing them costs on a table of many files.
        return Found(f"delta:{delta.metadata().id}", batch, batch == 0 and bool(delta.file_uris()))
    if ref.format == "iceberg":
        return _find_iceberg(ref, pipeline, table)
    marker = _read_marker(ref)
    return Found(None if marker is None else f"parquet:{marker['id']}", None, marker is not None)


def _find_iceberg(ref: TableRef, pipeline: str, table: Any) -> Found:  # noqa: ANN401
    from strata.store import iceberg

    if table is None:
        try:
            table = iceberg.open_table(ref)
        except TableMismatch:
            # The metastore names the table, but its metadata file is gone: its files
            # were deleted under it.
            return Found(None, note="the metastore's entry points at metadata that is gone")
        if table is None:
            return Found(None)
    snapshot = table.current_snapshot()
    files = (
        0
        if snapshot is None or snapshot.summary is None
        else snapshot.summary.get("total-data-files", "0")
    )
    # The batch the current snapshot holds, not the property of the newest one: a table
    # rolled back to an older snapshot keeps its properties, but not the later rows.
    held = iceberg.current_batch(table, pipeline)
    return Found(
        f"iceberg:{table.metadata.table_uuid}",
        held if held is not None else iceberg.committed_batch(table, pipeline) or 0,
        int(files or 0) > 0,
    )


def _read_marker(ref: TableRef) -> dict[str, Any] | None:
    data = read_object(f"{ref.uri.rstrip('/')}/{MARKER}", ref.options)
    if data is None:
        return None
    try:
        found = json.loads(data)
        return found if isinstance(found, dict) and isinstance(found.get("id"), str) else None
    except ValueError:
        return None


def mark_parquet_table(ref: TableRef, pipeline: str, role: str, batch: int) -> str:
    """A plain Parquet table's identity, its marker written first if it has none.

    The marker is created only if absent, so of two runners writing a table's first
    batch, one marker lands and both read it. A place holding files Strata did not
    write is refused (`foreign_files`).

    Args:
        ref: The table.
        pipeline: The pipeline (or routed table) it belongs to.
        role: Which of its tables it is.
        batch: The batch that writes it first.

    Raises:
        TableMismatch: If another table's files are at its place.
    """
    marker = _read_marker(ref)
    if marker is None:
        refuse_foreign(ref, pipeline, role)
        body = {
            "id": f"{pipeline}-{role}-b{batch}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%f')}",
            "pipeline": pipeline,
            "role": role,
            "batch": batch,
        }
        put_if_absent(f"{ref.uri.rstrip('/')}/{MARKER}", ref.options, json.dumps(body).encode())
        marker = _read_marker(ref)
        if marker is None:
            raise StorageError(f"{ref.uri}/{MARKER}: written but cannot be read back")
    return f"parquet:{marker['id']}"


def foreign_files(ref: TableRef) -> list[str]:
    """Files at the table's place that no Strata batch or compaction wrote (a few of them).

    Another table's log (`_delta_log/`), metadata (`metadata/`) or marker, or any
    other file: a new table there would mix with it, and its maintenance would delete
    what the other still names.
    """
    fs, root = ref.filesystem()
    try:
        if fs.get_file_info(root).type == pafs.FileType.NotFound:
            return []
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    except OSError as exc:
        raise StorageError(f"{ref.uri}: the table's place cannot be listed: {exc}") from exc
    found = []
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        name = info.base_name
        path = info.path[len(root) :].lstrip("/")
        if file_batch(name) is not None or is_compaction_file(name):
            continue
        if ref.format == "delta" and path.startswith("_delta_log/"):
            # A log holding a commit is a table, opened as one (and found there): what
            # is left without one is an unfinished write's temporary file.
            continue
        if ref.format == "parquet" and path.startswith("_locations/"):
            continue
        if ref.format == "iceberg" and path.startswith("metadata/") and _unfinished(fs, info):
            continue
        found.append(path)
        if len(found) >= _NAMED:
            break
    return found


def _unfinished(fs: pafs.FileSystem, info: pafs.FileInfo) -> bool:
    """Whether an Iceberg metadata file names no snapshot: a creation cut short names no
    file either, and a new table may stand where it is."""
    if not info.base_name.endswith(".metadata.json"):
        return False
    try:
        with fs.open_input_stream(info.path) as stream:
            body = json.loads(stream.read())
    except (OSError, ValueError):
        return False
    return isinstance(body, dict) and not body.get("snapshots")


def refuse_foreign(ref: TableRef, pipeline: str, role: str) -> None:
    """Stop before creating a table where another one's files are.

    Raises:
        TableMismatch: Naming the place, what is there and the ways out.
    """
    other = foreign_files(ref)
    if other:
        raise TableMismatch(
            f"the {_WHAT.get(role, role)} of pipeline {pipeline} would be created at "
            f"{ref.uri}, which holds another table's files ({', '.join(other)}); nothing was "
            "created or read. Point the table elsewhere (its location key in the pipeline's "
            "file), or move those files away if they are no table's"
        )


def vouch(places: Places, tables: Mapping[TableName, Any], batch: int) -> dict[str, Vouched]:
    """What the ledger is to record of the tables a batch committed to, found after the commits.

    Args:
        places: The pipeline's places.
        tables: The tables committed (or fenced), each by its role; a Delta or Iceberg
            handle at the snapshot after the commit, or None to open it.
        batch: The batch they hold now.
    """
    out: dict[str, Vouched] = {}
    for role, table in tables.items():
        found = find(places.table(role), places.pipeline, table)
        if found.identity is not None:
            out[role] = Vouched(found.identity, batch)
    return out


Problem = Literal["gone", "replaced", "older", "foreign", "ahead"]


@dataclass(frozen=True)
class TableProblem:
    """A table that is not the one the ledger's batches went to.

    Attributes:
        role: Which table (`raw`, `quarantine`, `table`; `ledger` for a ledger behind
            the tables).
        problem: `gone`, `replaced`, `older` (a copy older than its batches), `foreign`
            (a table that is not the pipeline's), or `ahead` (it holds batches the
            ledger does not).
        text: The problem in words, naming the table and what the ledger holds.
        left: For a table that is gone, what is left of it: `renamed` (it stands
            under another name), `dropped` (an Iceberg table's metadata is at its place),
            or empty.
    """

    role: Role
    problem: Problem
    text: str
    left: str = ""


def table_problems(
    places: Places,
    state: LedgerState,
    tables: Mapping[TableName, Any] | None = None,
    rebuilding: tuple[str, ...] = (),
    found_out: dict[str, Found] | None = None,
) -> list[TableProblem]:
    """Each of the pipeline's tables that is not the one the ledger vouches for.

    Args:
        places: The pipeline's places.
        state: What the ledger says now.
        tables: Delta or Iceberg tables opened already, by role.
        rebuilding: Tables an unfinished recorded rebuild is making afresh.
        found_out: Filled with each table as found, by role, for the caller.

    Returns:
        The problems, in the order the tables are committed; empty when all is well.
    """
    out = []
    # A batch that read no message (the first of `starting_offsets: latest`) made no table.
    read_any = any(t.messages for t in state.traffic.values())
    for role in WRITTEN:
        if role in rebuilding:
            continue
        ref = places.table(role)
        found = find(ref, places.pipeline, (tables or {}).get(role))
        if found_out is not None:
            found_out[role] = found
        what = f"the {_WHAT[role]} of {places.pipeline} ({_place(ref)})"
        vouched = state.tables.get(role)
        held = f"the ledger holds batches up to {state.last_batch}"
        if vouched is not None and vouched.identity:
            since = f"batch {vouched.batch} was committed to {vouched.identity}"
            if found.identity is None:
                note, left = _gone(ref, found)
                gone = f"{what} is gone{note}; {held}, and {since}"
                out.append(TableProblem(role, "gone", gone, left))
            elif found.identity != vouched.identity:
                # Another table of this pipeline's own (made afresh after the old one was
                # deleted), or one that is not the pipeline's at all.
                theirs = found.batch == 0 and found.holds_rows
                out.append(
                    TableProblem(
                        role,
                        "foreign" if theirs else "replaced",
                        f"{what} is another table ({found.identity}) than the one {since}; {held}"
                        + (f", and it holds no batch of {places.pipeline}" if theirs else ""),
                    )
                )
            elif found.batch is not None and found.batch < vouched.batch:
                out.append(
                    TableProblem(
                        role,
                        "older",
                        f"{what} holds batches up to {found.batch} only, but {since}: it is an "
                        "older copy, and the rows of the later batches are not in it",
                    )
                )
        elif found.identity is None:
            if read_any and role in _ALWAYS_MADE[places.format]:
                # A ledger recorded before tables were vouched for: the table was made by
                # the first batch that read anything, and is gone now.
                note, left = _gone(ref, found)
                out.append(TableProblem(role, "gone", f"{what} is gone{note}; {held}", left))
            elif state.last_batch == 0:
                # Before the first batch: its tasks would write their files beside another
                # table's, and its commit would create a table among them.
                other = foreign_files(ref)
                if other:
                    out.append(
                        TableProblem(
                            role,
                            "foreign",
                            f"{what} is not made yet, and its place holds another table's "
                            f"files ({', '.join(other)})",
                        )
                    )
        elif found.batch == 0 and found.holds_rows:
            out.append(
                TableProblem(
                    role,
                    "foreign",
                    f"{what} is a table that holds files but no batch of {places.pipeline}: "
                    "another table stands at its place or name",
                )
            )
        if found.batch is not None and found.batch > state.last_batch + 1:
            out.append(
                TableProblem(
                    "ledger",
                    "ahead",
                    f"{what} holds batch {found.batch}, but {places.pipeline}'s ledger "
                    f"({_place(places.ledger)}) "
                    + (
                        "holds none: the ledger is gone"
                        if state.last_batch == 0
                        else f"ends at batch {state.last_batch}: it is older than the tables"
                    ),
                )
            )
    return out


# The tables every batch that read a message made, by format: a plain Parquet table's
# marker was not written before tables were vouched for, so only its raw copy (which
# holds every message read) tells that a ledger's batches landed somewhere.
_ALWAYS_MADE = {
    "delta": ("raw", "quarantine", "table"),
    "iceberg": ("raw", "quarantine", "table"),
    "parquet": (),
}


def _gone(ref: TableRef, found: Found) -> tuple[str, str]:
    """What is known of a table that is gone, in words, and what is left of it.

    Returns:
        The note (empty, or in parentheses), and `renamed` (a table at its place has
        another name in the metastore), `dropped` (its metadata is still at its place)
        or empty.
    """
    notes = [found.note] if found.note else []
    left = ""
    if ref.format == "iceberg" and not found.note:
        from strata.store import iceberg_entries

        others = iceberg_entries.named_elsewhere(ref)
        if others:
            left = "renamed"
            notes.append(
                f"a table at its place is in the metastore as {', '.join(others)} now: "
                "renamed? Rename it back"
            )
        elif iceberg_entries.metadata_files(ref):
            left = "dropped"
            notes.append("its metadata and files are still at its place: dropped in the metastore?")
    return (f" ({'; '.join(notes)})" if notes else ""), left


def _place(ref: TableRef) -> str:
    where = ref.uri
    if ref.format == "iceberg" and ref.metastore is not None:
        return f"`{ref.metastore[1]}.{ref.name}` at {where}"
    return where


def check_tables(
    places: Places,
    state: LedgerState,
    tables: Mapping[TableName, Any] | None = None,
    rebuilding: tuple[str, ...] = (),
) -> int:
    """Stop when a table is not the one the ledger vouches for (`table_problems`).

    Returns:
        The newest batch of the pipeline any table holds (0 if none tells).

    Raises:
        TableMismatch: Naming each table, what the ledger holds, and the ways out.
    """
    found: dict[str, Found] = {}
    problems = table_problems(places, state, tables, rebuilding, found)
    if problems:
        raise TableMismatch(describe(places, problems))
    return max((f.batch or 0 for f in found.values()), default=0)


def describe(places: Places, problems: list[TableProblem]) -> str:
    """The problems and the ways out, as a stop says them."""
    lines = [f"pipeline {places.pipeline}: nothing was read or written."]
    lines += [f"  {p.text}." for p in problems]
    lines.append("  Ways out:")
    lines += [f"  - {way}" for way in ways_out(places, problems)]
    return "\n".join(lines)


def ways_out(places: Places, problems: list[TableProblem]) -> list[str]:
    """What an operator can do about the problems, each a command or a step."""
    name = places.pipeline
    ways = []
    if any(p.role == "ledger" for p in problems):
        ways.append(
            f"restore the ledger ({places.ledger.uri}) from a copy that holds every batch the "
            "tables hold, then run again"
        )
    tables = [p for p in problems if p.role != "ledger"]
    for p in tables:
        if p.left == "renamed":
            ways.append(f"rename the {_WHAT[p.role]} back to its name, then run again")
        elif p.left == "dropped":
            ways.append(
                f"register the {_WHAT[p.role]} again from its own newest metadata file: "
                f"`strata ledger restore --pipeline {name} --table {p.role}`"
            )
        elif p.problem == "foreign":
            ways.append(
                f"point the {_WHAT[p.role]} elsewhere (`{LOCATION_KEYS[p.role]}` in the "
                "pipeline's file, or another metastore name), or move the other table away"
            )
    # What is left of a renamed or dropped table is another table's files at its place:
    # nothing may be created there, so neither a rebuild nor a reset can help.
    lost = [p for p in tables if not p.left and p.problem != "foreign"]
    roles = sorted({p.role for p in lost})
    if lost:
        ways.append(
            "restore the table from a copy (or the store's object versions) at its place, "
            "then run again"
        )
        if set(roles) <= {"table", "quarantine"} and places.format != "parquet":
            # A plain Parquet table cannot replace a range's rows, so it cannot be replayed.
            ways.append(
                f"rebuild the data table and the quarantine from the raw copy: `strata replay "
                f"--pipeline {name} --rebuild --reason TEXT` (a recorded replay of every batch "
                "into new tables)"
            )
        ways.append(
            f"accept the loss: `strata ledger reset --pipeline {name} --table "
            f"{'|'.join(roles)} --reason TEXT` records it in the ledger and starts the table "
            "afresh; the rows of the earlier batches are not in it"
        )
    return ways
