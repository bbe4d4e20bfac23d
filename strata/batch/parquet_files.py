"""A plain Parquet table's files of one batch: found by name, and removed when not committed.

A plain Parquet table has no log: every file in its directories is read. So a batch's
files that are not to count (a crashed attempt's, a failed task's, a run's that lost
its lease) are deleted, told apart by the batch and run in their names.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager

import pyarrow.fs as pafs

from strata.batch.reconcile import TABLES
from strata.errors import LeaseLost, PlanError
from strata.store.delta import committed_batch
from strata.store.lock import RunLock
from strata.store.parquet import is_batch_file
from strata.store.places import Places


@contextmanager
def own_files_on_loss(places: Places, batch: int, run_id: str) -> Iterator[None]:
    """On a lost lease, delete this run's own plain Parquet files of the batch, then stop.

    They are not committed and never will be by this run; their names carry its id, so
    they are told from the files of the run that took over.
    """
    try:
        yield
    except LeaseLost:
        if places.format == "parquet":
            remove_batch_files(places, batch, only_run=run_id)
        raise


def remove_batch_files(
    places: Places,
    batch: int,
    keep: Collection[str] = (),
    only_run: str | None = None,
    lock: RunLock | None = None,
) -> int:
    """Delete files of `batch` from the plain Parquet tables, but those in `keep`.

    Without a table log the files in the directories are the table, so a runner must
    never delete what another one committed: with a `lock`, the files are listed first,
    the ledger is then checked not to hold the batch, and the lease is checked before
    each deletion.

    Args:
        places: Where the tables are.
        batch: The batch.
        keep: Paths relative to their table's root that stay (the batch's own files).
        only_run: Delete only files this run (by its id) wrote.
        lock: The run's lock, when files of other runs may be deleted.

    Returns:
        How many files were deleted.

    Raises:
        PlanError: If the ledger holds the batch: another run committed it meanwhile.
    """
    doomed: list[tuple[pafs.FileSystem, str]] = []
    for name in TABLES:
        fs, root = places.table(name).filesystem()
        if fs.get_file_info(root).type == pafs.FileType.NotFound:
            continue
        for info in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
            if not (info.type == pafs.FileType.File and is_batch_file(info.base_name, batch)):
                continue
            if info.path[len(root) :].lstrip("/") in keep:
                continue
            if only_run is not None and f"-{only_run}-" not in info.base_name:
                continue
            doomed.append((fs, info.path))
    if lock is not None and doomed:
        lock.check()
        if (committed_batch(places.ledger.uri, places.pipeline, places.options) or 0) >= batch:
            raise PlanError(
                f"batch {batch} was committed by another run while this one ran; nothing of "
                "this run was committed, and that run's files were left as they are"
            )
    for fs, path in doomed:
        if lock is not None:
            lock.check()
        fs.delete_file(path)
    return len(doomed)
