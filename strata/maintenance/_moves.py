"""Moving compacted plain Parquet partitions to their new directories.

A plain Parquet partition's directory is the partition: its merged files, and copies
of the files the merge leaves, go into a new directory of the partition's, and one
marker, created only if absent, moves the partition there (see
`strata.store.locations`). The moves are announced first, so a run that takes the run
lock over from a compaction paused past its lease voids those not made yet; the
metastore's partition locations follow at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow.fs as pafs

from strata import faults
from strata.errors import LeaseLost, MetastoreError
from strata.store.delta import committed_batch
from strata.store.locations import announce_moves, current_files, mark, withdraw_moves
from strata.store.parquet import file_batch, is_compaction_file
from strata.store.places import Places

if TYPE_CHECKING:
    from strata.maintenance._bins import Picked
    from strata.store.lock import RunLock

# How long a compaction waits for a run in flight before moving its partitions.
_RUN_LOCK_WAIT_S = 600.0


def stands(path: str, last: int) -> bool:
    """Whether a plain Parquet file's rows stand: its batch is in the ledger, or it is a
    compaction's (found in a partition's directory in use), or it is no batch's at all
    (put there by hand, and read as the table's like any other file).

    Args:
        path: The file, relative to the table root.
        last: The newest batch the ledger holds.
    """
    batch = file_batch(path)
    return batch is None or batch <= last or is_compaction_file(path)


def move_partitions(
    places: Places,
    picked: list[Picked],
    lock: RunLock,
    register: Callable[[], object] | None,
) -> dict[str, str]:
    """Move each plain Parquet partition to its new directory, then the metastore too.

    The files the merge left are copied into the new directory first (committed files
    never change). Then, under the run lock, so no batch writes meanwhile: the files a
    run added since the partition was listed are copied too, the ledger is read again
    to tell them committed, and the marker is written. Files of a batch the ledger does
    not hold are not carried: the run that finishes that batch deletes and rewrites them,
    in the partition's directory in use.

    Args:
        places: The pipeline's places.
        picked: The data table's partitions to move, their merged files written.
        lock: The maintenance lock this compaction holds.
        register: Points the metastore at the partitions' directories in use, once one
            moved; None leaves that to the next run or `strata register`.

    Returns:
        Per partition, `compacted` or why it was left as it was.

    Raises:
        LeaseLost: If this compaction lost its lease before a partition's move.
    """
    from strata.store.lock import BothLocks, lock_when_free

    pipeline, ref = places.pipeline, places.table("table")
    fs, root = ref.filesystem()
    last = committed_batch(places.ledger.uri, pipeline, places.options) or 0
    carried: dict[str, set[str]] = {}
    for p in picked:
        carried[p.name] = set()
        for f in p.files:
            if f["path"] not in p.merged and stands(f["path"], last):
                _carry(fs, root, f["path"], p.directory)
                carried[p.name].add(f["path"])
    outcome: dict[str, str] = {}
    with lock_when_free(places, "run", _RUN_LOCK_WAIT_S) as run:
        both = BothLocks(lock, run)
        # Before any check that a marker follows: a run that takes the run lock over
        # from this one (paused past its lease) voids the moves not made yet.
        stamps = {p.stamp for p in picked}
        announced = [
            announce_moves(ref.uri, ref.options, stamp, [p.name for p in picked])
            for stamp in sorted(stamps)
        ]
        last = committed_batch(places.ledger.uri, pipeline, places.options) or 0
        now: dict[str, set[str]] = {}
        for listed in current_files(fs, root):
            now.setdefault(listed.partition, set()).add(listed.path)
        for p in picked:
            there = now.get(p.name, set())
            if not p.merged <= there:
                outcome[p.name] = "left: files to merge were removed meanwhile"
                continue
            for path in sorted(there - p.merged - carried[p.name]):
                if stands(path, last):
                    _carry(fs, root, path, p.directory)
            # A compaction that lost its lease must not move anything: vacuum may run.
            both.check()
            faults.reached(faults.AFTER_COMPACT_CHECK)
            # The check above can be stale by the time the marker lands (a pause right
            # here): the marker is created only if vacuum has not voided the directory.
            if not mark(ref.uri, ref.options, p.name, p.stamp):
                raise LeaseLost(
                    f"pipeline {pipeline}: this compaction lost its lease before it moved "
                    f"{p.name}: a vacuum or a run that took over voided its new directory "
                    f"{p.directory}, so the partition stays where it was. Partitions it "
                    "moved before stay moved (the next run, or `strata register --pipeline "
                    f"{pipeline}`, points the metastore at them); the next compaction picks "
                    "the others."
                )
            outcome[p.name] = "compacted"
            faults.reached(faults.AFTER_COMPACT_MOVE)
        for uri in announced:
            withdraw_moves(uri, ref.options)
        if register is not None and any(o == "compacted" for o in outcome.values()):
            try:
                register()
            except MetastoreError as exc:
                note = (
                    f"compacted; the metastore still lists the old location ({exc}); the "
                    f"next run, or `strata register --pipeline {pipeline}`, moves it"
                )
                outcome = {k: note if v == "compacted" else v for k, v in outcome.items()}
    return outcome


def _carry(fs: pafs.FileSystem, root: str, path: str, directory: str) -> None:
    """Copy a file, under its own name, into a partition's new directory."""
    fs.copy_file(f"{root}/{path}", f"{root}/{directory}/{path.rsplit('/', 1)[-1]}")
