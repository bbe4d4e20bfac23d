"""Strata's configuration check: this DAG file fails to import while a pipeline file is malformed.

It defines no DAG. Airflow records import errors per DAG file and hides every DAG of a
file that fails, so the shared `strata_ingest.py` leaves a malformed pipeline out and
the other pipelines' DAGs still load; this file is where Airflow's import errors then
name the malformed pipeline file, the key and the fix, one line per pipeline. Once the
files are mended, its import error clears on the next parse and the pipeline's DAG
comes back.
"""

from __future__ import annotations

import os
from pathlib import Path

from strata.config import load_pipelines
from strata.errors import ConfigError

CONF_DIR = os.environ.get("STRATA_CONF_DIR") or str(Path(__file__).resolve().parents[1] / "conf")


def malformed(conf_dir: str) -> list[str]:
    """Each pipeline of `conf_dir` whose configuration does not load, with why."""
    return [
        f"pipeline {name}: {loaded}"
        for name, loaded in load_pipelines(conf_dir).items()
        if isinstance(loaded, ConfigError)
    ]


_PROBLEMS = malformed(CONF_DIR)
if _PROBLEMS:
    raise ConfigError(
        "these pipelines have no DAGs until their files are mended (the others are "
        "scheduled):\n" + "\n".join(_PROBLEMS)
    )
