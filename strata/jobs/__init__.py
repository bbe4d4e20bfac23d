"""Entry points that Spark runs: `spark-submit "$(python -m strata.jobs ingest)" ...`.

They ship inside the package, so the file spark-submit is given is the one installed
with Strata (on the driver's host), never a copy beside a DAG file. A checkout's
top-level `jobs/` holds thin files that hand over to these, for spark-submit from the
project's folder; the wheel does not carry them.
"""

from __future__ import annotations

from importlib.util import find_spec


def job_path(name: str = "ingest") -> str:
    """The installed file of a job, the application argument of spark-submit.

    Args:
        name: The job module in this package.

    Returns:
        The absolute path of the module's file.

    Raises:
        ValueError: If there is no such job.
    """
    spec = find_spec(f"strata.jobs.{name}")
    if spec is None or spec.origin is None:
        raise ValueError(f"no Strata job named {name!r}; the jobs are: ingest")
    return spec.origin
