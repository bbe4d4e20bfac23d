"""Strata's logging: every module logs under the `strata` logger; processes choose the output.

As a library (inside Airflow, a notebook, an application) Strata adds no handler: its
records go where the host's logging sends them, and `logging.getLogger("strata")`
routes or silences them as Spark's and Airflow's users expect. The processes Strata
owns (the `strata` command, the spark-submit job, the Python workers of Spark tasks)
call `configure`, which writes `strata: message` lines to stderr, today's human
output, at the level `STRATA_LOG_LEVEL` names (INFO by default).
"""

from __future__ import annotations

import logging
import os
import sys

LEVEL_ENV = "STRATA_LOG_LEVEL"

_ROOT = logging.getLogger("strata")


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
