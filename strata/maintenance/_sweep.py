"""Vacuum of a plain Parquet data table: what compaction's moves left behind.

A compacted partition moves to a new directory by a marker (`strata.store.locations`);
the directory it left stays for queries that listed it, and a new directory no marker
names is a compaction's that was stopped before its move or lost its lease.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from strata.config import MetastoreConfig
from strata.errors import MetastoreError
from strata.log import get_logger
from strata.maintenance.report import TableVacuum
from strata.store.locations import (
    GENERATION,
    TableFile,
    generation_dir,
    marker_uri,
    read_markers,
    visible_files,
    void,
)
from strata.store.places import Places

if TYPE_CHECKING:
    from strata.store.lock import RunLock

logger = get_logger(__name__)


def sweep_moved(
    places: Places, metastore: MetastoreConfig | None, grace: timedelta, lock: RunLock | None
) -> TableVacuum:
    """Delete what compaction left in a plain Parquet data table, once it is safe.

    - A directory a partition was moved away from goes once `grace` has passed since
      the marker that moved it away was written (the move became visible then, whenever
      the compaction planned it): a query that listed it before has finished. Its older
      markers go with it.
    - A new directory no marker names is a compaction's that was stopped before the
      move, or one paused past its lease. Above the partition's newest move it is voided
      first, so that no marker can move the partition there any more, then deleted at
      once; if a marker won that race, the move stands and the directory is kept. Below
      the newest move, a marker landing late would not be the newest: it moves nothing,
      and the directory goes without a void.
    - A void marker below the partition's newest move is no longer needed, for the same
      reason, and goes.
    - With `metastore.uri` set, a directory the metastore still points a partition at
      (a registration that failed after a move) is kept, with a warning naming the
      way out: `strata register`, which points the partition at its directory in use.

    Args:
        places: The pipeline's places.
        metastore: The metastore the tables are registered in, if any.
        grace: How long a directory stays after its partition was moved away.
        lock: The maintenance lock; None for a dry run, which deletes nothing.

    Returns:
        Files of left directories deleted (as removed files), of never-used ones (as
        never committed), markers deleted (as metadata), and the directories kept
        because the metastore points at them.
    """
    ref = places.table("table")
    fs, root = ref.filesystem()
    markers = read_markers(fs, root)
    horizon = datetime.now(UTC) - grace

    def moved_before_horizon(partition: str, stamp: str) -> bool:
        # A store that gives no write time never lets the grace period pass.
        when = markers.written.get((partition, stamp))
        return when is not None and when <= horizon

    def below_newest_move(partition: str, stamp: str) -> bool:
        moves = markers.stamps.get(partition, [])
        return bool(moves) and stamp < moves[-1]

    left: dict[str, list[TableFile]] = {}
    unused: dict[str, list[TableFile]] = {}
    for f in visible_files(fs, root):
        moves = markers.stamps.get(f.partition, [])
        if f.directory == f.partition:
            if moves and moved_before_horizon(f.partition, moves[0]):
                left.setdefault(f.directory, []).append(f)
            continue
        stamp = _stamp_of(f.directory)
        if stamp not in moves:
            unused.setdefault(f.directory, []).append(f)
        elif stamp != moves[-1] and moved_before_horizon(
            f.partition, moves[moves.index(stamp) + 1]
        ):
            left.setdefault(f.directory, []).append(f)
    figures = TableVacuum()
    partition_of = {d: files[0].partition for d, files in [*left.items(), *unused.items()]}
    pointed = _pointed_at(places, metastore, partition_of)
    if pointed is None:
        # Without the metastore's word, no directory a partition left is known unread.
        pointed = set(left)
        if left:
            figures.warnings.append(
                f"the metastore could not be read: {len(left)} directories partitions were "
                "moved away from are kept; the next vacuum that can read it deletes them"
            )
    elif pointed:
        shown = ", ".join(sorted(pointed)[:5])
        figures.warnings.append(
            f"{len(pointed)} directories kept: the metastore still points partitions at "
            f"them ({shown}); run `strata register --pipeline {places.pipeline}` to point them at "
            "their directories in use, and the next vacuum deletes them"
        )
    never_used: list[str] = []
    moved_meanwhile: list[str] = []
    for directory, files in sorted(unused.items()):
        if directory in pointed:
            continue
        partition, stamp = files[0].partition, _stamp_of(directory)
        needs_void = not below_newest_move(partition, stamp)
        if lock is not None and needs_void and stamp not in markers.void.get(partition, set()):
            lock.check()
            note = f"voided by vacuum at {datetime.now(UTC).isoformat(timespec='seconds')}"
            if not void(ref.uri, ref.options, partition, stamp, note):
                moved_meanwhile.append(directory)
                continue
        never_used += [f.path for f in files]
    if moved_meanwhile:
        figures.warnings.append(
            f"{len(moved_meanwhile)} partitions were moved while vacuum ran, by a compaction "
            f"that had lost its lease ({', '.join(moved_meanwhile[:5])}); their directories "
            "are kept"
        )
    left_paths = [f.path for d, files in left.items() if d not in pointed for f in files]
    # A marker goes once the move after it is past the grace period and its directory
    # goes; a void one once a move stands above it.
    old_markers = [
        marker_uri(root, part, stamp)
        for part, moves in markers.stamps.items()
        for stamp, following in zip(moves, moves[1:], strict=False)
        if moved_before_horizon(part, following) and generation_dir(part, stamp) not in pointed
    ]
    old_markers += [
        marker_uri(root, part, stamp)
        for part, stamps in markers.void.items()
        for stamp in sorted(stamps)
        if below_newest_move(part, stamp)
    ]
    if lock is not None:
        for path in [*left_paths, *never_used]:
            # A vacuum that lost its lease must stop: a compaction may hold it now.
            lock.check()
            fs.delete_file(f"{root}/{path}")
        for path in old_markers:
            lock.check()
            fs.delete_file(path)
    for warning in figures.warnings:
        logger.warning("pipeline %s: vacuum: %s", places.pipeline, warning)
    figures.removed_files = len(left_paths)
    figures.never_committed = len(never_used)
    figures.metadata_files = len(old_markers)
    figures.kept_for_metastore = sorted(pointed)
    return figures


def _stamp_of(directory: str) -> str:
    """The stamp of a generation directory (`…/_c<stamp>`)."""
    return directory.rsplit("/", 1)[-1][len(GENERATION) :]


def _pointed_at(
    places: Places, metastore: MetastoreConfig | None, partitions: dict[str, str]
) -> set[str] | None:
    """Which of these directories (each with its partition) the metastore points at.

    Args:
        places: The pipeline's places.
        metastore: The metastore the tables are registered in, if any.
        partitions: Each directory's partition.

    Returns:
        The directories a registered partition's location names; none without
        `metastore.uri`; None if the metastore could not be read.
    """
    from strata.catalog.register import registered_locations

    # An unpartitioned table's location is the table's own, which compaction never moves.
    names = sorted({part for part in partitions.values() if part})
    if metastore is None or not metastore.uri or not names:
        return set()
    try:
        registered = registered_locations(metastore, places.table("table").name, names)
    except MetastoreError as exc:
        logger.warning("pipeline %s: vacuum could not read the metastore: %s", places.pipeline, exc)
        return None
    named = set()
    for partition, where in registered.items():
        path = where.rstrip("/")
        head, _, last = path.rpartition("/")
        # Compared by the end of the path: the metastore may spell the scheme its own
        # way (`file:/…`, `s3a://…`).
        if path.endswith(f"/{partition}"):
            named.add(partition)
        elif last.startswith(GENERATION) and head.endswith(f"/{partition}"):
            named.add(f"{partition}/{last}")
    return named & set(partitions)
