"""Strata's logging: every module logs under the `strata` logger; processes choose the output.

As a library (inside Airflow, a notebook, an application) Strata adds no handler: its
records go where the host's logging sends them, and `logging.getLogger("strata")`
routes or silences them as Spark's and Airflow's users expect. The processes Strata
owns (the `strata` command, the spark-submit job, the Python workers of Spark tasks)
call `configure`, which writes `strata: message` lines to stderr, today's human
output, at the level `STRATA_LOG_LEVEL` names (INFO by default).

Every module takes its logger from `get_logger`, never from `logging.getLogger`: the
logger then redacts each record (`strata.config.secrets.RedactingFilter`) before any
handler, Strata's or its host's, formats it, so no secret reaches a log.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Hashable

from strata.config.secrets import RedactingFilter

LEVEL_ENV = "STRATA_LOG_LEVEL"

_REDACT = RedactingFilter()


def get_logger(name: str) -> logging.Logger:
    """The logger of a Strata module, redacting every record it makes.

    Args:
        name: The module's `__name__` (under `strata`).

    Returns:
        The logger, with the redaction filter installed once.
    """
    logger = logging.getLogger(name)
    if _REDACT not in logger.filters:
        logger.addFilter(_REDACT)
    return logger


_ROOT = get_logger("strata")


def configure() -> None:
    """Write Strata's records to stderr as `strata: message`, once per process.

    A process whose `strata` logger already has a handler of its own (set up by its
    host) is left as it is.
    """
    if any(not isinstance(h, logging.NullHandler) for h in _ROOT.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("strata: %(message)s"))
    _ROOT.addHandler(handler)
    level = os.environ.get(LEVEL_ENV, "INFO").upper()
    _ROOT.setLevel(level if level in logging.getLevelNamesMapping() else logging.INFO)
    # Records stop here: a host that also logs the root logger would print them twice.
    _ROOT.propagate = False


class RateLimit:
    """Lets the same message through at most once per window, counting the repeats held back.

    A client that retries a dead connection every 50 ms says the same thing hundreds of
    times a minute; one line per window, with the number left out, says it as well.
    Safe to share between threads: librdkafka logs from its own.

    Args:
        window_s: How long a message is held back after it was let through.
        clock: Monotonic seconds; tests pass their own.
    """

    # Past this many distinct messages, those last let through more than a window ago
    # are forgotten, so a stream of distinct messages cannot grow the table for ever.
    _KEEP = 1000

    def __init__(self, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        # key -> (when last let through, repeats held back since)
        self._seen: dict[Hashable, tuple[float, int]] = {}

    def admit(self, key: Hashable) -> int | None:
        """Whether a message may be logged now.

        Args:
            key: What makes two messages the same one.

        Returns:
            None to hold it back; else how many repeats were held back since it last
            went through (0 the first time).
        """
        now = self._clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and now - seen[0] < self.window_s:
                self._seen[key] = (seen[0], seen[1] + 1)
                return None
            if len(self._seen) >= self._KEEP:
                self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self.window_s}
            self._seen[key] = (now, 0)
            return 0 if seen is None else seen[1]
