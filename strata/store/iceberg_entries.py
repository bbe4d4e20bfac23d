"""What is left of an Iceberg table an operator dropped or renamed in the metastore.

A Hive drop without purge removes a table's entry and leaves its metadata and data
files at its place; a rename keeps the place under another name; files deleted under an
entry leave an entry that names nothing. These read what the metastore and the place
hold (`strata.store.identity` names them to the operator), and register a dropped table
again from its own newest metadata file (`strata ledger restore`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from strata.errors import TableMismatch
from strata.store.files import filesystem
from strata.store.iceberg import _metastore_errors, catalog, identifier, location, open_table

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from strata.store.places import TableRef


def forget_lost(ref: TableRef) -> bool:
    """Drop the metastore's entry of a table whose metadata is gone; whether there was one.

    Such an entry names no file that exists: dropping it loses nothing, and a table can
    be made afresh under the name (a recorded reset or rebuild).
    """
    try:
        open_table(ref)
    except TableMismatch:
        found = catalog(ref)
        with _metastore_errors(found, "drop the lost entry of", identifier(ref)):
            found.drop_table(identifier(ref))
        return True
    return False


def named_elsewhere(ref: TableRef) -> list[str]:
    """Names the metastore gives, other than the table's own, to an Iceberg table at its place.

    A table renamed in the metastore keeps its place: found here, it is named to the
    operator, who can rename it back. Only the metastore's entries are read (their
    locations), not the tables' metadata.
    """
    found = catalog(ref)
    database, own = identifier(ref)
    place = _same_place(location(ref.uri))
    names = []
    with _metastore_errors(found, "list the tables of the database of", identifier(ref)):
        with found._client as client:  # noqa: SLF001 - the entries' locations, in one call
            for entry in client.get_table_objects_by_name(
                dbname=database, tbl_names=client.get_all_tables(db_name=database)
            ):
                if entry.tableName == own or entry.sd is None:
                    continue
                if _same_place(entry.sd.location or "") == place:
                    names.append(f"{database}.{entry.tableName}")
    return sorted(names)


def _same_place(uri: str) -> str:
    """A location as one spelling: the metastore writes `file:/p` where Iceberg has
    `file:///p`, and either may end with a slash."""
    if uri.startswith("file:"):
        uri = "file:///" + uri[len("file:") :].lstrip("/")
    return uri.rstrip("/")


def metadata_files(ref: TableRef) -> list[tuple[str, dict[str, Any]]]:
    """The metadata files at the table's place (`metadata/*.metadata.json`), newest last.

    Each with the fields that tell whose it is and what it holds: `table-uuid`,
    `last-updated-ms`, and whether it names any snapshot.
    """
    fs, root = filesystem(ref.uri, ref.options)
    folder = f"{root}/metadata"
    if fs.get_file_info(folder).type == pafs.FileType.NotFound:
        return []
    out = []
    for info in fs.get_file_info(pafs.FileSelector(folder)):
        if info.type != pafs.FileType.File or not info.base_name.endswith(".metadata.json"):
            continue
        with fs.open_input_stream(info.path) as stream:
            try:
                body = json.loads(stream.read())
            except ValueError:
                continue
        out.append(
            (
                info.path[len(root) :].lstrip("/"),
                {
                    "table-uuid": body.get("table-uuid"),
                    "last-updated-ms": int(body.get("last-updated-ms") or 0),
                    "snapshots": len(body.get("snapshots") or []),
                },
            )
        )
    return sorted(out, key=lambda f: (f[1]["last-updated-ms"], f[0]))


def register_metadata(ref: TableRef, path: str) -> Table:
    """Register the table in the metastore again from one of its metadata files.

    Args:
        ref: The table (its name and place).
        path: The metadata file, relative to the table's place.
    """
    found = catalog(ref)
    with _metastore_errors(found, "register", identifier(ref)):
        return found.register_table(identifier(ref), f"{location(ref.uri).rstrip('/')}/{path}")
