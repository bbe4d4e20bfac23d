"""Spark's Python daemon, importing PySpark from its installed package, not Spark's zip.

Spark starts its Python workers with `pyspark.zip`, `py4j-*.zip` and the Spark core
jar first on `PYTHONPATH`. Python compiles every module imported from a zip anew in
each process, as it cannot cache bytecode there: the daemon and each worker it forks
spent seconds of CPU compiling PySpark before reading a message, on every batch.

When that zip is the one of the PySpark installed in this interpreter (a `pip install
pyspark`, as every local master here and `make dist`'s executors have), it is the same
code, so the zips are moved behind the installed packages, whose bytecode is compiled
once, and the jars, which then hold no Python, are dropped: an import that fails (an
optional dependency) would otherwise read the jar's whole directory in every worker.
Any other Spark (a cluster's own installation) keeps its order: its zip must win.
Then Spark's own daemon runs unchanged; nothing else is imported before it forks, as
it requires (a library that starts threads must not be imported first).
"""

from __future__ import annotations

import importlib.machinery
import os
import sys


def prefer_installed_pyspark(path: list[str]) -> list[str]:
    """`sys.path` with Spark's zips last and its jars out, if the zip is the installed PySpark's.

    Args:
        path: The interpreter's search path.

    Returns:
        The path to use: reordered, or as it was.
    """
    archives = [p for p in path if p.endswith((".zip", ".jar"))]
    zipped = [p for p in archives if os.path.basename(p) == "pyspark.zip"]
    if not zipped:
        return path
    # Other zips (a job's `--py-files`) keep their place: they are the job's code.
    spark = [p for p in archives if p.endswith(".jar") or _spark_zip(os.path.basename(p))]
    rest = [p for p in path if p not in spark]
    spec = importlib.machinery.PathFinder.find_spec("pyspark", rest)
    if spec is None or spec.origin is None:
        return path
    installed = os.path.realpath(os.path.dirname(spec.origin))
    # `<SPARK_HOME>/python/lib/pyspark.zip`: a pip-installed Spark's home is the package.
    home = os.path.realpath(os.path.join(os.path.dirname(zipped[0]), "..", ".."))
    if home != installed:
        return path
    return rest + [p for p in spark if p.endswith(".zip")]


def _spark_zip(name: str) -> bool:
    return name == "pyspark.zip" or (name.startswith("py4j-") and name.endswith("-src.zip"))


def main() -> None:
    """Reorder the search path, then run Spark's daemon as Spark would."""
    sys.path[:] = prefer_installed_pyspark(sys.path)
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
