"""Whose files are at a table's place: vacuum deletes only its own table's.

Vacuum deletes the files under a table's location that the table no longer holds. That
is safe only if every file there is the table's: an Iceberg table renamed or dropped in
the metastore keeps its metadata and files at its place, and a new table created there
holds none of them; a Delta location may hold another table's log; a table of one
format may stand where another format's table left its metadata. Deleting what "this
table does not hold" would then destroy the other table.

So before it fences or deletes anything, vacuum checks each table's place
(`refuse_foreign`), and refuses, naming the place, both tables and the ways out, when:

- Delta: the log at the place names another table, or holds files and no batch of the
  pipeline; or Iceberg metadata is there too;
- Iceberg: the metastore's table lives elsewhere; a metadata file at the place is
  another table's (its `table-uuid` differs, and this table's metadata log does not
  list it); or a Delta log is there too;
- plain Parquet: a Delta log or Iceberg metadata is there.

Within a place that holds only its own table's metadata, each file is still deleted
only when it can be told to be the table's: named by the table's own log or metadata
(a removed file), or named as Strata names a batch the table holds or a compaction's
files (`strata.maintenance.vacuum.never_committed`, `strata.maintenance._iceberg`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from strata.config import Location
from strata.errors import MaintenanceError
from strata.maintenance import _iceberg
from strata.store.places import Places

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from strata.store.places import TableRef

_WHAT = {"table": "data table", "raw": "raw copy", "quarantine": "quarantine", "ledger": "ledger"}


def refuse_foreign(places: Places, opened: Mapping[Location, Any]) -> None:
    """Stop a vacuum before it touches anything, if a table's place holds another's files.

    Args:
        places: The pipeline's places.
        opened: Each table to vacuum, opened (a Delta or Iceberg handle, or None where
            there is none; plain Parquet directories are not opened).

    Raises:
        MaintenanceError: Naming each such place, both tables and the ways out; nothing
            was fenced or deleted.
    """
    problems = []
    fixes = []
    owned = {t.role: t for t in places.owned()}
    for which, handle in opened.items():
        ref = places.table(which)
        problem = _problem(places, ref, handle)
        if problem is None:
            continue
        problems.append(f"the {_WHAT[which]} of {places.pipeline} at {ref.uri} {problem}")
        fixes.append(owned[which].fix(place=True, name=False))
    if not problems:
        return
    raise MaintenanceError(
        f"pipeline {places.pipeline}: vacuum deleted nothing: "
        + "; ".join(problems)
        + ". Vacuum deletes files under a table's place that the table does not hold, and "
        "would delete files another table still names. Move the other table to a place of "
        "its own (its files, then register it there), or drop it with its files if it is "
        "not needed; or " + "; or ".join(fixes) + ". Then run vacuum again."
    )


def _problem(places: Places, ref: TableRef, handle: Any) -> str | None:  # noqa: ANN401
    """Why another table's files are at `ref`'s place, in words; None if none are."""
    fs, root = ref.filesystem()
    if ref.format == "delta":
        return None if handle is None else _delta_problem(places, ref, handle, fs, root)
    if ref.format == "iceberg":
        if handle is None:
            return None
        problem = _iceberg.foreign_metadata(ref, handle)
        found = _other_formats(fs, root, "iceberg")
        return problem if problem is not None or not found else f"also holds {found}"
    found = _other_formats(fs, root, "parquet")
    return None if not found else f"also holds {found}"


def _delta_problem(
    places: Places, ref: TableRef, table: DeltaTable, fs: pafs.FileSystem, root: str
) -> str | None:
    metadata = table.metadata()
    other = f"holds the log of another table (Delta table id {metadata.id})"
    if metadata.name and metadata.name != ref.name:
        return f"{other}: its metadata names it `{metadata.name}`, not `{ref.name}`"
    if table.transaction_version(places.pipeline) is None and table.file_uris():
        return f"{other}: it lists files and no batch of {places.pipeline}"
    found = _other_formats(fs, root, "delta")
    return None if not found else f"also holds {found}"


def _other_formats(fs: pafs.FileSystem, root: str, own: str) -> str:
    """Another format's table metadata at a place, in words; empty if there is none."""
    found = []
    if own != "delta" and _any_file(fs, f"{root}/_delta_log"):
        found.append("a Delta table's log (_delta_log/)")
    if own != "iceberg":
        names = _iceberg.metadata_names(fs, root)
        if names:
            found.append(f"an Iceberg table's metadata ({', '.join(names[:3])})")
    return " and ".join(found)


def _any_file(fs: pafs.FileSystem, folder: str) -> bool:
    selector = pafs.FileSelector(folder, allow_not_found=True)
    return any(info.type == pafs.FileType.File for info in fs.get_file_info(selector))
