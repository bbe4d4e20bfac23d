"""The faults the tests inject into real processes, through the seam `strata.faults` names.

A process is killed (SIGKILL, as an OOM killer or a lost node would), frozen (SIGSTOP,
as a long pause of its host or VM would, until the test sends SIGCONT) or fails once (a
task attempt that fails and is retried) at a named point; or its read loses one message,
as a faulty consumer would.

A test arms the processes it starts by their environment: `armed` returns this
module's variables and `SITE` on PYTHONPATH, where `sitecustomize` installs `Injected`
into `strata.faults` when a process imports it. That reaches every process of a run:
the `strata` command or spark-submit's driver, and the Spark Python workers, which
inherit the environment (give a standalone cluster's executors the same variables
through `spark.executorEnv.*`). A fault in the test's own process is installed
directly, with `installed`.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.compute as pc

from strata import faults

if TYPE_CHECKING:
    import pyarrow as pa

# The tests' own variables; nothing in `strata` reads them.
CRASH_AT = "STRATA_CRASH_AT"
STOP_AT = "STRATA_STOP_AT"
FAIL_ONCE_AT = "STRATA_FAIL_ONCE_AT"
# A marker file that makes a fault happen once: the first process to create it is hit,
# later ones (a retried task, a re-run) pass. Required to fail once, optional otherwise.
ONCE_MARKER = "STRATA_FAIL_ONCE_MARKER"
# `topic:partition:offset` of one message the read drops as if the consumer had never
# delivered it.
READ_SKIP = "STRATA_READ_SKIP"
# A topic whose messages make every read of them fail, as a topic the client may not
# read would: a task's failure bound to one table of a routed pipeline.
READ_FAIL_TOPIC = "STRATA_READ_FAIL_TOPIC"

# The directory whose `sitecustomize` installs the faults when a process imports strata.
SITE = Path(__file__).resolve().parent / "site"


@dataclass(frozen=True)
class Injected(faults.Handler):
    """Faults at named points of `strata.faults.POINTS`, and one message dropped.

    Attributes:
        crash_at: The point where the process kills itself with SIGKILL.
        stop_at: The point where it stops itself with SIGSTOP.
        fail_once_at: The point where it raises once (needs `once`).
        once: A marker file: only the first process to reach its point is hit, and
            the file names the point and that process's id.
        skip: `(topic, partition, offset)` of a message the read never sees.
        fail_topic: A topic whose messages, delivered, fail the read every time.
    """

    crash_at: str | None = None
    stop_at: str | None = None
    fail_once_at: str | None = None
    once: str | None = None
    skip: tuple[str, int, int] | None = None
    fail_topic: str | None = None

    def __post_init__(self) -> None:
        for point in (self.crash_at, self.stop_at, self.fail_once_at):
            # A misspelt point would arm nothing, and the test would prove nothing.
            if point is not None and point not in faults.POINTS:
                raise ValueError(f"{point!r} is not a point of strata.faults")
        if self.fail_once_at is not None and self.once is None:
            raise ValueError("a failure once needs a marker file (`once`)")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Injected | None:
        """The faults a process's environment arms; None when it arms none."""
        skip = None
        if env.get(READ_SKIP):
            topic, partition, offset = env[READ_SKIP].rsplit(":", 2)
            skip = (topic, int(partition), int(offset))
        crash, stop, fail = (env.get(name) or None for name in (CRASH_AT, STOP_AT, FAIL_ONCE_AT))
        fail_topic = env.get(READ_FAIL_TOPIC) or None
        if crash is None and stop is None and fail is None and skip is None and not fail_topic:
            return None
        return cls(crash, stop, fail, env.get(ONCE_MARKER) or None, skip, fail_topic)

    def env(self) -> dict[str, str]:
        """The variables that arm these faults in another process."""
        values = {
            CRASH_AT: self.crash_at,
            STOP_AT: self.stop_at,
            FAIL_ONCE_AT: self.fail_once_at,
            ONCE_MARKER: self.once,
            READ_SKIP: None if self.skip is None else ":".join(map(str, self.skip)),
            READ_FAIL_TOPIC: self.fail_topic,
        }
        return {k: v for k, v in values.items() if v is not None}

    def reached(self, point: str) -> None:
        crash, stop, fail = (point == p for p in (self.crash_at, self.stop_at, self.fail_once_at))
        if not (crash or stop or fail) or not self._first(point):
            return
        if crash:
            os.kill(os.getpid(), signal.SIGKILL)
        if stop:
            os.kill(os.getpid(), signal.SIGSTOP)
        if fail:
            raise RuntimeError(f"injected failure at {point}")

    def delivered(self, messages: pa.Table) -> pa.ChunkedArray | None:
        if (
            self.fail_topic is not None
            and pc.any(pc.equal(messages.column("_topic"), self.fail_topic)).as_py()
        ):
            raise RuntimeError(f"injected: topic {self.fail_topic} may not be read")
        if self.skip is None:
            return None
        topic, partition, offset = self.skip
        hit = pc.and_(
            pc.and_(
                pc.equal(messages.column("_topic"), topic),
                pc.equal(messages.column("_partition"), partition),
            ),
            pc.equal(messages.column("_offset"), offset),
        )
        return pc.invert(hit)

    def _first(self, point: str) -> bool:
        """Whether this process is the first to reach a once-only fault (or it is not one)."""
        if self.once is None:
            return True
        # O_EXCL: of several task attempts reaching the point at once, exactly one is hit.
        try:
            fd = os.open(self.once, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as out:
            out.write(f"{point} {os.getpid()}")  # the pid: which process a test must break
        return True


def armed(
    *,
    crash_at: str | None = None,
    stop_at: str | None = None,
    fail_once_at: str | None = None,
    once: Path | None = None,
    skip: tuple[str, int, int] | None = None,
    fail_topic: str | None = None,
) -> dict[str, str]:
    """The environment variables that arm faults in the processes started with them.

    Args:
        crash_at: A point where the process kills itself with SIGKILL.
        stop_at: A point where it stops itself with SIGSTOP.
        fail_once_at: A point where it raises, once (needs `once`).
        once: The marker file that lets only the first process reaching its point be hit.
        skip: `(topic, partition, offset)` of a message the read never sees.
        fail_topic: A topic whose messages fail every read of them.

    Returns:
        The variables, and PYTHONPATH with `SITE` first (this process's PYTHONPATH after
        it), to add to the process's environment.
    """
    handler = Injected(
        crash_at, stop_at, fail_once_at, None if once is None else str(once), skip, fail_topic
    )
    path = [str(SITE), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**handler.env(), "PYTHONPATH": os.pathsep.join(path)}


def install_from_env() -> None:
    """Install the faults this process's environment arms, if any, into `strata.faults`."""
    handler = Injected.from_env(os.environ)
    if handler is not None:
        faults.install(handler)


@contextmanager
def installed(handler: faults.Handler) -> Iterator[None]:
    """Install a handler in this process for the block, then put back the one before."""
    previous = faults.install(handler)
    try:
        yield
    finally:
        faults.install(previous)
