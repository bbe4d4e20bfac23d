"""The run and maintenance locks: a local flock, or a lease in an object store.

Two locks: the run lock (ingest, backfill, replay, ledger edits) and the maintenance
lock (compaction, vacuum). Ingest only appends, which Delta lets land beside a
compaction, so compaction of a Delta table never makes an ingest wait; a plain Parquet
partition is moved to its compacted files under the run lock for a moment, so late
rows of a run are never left behind in the directory it leaves. Whatever removes files takes the
maintenance lock: a backfill or replay (which rewrites files compaction may be merging)
on top of the run lock; vacuum, so it never deletes the files of a compaction that has
not committed yet.

Where the state location is a local path, the lock is an OS file lock (flock) on a
local file: the kernel releases it when the holder dies, even by SIGKILL, so a
crashed run never leaves a stale lock behind.

Where the state location is an object store (s3://), runners on different hosts share
it, and a local file guards nothing: a run holds a lease kept in the store itself
(`strata.store.lease`), renewed while it runs and taken over once its holder is gone. A run
that lost its lease finds out from `RunLock.check()`, which callers run before each
commit.

A check before an act leaves a gap: a holder paused right after its check acts when
it wakes, whoever holds the lease by then. Where that would destroy data, the act
itself is made conditional on `RunLock.fence`, a fencing token every later holder
exceeds, with the holder's run id beside it (`strata.store.fencing`; compaction's
commits and vacuum's fences, `strata.store.delta`, `strata.store.iceberg_swap`); an
flock cannot be taken from a paused holder, so it has none. The maintenance lease's
token also starts above every fence the tables hold (`floor`), so that the lease's
folder can be removed without the next runs being refused for fences their
predecessors left.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from strata.errors import LockBusy
from strata.log import get_logger
from strata.store.fencing import Fence
from strata.store.places import Places

logger = get_logger(__name__)


class RunLock(Protocol):
    """What a run holds while it runs."""

    @property
    def token(self) -> int | None:
        """The fencing token: higher for every later holder; None where none can take over."""

    @property
    def fence(self) -> Fence | None:
        """The fencing token with the holder's run id; None where none can take over."""

    def check(self) -> None:
        """Raise `LeaseLost` if this run no longer holds the lock; call before each commit."""


class FileLock:
    """A held flock: the kernel keeps it until the process ends, so it cannot be lost."""

    def __init__(self, path: Path) -> None:
        """Describe a held lock.

        Args:
            path: The lock file.
        """
        self.path = path

    @property
    def token(self) -> None:
        """None: nobody takes an flock over from a live holder, paused or not."""
        return None

    @property
    def fence(self) -> None:
        """None: there is no holder to fence out."""
        return None

    def check(self) -> None:
        """Nothing to do: an flock held by a live process cannot be taken from it."""


class BothLocks:
    """Two held locks checked as one: a backfill holds the run and maintenance locks."""

    def __init__(self, first: RunLock, second: RunLock) -> None:
        """Hold both.

        Args:
            first: One held lock.
            second: The other.
        """
        self.first, self.second = first, second

    @property
    def token(self) -> int | None:
        """The first lock's: a pair fences its work by the lock it names first."""
        return self.first.token

    @property
    def fence(self) -> Fence | None:
        """The first lock's fence."""
        return self.first.fence

    def check(self) -> None:
        """Raise `LeaseLost` if either lock is no longer held."""
        self.first.check()
        self.second.check()


@contextmanager
def run_lock(
    places: Places, what: str = "run", floor: Callable[[], int] | None = None
) -> Iterator[RunLock]:
    """Hold the pipeline's run lock, or fail at once if another run holds it.

    A local state location gets an flock on its lock file; an object-store state
    location gets a lease under `<state location>/lease/` (see `strata.store.lease`),
    and `lock_dir` is not used.

    Args:
        places: The pipeline's places (its state location and lock).
        what: `run`, or `maintenance` for the maintenance lock (beside the run lock's
            file, `<name>.maintenance.lock`; under `<state location>/maintenance-lease/`).
        floor: For a lease, reads the highest fence the tables to be touched hold; the
            lease's fencing token starts above it. Not called for an flock.

    Yields:
        The held lock; call its `check()` before each commit.

    Raises:
        LockBusy: Naming the holder, if another run holds the lock.
        LeaseUnavailable: If the object store could not be reached to take the lease.
    """
    state = places.state
    path = state.lock_path
    if path is not None:
        if what != "run":
            path = path.with_suffix(f".{what}.lock")
        with _flock(path, places.pipeline, what) as lock:
            yield lock
        return
    from strata.store.lease import hold_lease

    location = f"{state.uri}/{'lease' if what == 'run' else what + '-lease'}"
    if state.lock_dir:
        logger.warning(
            "pipeline %s: lock_dir is not used, because the state location is an object "
            "store where runs hold a lease under %s; remove lock_dir",
            places.pipeline,
            location,
        )
    with hold_lease(location, state.options, places.pipeline, state.lease_s, what, floor) as lease:
        yield lease


@contextmanager
def lock_when_free(places: Places, what: str, wait_s: float) -> Iterator[RunLock]:
    """Hold a lock as `run_lock` does, waiting up to `wait_s` for its holder to finish.

    Raises:
        LockBusy: If the lock is still held after `wait_s`.
    """
    deadline = time.monotonic() + wait_s
    while True:
        with ExitStack() as stack:
            try:
                held = stack.enter_context(run_lock(places, what))
            except LockBusy:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(_WAIT_POLL_S)
                continue
            yield held
            return


_WAIT_POLL_S = 1.0


@contextmanager
def _flock(path: Path, pipeline: str, what: str) -> Iterator[FileLock]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = Path(path).read_text().strip() or "{}"
            raise LockBusy(
                f"pipeline {pipeline}: another {what} is in flight ({holder}); nothing was done. "
                "Wait for it to finish, or check that process if it seems stuck."
            ) from None
        os.ftruncate(fd, 0)
        os.write(
            fd,
            json.dumps(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "since": datetime.now(UTC).isoformat(timespec="seconds"),
                }
            ).encode(),
        )
        yield FileLock(path)
    finally:
        os.close(fd)
