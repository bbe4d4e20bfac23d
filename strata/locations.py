"""Where each partition of a plain Parquet table lives now.

A plain Parquet table has no log: the files in a partition's directory are the
partition. Compaction cannot swap files there in place without a reader seeing both
the old and the new ones, or neither. So it writes the partition's new files into a
directory of their own beside the old ones, `<partition>/_c<stamp>/`, and then moves
the partition there with one empty marker file, `<table>/_locations/<partition>/c<stamp>`.
The newest marker names the partition's directory; without one it is the partition's
own. Writing one object is atomic on every store, so a reader sees the old directory
or the new one, never a mix.

Everything that places or finds a plain Parquet file follows the markers: the writer
puts late rows into the directory in use, Strata's readers read only it, and the
metastore's partition location mirrors it (compaction moves it; registration moves it
back if it drifted). The directories left behind stay for queries that listed them
until vacuum's grace period has passed.

Names that begin with `_` or `.` are hidden from Spark, Trino, Hive and Arrow's
discovery: neither a new directory nor a marker can show up as rows, or as a partition,
in a reader that lists the old directory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow.fs as pafs

from strata.storage import write_bytes_atomically

MARKERS = "_locations"
GENERATION = "_c"
_STAMP = "%Y%m%dT%H%M%S%fZ"


def new_stamp(moment: datetime | None = None) -> str:
    """A generation stamp: the time (now), to the microsecond; later stamps sort after."""
    return (moment or datetime.now(UTC)).astimezone(UTC).strftime(_STAMP)


def stamp_time(stamp: str) -> datetime | None:
    """When a generation was stamped; None for a name that is not a stamp."""
    try:
        return datetime.strptime(stamp, _STAMP).replace(tzinfo=UTC)
    except ValueError:
        return None


def generation_dir(partition: str, stamp: str) -> str:
    """A partition's directory of one generation, relative to the table."""
    return f"{partition}/{GENERATION}{stamp}".lstrip("/")


def _join(*parts: str) -> str:
    return "/".join(p for p in parts if p)


@dataclass
class Markers:
    """The generations each compacted partition has had, oldest first.

    Attributes:
        stamps: Per partition (`dt=…/hr=…`), the stamps of its markers, sorted.
    """

    stamps: dict[str, list[str]] = field(default_factory=dict)

    def current(self) -> dict[str, str]:
        """Per compacted partition, its directory in use, relative to the table."""
        return {part: generation_dir(part, s[-1]) for part, s in self.stamps.items()}


def read_markers(fs: pafs.FileSystem, root: str) -> Markers:
    """The table's markers (one listing of `<table>/_locations`)."""
    base = f"{root}/{MARKERS}"
    selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
    found: dict[str, list[str]] = {}
    for info in fs.get_file_info(selector):
        if info.type != pafs.FileType.File or not info.base_name.startswith("c"):
            continue
        stamp = info.base_name[1:]
        if stamp_time(stamp) is None:
            continue
        partition = info.path[len(base) :].strip("/").rpartition("/")[0]
        found.setdefault(partition, []).append(stamp)
    return Markers({part: sorted(stamps) for part, stamps in found.items()})


def current_locations(fs: pafs.FileSystem, root: str) -> dict[str, str]:
    """Per compacted partition of a plain Parquet table, its directory in use."""
    return read_markers(fs, root).current()


def mark(fs: pafs.FileSystem, root: str, partition: str, stamp: str) -> None:
    """Move a partition to its generation `stamp`: one object written, atomically."""
    write_bytes_atomically(fs, f"{root}/{_join(MARKERS, partition, 'c' + stamp)}", b"")


def place(partition: str, current: dict[str, str]) -> str:
    """The directory a partition's files are written to and read from."""
    return current.get(partition, partition)


@dataclass(frozen=True)
class TableFile:
    """A visible data file of a plain Parquet table.

    Attributes:
        path: Relative to the table.
        partition: Its partition (`dt=…/hr=…`, or `` for an unpartitioned table).
        directory: The directory it is in, relative to the table.
        size: Bytes.
        modified: When it was written.
    """

    path: str
    partition: str
    directory: str
    size: int
    modified: datetime | None


def visible_files(fs: pafs.FileSystem, root: str) -> list[TableFile]:
    """Every data file of any generation, current or not, under a plain Parquet table.

    Hidden names (`_…`, `.…`: markers, writes in progress, other tools' files) are left
    out, but for the generation directories themselves.
    """
    selector = pafs.FileSelector(root, recursive=True, allow_not_found=True)
    out = []
    for info in fs.get_file_info(selector):
        if info.type != pafs.FileType.File:
            continue
        parts = info.path[len(root) :].strip("/").split("/")
        *dirs, name = parts
        if name.startswith(("_", ".")):
            continue
        directory = "/".join(dirs)
        if dirs and dirs[-1].startswith(GENERATION):
            dirs = dirs[:-1]
        if any(d.startswith(("_", ".")) for d in dirs):
            continue
        out.append(
            TableFile(
                "/".join(parts),
                "/".join(dirs),
                directory,
                int(info.size or 0),
                None if info.mtime is None else info.mtime.astimezone(UTC),
            )
        )
    return out


def current_files(fs: pafs.FileSystem, root: str) -> list[TableFile]:
    """The data files of a plain Parquet table as it stands: each partition's in use.

    The markers are read before the files are listed: a partition moved in between is
    then read from its old directory, which keeps every file for the grace period,
    never from a new one listed before it was complete.
    """
    current = current_locations(fs, root)
    return [f for f in visible_files(fs, root) if f.directory == place(f.partition, current)]
