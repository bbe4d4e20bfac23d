"""One run per pipeline at a time.

The lock is an OS file lock (flock) on a local file: the kernel releases it when the
holder dies, even by SIGKILL, so a crashed run never leaves a stale lock behind.
Across hosts, Airflow's `max_active_runs=1` serialises runs, and the Delta app
transaction makes a duplicate commit of a batch a no-op.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path


class LockBusy(Exception):
    """Another run of the same pipeline is in flight."""


@contextmanager
def run_lock(path: Path, pipeline: str) -> Iterator[None]:
    """Hold the pipeline's run lock, or fail at once if another run holds it.

    Args:
        path: The lock file.
        pipeline: Pipeline name, for the message.

    Raises:
        LockBusy: Naming the holder, if the lock is taken.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = Path(path).read_text().strip() or "{}"
            raise LockBusy(
                f"pipeline {pipeline}: another run is in flight ({holder}); nothing was done. "
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
        yield
    finally:
        os.close(fd)
