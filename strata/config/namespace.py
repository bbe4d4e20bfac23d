"""One namespace of tables: every table a pipeline owns has one owner, by place and by name.

A pipeline owns five tables per table it writes (the data, the raw copy, the
quarantine, the ledger and the quality results) and a state location (plans, leases,
locks). A pipeline that routes its topics to tables owns that set for each table. Two
owners of one place would destroy each other's data: a plain Parquet table's commit
removes the files it takes for another attempt's, and a Delta table would hold two
tables' rows. Two owners of one metastore name would point Trino at one of them.

So a place (a location equal to, or inside, another's) and a metastore name (in the
same metastore and database) have one owner among:

- the tables of one pipeline, routed tables included (`topics` listed by name are
  routed when the configuration loads);
- the pipelines of one configuration directory that share a warehouse or a metastore
  database (`strata.config.load_pipeline` checks a pipeline against the others);
- the tables a pattern matches on the brokers as a run goes (`strata.routes`): a
  table that would clash fails alone, named, and the other tables run.

Every table's name in the metastore is its pipeline's (or routed table's) name and
the suffix below; its default location, relative to the warehouse, is the same.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

Role = Literal["table", "raw", "quarantine", "ledger", "quality", "state"]
ROLES: tuple[Role, ...] = ("table", "raw", "quarantine", "ledger", "quality", "state")

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
# The key that moves each table (relative to the warehouse, absolute, or s3://).
_LOCATION_KEY: dict[Role, str] = {
    "table": "table",
    "raw": "raw_table",
    "quarantine": "quarantine_table",
    "ledger": "ledger_table",
    "quality": "quality.location",
    "state": "state_dir",
}


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
            ways.append(f"move {_WHAT[self.role]} with `{_LOCATION_KEY[self.role]}` in {file}")
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
