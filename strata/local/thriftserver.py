"""A local Spark Thrift Server (HiveServer2) on the same metastore, from the pyspark wheel.

It answers HiveServer2 clients (PyHive, beeline, JDBC) with Spark SQL over the tables
the metastore lists: what a Presto/Hive-style client sees of what Strata committed.
It runs with delta-spark (`strata.local.delta_spark`, the jars `make setup` fetched), so
a Delta table the metastore lists is read through Delta's log, at its current snapshot,
as Spark users read it, not as the directory of every Parquet file it ever held.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from strata.local.service import LocalService

MAIN_CLASS = "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2"


class LocalThriftServer(LocalService):
    """HiveServer2 (NOSASL) on a loopback port, reading a given metastore."""

    name = "thrift server"

    def __init__(self, directory: Path, metastore_uri: str, port: int | None = None) -> None:
        """Choose the working directory, the metastore and the port.

        Args:
            directory: Working directory (Spark's scratch files and the log).
            metastore_uri: `thrift://host:port` of the metastore to read.
            port: Port to listen on; a free one if None.
        """
        self.directory = directory.resolve()
        super().__init__(port, self.directory / "thriftserver.log")
        self.metastore_uri = metastore_uri

    def start(self, timeout: float = 180.0) -> LocalThriftServer:
        """Start the server and wait until it accepts connections.

        Raises:
            DeltaSparkMissing: If `make setup` has not fetched the delta-spark jars.
        """
        from strata.local.delta_spark import session_settings

        self.directory.mkdir(parents=True, exist_ok=True)
        submit = Path(sys.executable).parent / "spark-submit"
        settings = {
            "spark.hadoop.hive.metastore.uris": self.metastore_uri,
            "spark.ui.enabled": "false",
            "spark.sql.warehouse.dir": str(self.directory / "spark-warehouse"),
            # Timestamps as Trino over the same tables shows them: Strata's partitions are
            # UTC hours, and the machine's own zone would shift every timestamp shown.
            "spark.sql.session.timeZone": "UTC",
            # Delta's extension and session catalog: the metastore's Delta tables as Delta.
            **session_settings(),
        }
        # Delta's jars on the driver's own class path, not `spark.jars`: closing a
        # client's session (Hive's SessionState.close) closes URL class loaders down to
        # the server's own, the one `spark.jars` fills among them, and a Delta class not
        # loaded by then is not found after (NoClassDefFoundError when a later client
        # reads a Delta table).
        jars = settings.pop("spark.jars").split(",")
        settings["spark.driver.extraClassPath"] = os.pathsep.join(jars)
        hive = {
            "hive.server2.thrift.port": str(self.port),
            "hive.server2.thrift.bind.host": "127.0.0.1",
            "hive.server2.authentication": "NOSASL",
        }
        command = [str(submit), "--class", MAIN_CLASS, "--master", "local[2]"]
        command += ["--driver-memory", "768m"]
        for key, value in settings.items():
            command += ["--conf", f"{key}={value}"]
        for key, value in hive.items():
            command += ["--hiveconf", f"{key}={value}"]
        command.append("spark-internal")
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
        self._spawn(command, cwd=self.directory, env=env)
        self._wait(timeout)
        return self
