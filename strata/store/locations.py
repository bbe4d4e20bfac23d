"""Where each partition of a plain Parquet table lives, as compaction moves it to new directories.

A plain Parquet table has no log: the files in a partition's directory are the
partition. Compaction cannot swap files there in place without a reader seeing both
the old and the new ones, or neither. So it writes the partition's new files into a
directory of their own beside the old ones, `<partition>/_c<stamp>/`, and then moves
the partition there with one empty marker file, `<table>/_locations/<partition>/c<stamp>`.
The newest marker names the partition's directory; without one it is the partition's
own. Writing one object is atomic on every store, so a reader sees the old directory
or the new one, never a mix.

A marker is created only if absent (`put_if_absent`, S3's `If-None-Match: *`), and
vacuum creates the same name first, holding a note, before it deletes a new directory
no marker names: such a *void* marker moves nothing, and once it exists no marker can
ever move the partition there. The store decides which comes first, so a compaction
paused past its lease between its last check and its marker either moved the partition
before vacuum looked (and vacuum keeps the directory) or finds its marker refused (and
moves nothing), never moving a partition to a deleted directory. A marker is empty; a
void one holds the note, so a listing tells them apart by size alone.

The newest marker is the one with the highest stamp, and a stamp is not a host's clock
alone: a compaction stamps its generation after every stamp the table shows (its
markers, void ones included, and its generation directories: `next_stamp`), so a
compaction planned after another's directory or marker was there outranks it, even
when the other ran on a host whose clock is ahead. Two compactions that cannot see
each other's are one that lost its lease and the one that took over; the former's
directory is written before its last check, which stops it, so a marker it may still
write (paused between that check and the marker) carries a stamp below the later
one's. A marker, or a void one, below a partition's newest marker can therefore never
become the newest: vacuum deletes void markers once a move stands above them, and a
marker landing late in a freed name moves nothing.

Everything that places or finds a plain Parquet file follows the markers: the writer
puts late rows into the directory in use, Strata's readers read only it, and the
metastore's partition location mirrors it (compaction moves it; registration moves it
back if it drifted). The directories left behind stay for queries that listed them
until vacuum's grace period has passed, counted from the write time of the marker that
moved the partition away (its modification time in the listing).

Names that begin with `_` or `.` are hidden from Spark, Trino, Hive and Arrow's
discovery: neither a new directory nor a marker can show up as rows, or as a partition,
in a reader that lists the old directory.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pyarrow.fs as pafs

from strata.store.files import delete_object, list_names, put_if_absent, read_object

MARKERS = "_locations"
# Moves a compaction announced before making them (`announce_moves`).
MOVES = f"{MARKERS}/_moves"
GENERATION = "_c"
_STAMP = "%Y%m%dT%H%M%S%fZ"
# What a marker that moves a partition holds; a void one holds a note instead.
_MOVE = b""


def new_stamp(moment: datetime | None = None) -> str:
    """A generation stamp: the time (now), to the microsecond; later stamps sort after."""
    return (moment or datetime.now(UTC)).astimezone(UTC).strftime(_STAMP)


def next_stamp(markers: Markers, files: Iterable[TableFile], moment: datetime | None = None) -> str:
    """The stamp of a new generation: now, or just after every stamp the table shows.

    A host whose clock runs ahead stamps generations in the future; one planned after
    them on any host must still outrank them, or its move would not be the newest.

    Args:
        markers: The table's markers (`read_markers`).
        files: Its visible files, every generation's (`visible_files`).
        moment: Now (for tests of a host's clock); the current time if None.
    """
    seen = [s for stamps in markers.stamps.values() for s in stamps]
    seen += [s for stamps in markers.void.values() for s in stamps]
    for f in files:
        last = f.directory.rsplit("/", 1)[-1]
        if f.directory != f.partition and last.startswith(GENERATION):
            seen.append(last[len(GENERATION) :])
    now = (moment or datetime.now(UTC)).astimezone(UTC)
    newest = max((t for t in map(stamp_time, seen) if t is not None), default=None)
    if newest is not None and newest >= now:
        now = newest + timedelta(microseconds=1)
    return new_stamp(now)


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
        stamps: Per partition (`dt=…/hr=…`), the stamps of the markers that moved it,
            sorted; void markers are not among them.
        written: Per (partition, stamp) of `stamps`, when its marker was written (the
            store's modification time; None where the store gives none).
        void: Per partition, the stamps of its void generations, which no marker can
            ever move it to.
    """

    stamps: dict[str, list[str]] = field(default_factory=dict)
    written: dict[tuple[str, str], datetime | None] = field(default_factory=dict)
    void: dict[str, set[str]] = field(default_factory=dict)

    def current(self) -> dict[str, str]:
        """Per compacted partition, its directory in use, relative to the table."""
        return {part: generation_dir(part, s[-1]) for part, s in self.stamps.items()}


def read_markers(fs: pafs.FileSystem, root: str) -> Markers:
    """The table's markers (one listing of `<table>/_locations`)."""
    base = f"{root}/{MARKERS}"
    selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
    found = Markers()
    for info in fs.get_file_info(selector):
        if info.type != pafs.FileType.File or not info.base_name.startswith("c"):
            continue
        stamp = info.base_name[1:]
        if stamp_time(stamp) is None:
            continue
        partition = info.path[len(base) :].strip("/").rpartition("/")[0]
        if info.size:
            found.void.setdefault(partition, set()).add(stamp)
            continue
        found.stamps.setdefault(partition, []).append(stamp)
        found.written[(partition, stamp)] = (
            None if info.mtime is None else info.mtime.astimezone(UTC)
        )
    for stamps in found.stamps.values():
        stamps.sort()
    return found


def current_locations(fs: pafs.FileSystem, root: str) -> dict[str, str]:
    """Per compacted partition of a plain Parquet table, its directory in use."""
    return read_markers(fs, root).current()


def marker_uri(location: str, partition: str, stamp: str) -> str:
    """Where the marker of a partition's generation `stamp` lives, under the table."""
    return f"{location.rstrip('/')}/{_join(MARKERS, partition, 'c' + stamp)}"


def mark(location: str, options: dict[str, str], partition: str, stamp: str) -> bool:
    """Move a partition to its generation `stamp`, unless that generation is void.

    Args:
        location: The table's location (a local path or an s3:// URI).
        options: The pipeline's `storage_options`.
        partition: The partition (`dt=…/hr=…`).
        stamp: The generation.

    Returns:
        True if the partition moved; False if vacuum voided the generation first, and
        nothing moved.
    """
    uri = marker_uri(location, partition, stamp)
    if put_if_absent(uri, options, _MOVE):
        return True
    # A PUT retried after its first attempt landed finds this very marker.
    return read_object(uri, options) == _MOVE


def void(location: str, options: dict[str, str], partition: str, stamp: str, note: str) -> bool:
    """Make a partition's generation `stamp` one no marker can ever move it to.

    Args:
        location: The table's location (a local path or an s3:// URI).
        options: The pipeline's `storage_options`.
        partition: The partition (`dt=…/hr=…`).
        stamp: The generation.
        note: Who voided it and when, kept in the void marker; never empty.

    Returns:
        True if the generation is void (now, or already); False if a marker moved the
        partition there first, which then stands.
    """
    uri = marker_uri(location, partition, stamp)
    if put_if_absent(uri, options, note.encode() or b"void"):
        return True
    held = read_object(uri, options)
    return held is not None and held != _MOVE


def announce_moves(
    location: str, options: dict[str, str], stamp: str, partitions: list[str]
) -> str:
    """Record, before any is made, the moves a compaction is about to make.

    The compaction makes them under the run lock; a run that takes that lock over from
    it (paused or killed past its lease) voids those not made yet before it writes
    (`void_unfinished_moves`), so a marker that lands late never moves a partition away from
    rows that run wrote meanwhile.

    Args:
        location: The table's location.
        options: The pipeline's `storage_options`.
        stamp: The generation the partitions move to.
        partitions: The partitions to move.

    Returns:
        Where the record is, for `withdraw_moves` once the moves are made.
    """
    uri = f"{location.rstrip('/')}/{MOVES}/m{stamp}.json"
    put_if_absent(uri, options, json.dumps(sorted(partitions)).encode())
    return uri


def withdraw_moves(uri: str, options: dict[str, str]) -> None:
    """Remove the record of moves once all of them are made (or none will be)."""
    delete_object(uri, options)


def void_unfinished_moves(location: str, options: dict[str, str], note: str) -> list[str]:
    """Void every move a compaction announced and did not make; under the run lock.

    A compaction makes its moves holding the run lock, so a record found by a run that
    holds it now belongs to a compaction that lost it (or died): each move it had not
    made is voided (a move it made stands), and the record goes.

    Args:
        location: The table's location.
        options: The pipeline's `storage_options`.
        note: Who voids them, kept in each void marker.

    Returns:
        The generations voided (`partition/_c<stamp>`).
    """
    folder = f"{location.rstrip('/')}/{MOVES}"
    voided = []
    for name in list_names(folder, options):
        if not (name.startswith("m") and name.endswith(".json")):
            continue
        stamp = name[1 : -len(".json")]
        data = read_object(f"{folder}/{name}", options)
        if data is None or stamp_time(stamp) is None:
            continue
        for partition in json.loads(data):
            if void(location, options, partition, stamp, note):
                voided.append(generation_dir(partition, stamp))
        delete_object(f"{folder}/{name}", options)
    return voided


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
