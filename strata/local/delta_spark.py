"""delta-spark, Delta Lake's own Spark reader and writer, for a Spark session that opens
Strata's Delta tables as Spark users do (and as the tests' reference reader).

Its two jars (`delta-spark_2.13` and `delta-storage`, pinned in
`jvm/delta-spark/pom.xml`) are fetched once by `make setup` into the user's cache
(`delta_spark_home`), checked against the committed checksums; nothing here fetches
anything. Version 4.4.0 is built on Spark 4.2.0, the pyspark the project pins: Delta's
catalog calls into Spark's own catalog classes, so a delta-spark built on an older
Spark fails on metastore tables. The 4.4.1 jar that PyPI's `delta-spark` 4.4.1 expects
is not on Maven Central, so that package's `configure_spark_with_delta_pip` cannot be
used.

The jars, the extension and the catalog are static settings of a session: they take
effect only when its SparkContext starts, so a process whose session started without
them cannot add them later (`session_settings`).
"""

from __future__ import annotations

from pathlib import Path

from strata.errors import StrataError
from strata.local.jvm_cache import fetched, jvm_cache

# The version jvm/delta-spark/pom.xml pins (`delta.version`); a unit test holds them equal.
DELTA_VERSION = "4.4.0"
JARS = (f"delta-spark_2.13-{DELTA_VERSION}.jar", f"delta-storage-{DELTA_VERSION}.jar")


class DeltaSparkMissing(StrataError):
    """The delta-spark jars are not in the cache `make setup` fills."""


def delta_spark_home() -> Path:
    """Where `make setup` puts the delta-spark jars: the user's cache, outside any clone."""
    return jvm_cache(f"delta-spark-{DELTA_VERSION}")


def delta_spark_jars() -> list[Path]:
    """The two jars, from the cache `make setup` filled.

    Raises:
        DeltaSparkMissing: If the cache is missing or was never completed.
    """
    what = f"the delta-spark {DELTA_VERSION} jars"
    home = fetched(delta_spark_home().name, what, "delta-spark", DeltaSparkMissing)
    return [home / name for name in JARS]


def session_settings() -> dict[str, str]:
    """The Spark properties of a session with delta-spark: its jars on `spark.jars`,
    Delta's SQL (`DESCRIBE HISTORY`, `delta.`path``...) and its session catalog.

    Raises:
        DeltaSparkMissing: If `make setup` has not fetched the jars.
    """
    return {
        "spark.jars": ",".join(str(jar) for jar in delta_spark_jars()),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    }
