"""Names and places: the one owner of where each of a pipeline's tables lives and its name.

A pipeline owns five tables per table it writes (the data, the raw copy, the
quarantine, the ledger and the quality results) and a state location (plans, leases,
locks); a pipeline that routes its topics to tables owns that set for each table.
`Places` holds all of them for one pipeline (or one routed table): each table's
location, format, storage options and name in the metastore (`TableRef`), and the
state's location and lock (`StatePlaces`). The entry points build it once from the
configuration (`PipelineConfig.places`); the modules below the conductor take it, one
table's reference, or the plain values they need, never the whole configuration.

One namespace: two owners of one place would destroy each other's data (a plain
Parquet table's commit removes the files it takes for another attempt's, and a Delta
table would hold two tables' rows), and two owners of one metastore name would point
Trino at one of them. So a place (a location equal to, or inside, another's) and a
metastore name (in the same metastore and database) have one owner among:

- the tables of one pipeline, routed tables included (`topics` listed by name are
  routed when the configuration loads);
- the pipelines of one configuration directory that share a warehouse or a metastore
  database (`strata.config.load_pipeline` checks a pipeline against the others);
- the tables a pattern matches on the brokers as a run goes (`strata.operations.routes`):
  a table that would clash fails alone, named, and the other tables run.

Every table's name in the metastore is its pipeline's (or routed table's) name and
the suffix below; its default location, relative to the warehouse, is the same.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import pyarrow.fs as pafs

Role = Literal["table", "raw", "quarantine", "ledger", "quality", "state"]
ROLES: tuple[Role, ...] = ("table", "raw", "quarantine", "ledger", "quality", "state")
TABLE_ROLES: tuple[Role, ...] = ("table", "raw", "quarantine", "ledger", "quality")
"""The roles that are tables (the quality's is the folder its results live in)."""
TableFormat = Literal["delta", "parquet", "iceberg"]

DATABASE_DESCRIPTION = "Tables landed from Kafka by Strata"
"""The description of the metastore database a pipeline's tables are registered in."""
TableName = Literal["table", "raw", "quarantine"]
"""The tables a batch writes: the data, the raw copy of every message, the quarantine."""

NAME_SUFFIXES: dict[Role, str] = {
    "table": "",
    "raw": "_raw",
    "quarantine": "_quarantine",
    "ledger": "_ledger",
    "quality": "_quality",
}
"""Each table's name, in the metastore and as its default location: the owner's and this."""

_WHAT: dict[Role, str] = {
    "table": "the data table",
    "raw": "the raw copy",
    "quarantine": "the quarantine",
    "ledger": "the ledger",
    "quality": "the quality results",
    "state": "the state (plans, leases)",
}
LOCATION_KEYS: dict[Role, str] = {
    "table": "table",
    "raw": "raw_table",
    "quarantine": "quarantine_table",
    "ledger": "ledger_table",
    "quality": "quality.location",
    "state": "state_dir",
}
"""The configuration key that moves each table (relative to the warehouse, absolute, or s3://)."""


@dataclass(frozen=True)
class OwnedTable:
    """One table (or the state) a pipeline owns: where it lives and its metastore name.

    Attributes:
        pipeline: The pipeline whose configuration file names it.
        owner: The pipeline, or `pipeline:table` for a routed table.
        role: Which of the owner's tables it is.
        location: Its location, resolved (a local path or an `s3://` URI).
        metastore: `(metastore uri, database, name)` it is registered under, or None
            for the state, or when the pipeline registers nothing.
        topics: For a routed table, the topics routed to it (for messages).
    """

    pipeline: str
    owner: str
    role: Role
    location: str
    metastore: tuple[str, str, str] | None
    topics: tuple[str, ...] = ()

    def describe(self) -> str:
        """The table in words, naming its owner (and topics, for a routed table)."""
        routed = f" (topic {', '.join(f'`{t}`' for t in self.topics)})" if self.topics else ""
        kind = "table" if ":" in self.owner else "pipeline"
        return f"{_WHAT[self.role]} of {kind} `{self.owner}`{routed}"

    def fix(self, place: bool, name: bool) -> str:
        """The keys that would give this table another place or name.

        Args:
            place: Whether its place clashes.
            name: Whether its metastore name clashes.
        """
        file = f"{self.pipeline}.yaml"
        if self.topics:
            # A routed table's places and names all follow from the table's name.
            first = self.topics[0]
            table = self.owner.split(":")[-1]
            return (
                f"name the table of topic `{first}` with `routing.tables` in {file} (e.g. "
                f"`{first}: {table}_events`)"
            )
        ways = []
        if name:
            ways.append(
                f"rename pipeline `{self.pipeline}` (its file), or register it in another "
                f"`metastore.database` in {file}"
            )
        if place:
            ways.append(f"move {_WHAT[self.role]} with `{LOCATION_KEYS[self.role]}` in {file}")
        return " and ".join(ways)


def owned_tables(
    pipeline: str,
    table: str | None,
    locations: dict[Role, str],
    metastore: tuple[str, str] | None,
    topics: Iterable[str] = (),
) -> list[OwnedTable]:
    """The tables (and state) of one pipeline, or of one table of a routed pipeline.

    Args:
        pipeline: The pipeline whose file names them.
        table: The routed table they belong to, or None for the pipeline's own.
        locations: Each role's resolved location.
        metastore: `(metastore uri, database)` the tables are registered in, or None.
        topics: For a routed table, the topics routed to it.

    Returns:
        One per role given.
    """
    owner = pipeline if table is None else f"{pipeline}:{table}"
    name = pipeline if table is None else table
    return [
        OwnedTable(
            pipeline,
            owner,
            role,
            location,
            None
            if metastore is None or role == "state"
            else (*metastore, name + NAME_SUFFIXES[role]),
            tuple(sorted(topics)),
        )
        for role, location in locations.items()
    ]


class Namespace:
    """Tables indexed by place and by metastore name, to find a table's clashes at once.

    Args:
        tables: The tables already owned.
    """

    def __init__(self, tables: Iterable[OwnedTable]) -> None:
        self._by_location: dict[str, list[OwnedTable]] = {}
        self._by_name: dict[tuple[str, str, str], list[OwnedTable]] = {}
        for t in tables:
            self._by_location.setdefault(t.location.rstrip("/"), []).append(t)
            if t.metastore is not None:
                self._by_name.setdefault(t.metastore, []).append(t)
        self._locations = sorted(self._by_location)

    def _near(self, location: str) -> Iterator[OwnedTable]:
        """Tables at `location`, above it, or inside it."""
        location = location.rstrip("/")
        parts = location.split("/")
        for end in range(1, len(parts) + 1):
            yield from self._by_location.get("/".join(parts[:end]), [])
        below = location + "/"
        at = bisect.bisect_left(self._locations, below)
        while at < len(self._locations) and self._locations[at].startswith(below):
            yield from self._by_location[self._locations[at]]
            at += 1

    def clashing(self, table: OwnedTable) -> list[tuple[OwnedTable, bool, bool]]:
        """The tables that clash with `table`: each, and whether by place, by name."""
        found: dict[tuple[str, str], list[bool]] = {}
        others: dict[tuple[str, str], OwnedTable] = {}
        for other in self._near(table.location):
            key = (other.owner, other.role)
            if key != (table.owner, table.role):
                others[key] = other
                found.setdefault(key, [False, False])[0] = True
        if table.metastore is not None:
            for other in self._by_name.get(table.metastore, []):
                key = (other.owner, other.role)
                if key != (table.owner, table.role):
                    others[key] = other
                    found.setdefault(key, [False, False])[1] = True
        return [(others[k], place, name) for k, (place, name) in sorted(found.items())]

    def clashes(self, tables: Iterable[OwnedTable]) -> list[str]:
        """Every clash of the given tables with those indexed here, in words.

        Each names both owners, what they share, and the keys that would part them;
        a pair found from both sides is told once.
        """
        told: set[frozenset[tuple[str, str]]] = set()
        out = []
        for a in tables:
            for b, place, name in self.clashing(a):
                pair = frozenset({(a.owner, a.role), (b.owner, b.role)})
                if pair in told:
                    continue
                told.add(pair)
                out.append(describe_clash(a, b, place, name))
        return out


def describe_clash(a: OwnedTable, b: OwnedTable, place: bool, name: bool) -> str:
    """Two tables that clash, what they share, and the keys that would part them."""
    shared = []
    if place:
        shared.append(
            f"both at {a.location}"
            if a.location == b.location
            else f"one inside the other ({a.location}, {b.location})"
        )
    if name and a.metastore is not None:
        shared.append(f"both named {a.metastore[1]}.{a.metastore[2]} in the metastore")
    return (
        f"{a.describe()} and {b.describe()} are {' and '.join(shared)}: each would destroy "
        f"or mix the other's data. To part them, {a.fix(place, name)}; or {b.fix(place, name)}"
    )


@dataclass(frozen=True)
class TableRef:
    """Where one of a pipeline's tables lives, how to reach it, and its name.

    Attributes:
        uri: The table's location: a local path or an `s3://` URI.
        format: `delta`, `parquet` for plain Parquet directories, or `iceberg`.
        options: Storage options (credentials, endpoint) for the object store.
        name: Its name in the metastore (and in its Delta metadata).
        metastore: `(metastore uri, database)` of its catalog, for an Iceberg table
            (whose metastore entry is the table's pointer to its metadata); None if
            the pipeline has no metastore.
    """

    uri: str
    format: TableFormat
    options: dict[str, str] = field(default_factory=dict, repr=False)
    name: str = ""
    metastore: tuple[str, str] | None = None

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """The table's file system, and its root path on it."""
        from strata.store.files import filesystem

        return filesystem(self.uri, self.options)


@dataclass(frozen=True)
class StatePlaces:
    """Where a pipeline keeps its plans, and how its runs hold the pipeline.

    Attributes:
        uri: The state location (`state_dir`): a local path or an `s3://` URI.
        options: Storage options for the object store.
        lock_path: The run lock's file, where the state is local; None where runs hold
            a lease in the store instead (under `<uri>/lease/`).
        lease_s: How long a lease lasts without renewal (`lock_lease`).
        lock_dir: `lock_dir` as configured, which a lease does not use (for the warning).
    """

    uri: str
    options: dict[str, str] = field(default_factory=dict, repr=False)
    lock_path: Path | None = None
    lease_s: float = 120.0
    lock_dir: str | None = None


@dataclass(frozen=True)
class Places:
    """Every place and name of one pipeline (or one table of a routed pipeline).

    Attributes:
        pipeline: The pipeline's (or routed table's) name: the Delta app id of its
            commits, the ledger's key, the name its tables' names begin with.
        route_of: The routed pipeline this is a table of, or None.
        format: The data, raw and quarantine tables' format (the ledger is Delta).
        refs: Each table's reference: `table`, `raw`, `quarantine`, `ledger`, and
            `quality` (the folder of the quality results, Data Docs and page).
        state: Where plans, leases and locks are.
        metastore: `(metastore uri, database)` the tables are registered in, or None.
    """

    pipeline: str
    route_of: str | None
    format: TableFormat
    refs: Mapping[Role, TableRef]
    state: StatePlaces
    metastore: tuple[str, str] | None = None

    def table(self, which: Role) -> TableRef:
        """One table's reference."""
        return self.refs[which]

    @property
    def ledger(self) -> TableRef:
        """The ledger's reference."""
        return self.refs["ledger"]

    @property
    def options(self) -> dict[str, str]:
        """The storage options every table and the state share."""
        return self.state.options

    @property
    def database(self) -> str | None:
        """The metastore database the tables are registered in, or None."""
        return None if self.metastore is None else self.metastore[1]

    def local(self) -> list[tuple[Role, str]]:
        """The tables and state that live on this host's file system (no URL scheme)."""
        roles: tuple[Role, ...] = ("table", "raw", "quarantine", "ledger")
        found: list[tuple[Role, str]] = [(role, self.refs[role].uri) for role in roles]
        found.append(("state", self.state.uri))
        return [(role, uri) for role, uri in found if "://" not in uri or uri.startswith("file://")]

    def shared_storage_error(self, master: str) -> str | None:
        """Why these tables cannot be written by the executors of a Spark `master`, or None.

        Executors on other hosts write the tables' files: a path on the driver's disk
        would scatter them over the executors' disks, where no commit and no reader
        finds them.
        """
        local = self.local()
        if master.startswith("local") or not local:
            return None
        role, uri = local[0]
        return (
            f"the {role} location {uri!r} is a local path, but Spark master {master!r} runs "
            "executors on other hosts, which cannot write it. Put `warehouse` on shared "
            "storage (s3://bucket/prefix, or STRATA_WAREHOUSE), or use a local[N] master"
        )

    def owned(self, topics: Iterable[str] = ()) -> list[OwnedTable]:
        """Its tables and state as the namespace sees them (see the module docstring).

        Args:
            topics: For a routed table, the topics routed to it (for messages).
        """
        locations = {role: ref.uri for role, ref in self.refs.items()}
        return owned_tables(
            self.route_of or self.pipeline,
            self.pipeline if self.route_of else None,
            {**locations, "state": self.state.uri},
            self.metastore,
            topics,
        )
