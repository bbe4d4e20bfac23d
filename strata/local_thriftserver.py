"""A local Spark Thrift Server (HiveServer2) on the same metastore, from the pyspark wheel.

It answers HiveServer2 clients (PyHive, beeline, JDBC) with Spark SQL over the tables
the metastore lists: what a Presto/Hive-style client sees of what Strata committed.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from strata.local_broker import free_port

MAIN_CLASS = "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2"


class LocalThriftServer:
    """HiveServer2 (NOSASL) on a loopback port, reading a given metastore."""

    def __init__(self, directory: Path, metastore_uri: str, port: int | None = None) -> None:
        """Choose the working directory, the metastore and the port.

        Args:
            directory: Working directory (Spark's scratch files and the log).
            metastore_uri: `thrift://host:port` of the metastore to read.
            port: Port to listen on; a free one if None.
        """
        self.directory = directory.resolve()
        self.metastore_uri = metastore_uri
        self.port = port or free_port()
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 180.0) -> LocalThriftServer:
        """Start the server and wait until it accepts connections."""
        self.directory.mkdir(parents=True, exist_ok=True)
        submit = Path(sys.executable).parent / "spark-submit"
        command = [
            str(submit),
            "--class",
            MAIN_CLASS,
            "--master",
            "local[2]",
            "--driver-memory",
            "768m",
            "--conf",
            f"spark.hadoop.hive.metastore.uris={self.metastore_uri}",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            f"spark.sql.warehouse.dir={self.directory / 'spark-warehouse'}",
            "--hiveconf",
            f"hive.server2.thrift.port={self.port}",
            "--hiveconf",
            "hive.server2.thrift.bind.host=127.0.0.1",
            "--hiveconf",
            "hive.server2.authentication=NOSASL",
            "spark-internal",
        ]
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
        log = (self.directory / "thriftserver.log").open("ab")
        self._proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.directory
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            with socket.socket() as s:
                s.settimeout(0.2)
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = (self.directory / "thriftserver.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the thrift server did not start; its log ends with:\n{tail}")
            time.sleep(0.3)

    def stop(self) -> None:
        """Stop the server."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def __enter__(self) -> LocalThriftServer:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
