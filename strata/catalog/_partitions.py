"""The data table's partitions in the metastore: what storage holds, and what changed.

Registration (`strata.catalog.register`) adds the partitions storage holds and the
metastore lacks, and corrects those moved or completed since its last run. This module
finds them: the partitions on storage from the directory names, the compacted ones a
marker moved since, the registered ones fetched a batch of names per call, and the
record (`Since`) a registration leaves in the table's parameters for the next one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import pyarrow.fs as pafs
from pymetastore.hive_metastore.ttypes import Partition, Table

from strata.catalog.metastore import MetastoreClient
from strata.config import MetastoreConfig, PartitioningConfig
from strata.schema.avro import partition_columns
from strata.store.locations import Markers
from strata.store.parquet import partition_path
from strata.store.places import TableRef

_TIME_VALUE = {"dt": re.compile(r"^\d{4}-\d{2}-\d{2}$"), "hr": re.compile(r"^\d{2}$")}


def _written(partitioning: PartitioningConfig, column: str, value: str) -> bool:
    """Whether Strata itself writes `value` into the data table's partition column."""
    spec = partitioning.field
    if spec is not None and column == spec.column:
        return value in spec.values or value == spec.other
    rule = _TIME_VALUE.get(column)
    return rule is not None and rule.match(value) is not None


def storage_partitions(ref: TableRef, partitioning: PartitioningConfig) -> list[tuple[str, ...]]:
    """Partitions present on storage, from the directory names.

    Only names Strata itself writes (`dt=YYYY-MM-DD`, `hr=HH`, a field partition's
    listed values and `other`) are taken, so a stray directory can never become a
    partition that points outside the table.

    Args:
        ref: The data table.
        partitioning: Its partitioning.
    """
    fs, root = ref.filesystem()
    columns = partition_columns(partitioning)
    found: list[tuple[str, ...]] = [()]
    for column in columns:
        deeper = []
        for prefix in found:
            base = "/".join([root, *(f"{c}={v}" for c, v in zip(columns, prefix, strict=False))])
            if fs.get_file_info(base).type != pafs.FileType.Directory:
                continue
            for info in fs.get_file_info(pafs.FileSelector(base)):
                key, _, value = info.base_name.partition("=")
                if (
                    info.type == pafs.FileType.Directory
                    and key == column
                    and _written(partitioning, column, value)
                ):
                    deeper.append((*prefix, value))
        found = deeper
    return sorted(found)


REGISTERED_KEY = "strata.registered"
"""The data table's parameter recording what its last registration brought into the
metastore (`Since`), so that the next one touches only what changed after it."""
# The partitions held at a registration are kept in its record up to this many
# characters; past it, the next registration compares every settled partition (some
# metastore schemas hold a parameter of 4,000 characters at most).
_HELD_CHARS = 2_000
# A marker written while a registration listed the markers may be missing from that
# listing with a write time a little before the newest one listed: the next
# registration looks again at markers written this long before that newest one.
_MOVE_MARGIN = timedelta(minutes=5)


@dataclass(frozen=True)
class Since:
    """What a plain Parquet data table's last registration brought into the metastore.

    Recorded in the table's own parameters (`REGISTERED_KEY`) once it succeeded, so it
    goes with the table: a metastore that lost or re-created the table has no record,
    and its next registration compares everything.

    Attributes:
        batch: The newest ingest batch its completeness was worked out after: every
            partition a batch up to it completed has its parameters. None when
            completeness was off or unknown.
        moved_ms: Every marker written (the store's modification time, epoch
            milliseconds) up to this instant has its move in the metastore. None when
            no marker was listed.
        held: The partitions a quality mark or an unchecked batch held then; None when
            their names take more than `_HELD_CHARS`.
        settings: The completeness settings the completions were worked out with.
    """

    batch: int | None
    moved_ms: int | None
    held: tuple[str, ...] | None
    settings: str

    def text(self) -> str:
        """The record as the table parameter holds it."""
        held = None if self.held is None else list(self.held)
        body = {"batch": self.batch, "moved_ms": self.moved_ms, "held": held}
        return json.dumps(body | {"settings": self.settings}, sort_keys=True)

    @classmethod
    def read(cls, parameters: dict[str, str] | None, settings: str) -> Since | None:
        """The record in a table's parameters; None if absent, unreadable or made under
        other completeness settings (which move every partition's completion)."""
        try:
            body = json.loads((parameters or {})[REGISTERED_KEY])
            held = body["held"]
            found = cls(
                None if body["batch"] is None else int(body["batch"]),
                None if body["moved_ms"] is None else int(body["moved_ms"]),
                None if held is None else tuple(str(p) for p in held),
                str(body["settings"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        return found if found.settings == settings else None

    @classmethod
    def after(cls, batch: int | None, markers: Markers, held: list[str], settings: str) -> Since:
        """The record of a registration that succeeded.

        Args:
            batch: The newest ingest batch its completeness was worked out after.
            markers: The markers it listed.
            held: The partitions held then.
            settings: The completeness settings (`Since.read`).
        """
        written = [w for w in markers.written.values() if w is not None]
        newest = max(written, default=None)
        return cls(
            batch,
            None if newest is None else int((newest - _MOVE_MARGIN).timestamp() * 1000),
            tuple(held) if len(json.dumps(held)) <= _HELD_CHARS else None,
            settings,
        )


def moved_since(markers: Markers, registered: set[str], since_ms: int | None) -> list[str]:
    """The registered compacted partitions a marker may have moved since `since_ms`.

    A marker whose store gives no write time is always among them.
    """
    out = []
    for partition, stamps in markers.stamps.items():
        if partition not in registered:
            continue
        times = [markers.written.get((partition, s)) for s in stamps]
        if since_ms is None or any(t is None or t.timestamp() * 1000 > since_ms for t in times):
            out.append(partition)
    return sorted(out)


def registered_parts(
    client: MetastoreClient, table: Table, names: list[str], batch: int
) -> Iterator[list[tuple[str, Partition]]]:
    """The registered partitions of `names`, `batch` per metastore call, each with its path."""
    keys = [c.name for c in table.partitionKeys]
    for at in range(0, len(names), batch):
        parts = client.partitions_by_names(table.dbName, table.tableName, names[at : at + batch])
        yield [(partition_path(keys, [str(v) for v in p.values]), p) for p in parts]


def registered_locations(
    metastore: MetastoreConfig, table: str, partitions: list[str]
) -> dict[str, str]:
    """Where the metastore points a table's partitions, for those it lists.

    Fetched `metastore.partition_batch` names per call, as registration fetches them.

    Args:
        metastore: The metastore settings; `uri` must be set.
        table: The table's name in the metastore database.
        partitions: Partition names (`dt=…/hr=…`).

    Returns:
        Per registered partition of `partitions`, its location as the metastore holds it;
        nothing if the table is not registered.

    Raises:
        MetastoreError: If the metastore cannot be reached or answers with an error.
    """
    found: dict[str, str] = {}
    with MetastoreClient(metastore.uri or "", metastore.timeout_s) as client:
        registered = client.get_table(metastore.database, table)
        if registered is None:
            return found
        for parts in registered_parts(client, registered, partitions, metastore.partition_batch):
            found.update((name, part.sd.location) for name, part in parts)
    return found
