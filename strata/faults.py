"""Faults the crash tests inject into real processes, switched on by environment variables.

Each is a no-op unless its variable names the step the code is at. The process kills
itself with SIGKILL (as an OOM killer or a lost node would), freezes with SIGSTOP (as
a long pause of its host or VM would, until something sends SIGCONT), or raises once
(a marker file remembers), as a task attempt that fails and is retried. They live in
the product so that the tests break the real code paths, not stand-ins for them.
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "STRATA_CRASH_AT"
STOP_ENV = "STRATA_STOP_AT"
FAIL_ONCE_ENV = "STRATA_FAIL_ONCE_AT"
# A marker file that makes a fault happen once: the first process to create it is hit,
# later ones (a retried task, a re-run) pass. Required by FAIL_ONCE_ENV, optional for
# the others.
FAIL_ONCE_MARKER_ENV = "STRATA_FAIL_ONCE_MARKER"
# `topic:partition:offset` of one message the read drops as if the consumer had never
# delivered it, which gap verification must catch.
SKIP_ENV = "STRATA_READ_SKIP"


def _first(step: str) -> bool:
    """Whether this process is the first to reach a once-only fault (or it is not one)."""
    marker = os.environ.get(FAIL_ONCE_MARKER_ENV, "")
    if not marker:
        return True
    # O_EXCL: of several task attempts reaching the step at once, exactly one is hit.
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as out:
        out.write(f"{step} {os.getpid()}")  # the pid: which process a test must break
    return True


def crash_point(step: str) -> None:
    """Die by SIGKILL here, freeze, or fail once, if the crash tests asked for it."""
    crash = os.environ.get(CRASH_ENV) == step
    stop = os.environ.get(STOP_ENV) == step
    fail = os.environ.get(FAIL_ONCE_ENV) == step and bool(os.environ.get(FAIL_ONCE_MARKER_ENV))
    if not (crash or stop or fail) or not _first(step):
        return
    if crash:
        os.kill(os.getpid(), signal.SIGKILL)
    if stop:
        os.kill(os.getpid(), signal.SIGSTOP)
    if fail:
        raise RuntimeError(f"injected failure at {step}")
