"""delta-spark in a Spark session of its own, in a child process, for the tests.

The suite's shared `spark` session is the job's (`strata.spark.session`), without
delta-spark, and a process has one SparkContext. delta-spark's jars, its SQL extension
and its session catalog are static settings, read only when a context starts: on the
running shared session, `SparkSession.builder.config(...)` returns that same session
unchanged, `newSession()` parses no Delta SQL (`DESCRIBE HISTORY` fails), and jars
added later (`addJar`) never reach the driver's data source lookup
(`format("delta")` fails). Putting them on the shared session's builder instead would
run every Spark test under Delta's parser, analyzer rules and catalog, which Strata's
jobs do not have, and make every one need the jars. So delta-spark runs beside it: a
child process (spawned, so nothing of this process's Spark is inherited) holds a
session started with `strata.local.delta_spark.session_settings`, and answers
statements and calls sent over a pipe.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Self

import pyarrow as pa

from strata.local.service import Supervised


class DeltaSparkError(Exception):
    """What failed in the child's session: the Spark error's class and first lines."""


def _serve(conn: Connection, directory: str) -> None:
    """The child: a session with delta-spark, answering requests until told to stop."""
    from strata.local.delta_spark import session_settings
    from strata.spark.jvm import driver_options, require_java
    from strata.spark.session import local_session, session_defaults

    try:
        settings = {
            **session_defaults(driver_options(require_java())),
            "spark.sql.shuffle.partitions": "2",
            # Its warehouse and scratch space in the directory given, not the working one.
            "spark.sql.warehouse.dir": str(Path(directory) / "warehouse"),
            "spark.local.dir": str(Path(directory) / "tmp"),
            **session_settings(),
        }
        spark = local_session("local[2]", settings, "strata-delta-spark")
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ok", spark.version))
    while True:
        kind, *args = conn.recv()
        if kind == "stop":
            break
        try:
            if kind == "sql":
                result: Any = spark.sql(args[0]).toArrow()
            else:
                fn, fn_args = args
                result = fn(spark, *fn_args)
            conn.send(("ok", result))
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
            text = "\n".join(str(exc).splitlines()[:5])
            conn.send(("error", f"{type(exc).__name__}: {text}"))
    spark.stop()
    conn.send(("ok", None))


class DeltaSpark(Supervised):
    """A session with delta-spark in a child process; a context manager.

    Attributes:
        version: The Spark version the child's session runs.
    """

    def __init__(self, directory: Path, timeout: float = 300.0) -> None:
        """Choose where the child's session keeps its warehouse and scratch space.

        Args:
            directory: A directory of its own.
            timeout: Seconds to wait for the session to start, and for each request.
        """
        self.directory = directory
        self.timeout = timeout
        self.version = ""
        self._conn: Connection | None = None
        self._child: multiprocessing.process.BaseProcess | None = None

    def start(self) -> Self:
        """Start the child and wait until its session is up.

        Raises:
            DeltaSparkError: If the session did not start (the jars missing, say).
        """
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        self._child = context.Process(
            target=_serve, args=(theirs, str(self.directory)), name="delta-spark", daemon=True
        )
        self._child.start()
        theirs.close()
        self._conn = ours
        self.version = str(self._answer())
        return self

    def sql(self, statement: str) -> pa.Table:
        """Run one statement in the child's session; its answer as an Arrow table."""
        return self._ask("sql", statement)  # type: ignore[no-any-return]

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:  # noqa: ANN401 - any picklable
        """Run `fn(session, *args)` in the child; `fn` a module-level function, its
        arguments and result picklable (Arrow tables are)."""
        return self._ask("call", fn, args)

    def _ask(self, *request: Any) -> Any:  # noqa: ANN401 - whatever the request answers
        if self._conn is None:
            raise RuntimeError("the delta-spark session is not started")
        self._conn.send(request)
        return self._answer()

    def _answer(self) -> Any:  # noqa: ANN401 - whatever the request answers
        assert self._conn is not None and self._child is not None
        if not self._conn.poll(self.timeout):
            self.stop()
            raise DeltaSparkError(f"the delta-spark session did not answer in {self.timeout}s")
        try:
            status, value = self._conn.recv()
        except EOFError:
            code = self._child.exitcode
            self.stop()
            raise DeltaSparkError(f"the delta-spark process exited ({code})") from None
        if status == "error":
            raise DeltaSparkError(value)
        return value

    def stop(self) -> None:
        """Stop the child's session and the child: politely, then firmly."""
        conn, child, self._conn, self._child = self._conn, self._child, None, None
        if conn is not None:
            try:
                conn.send(("stop",))
                if conn.poll(60):
                    conn.recv()
            except (OSError, EOFError):
                pass  # the child is gone already
            conn.close()
        if child is not None:
            child.join(30)
            if child.is_alive():
                child.kill()
                child.join()


def run_statement(session: Any, statement: str) -> int:  # noqa: ANN401 - a SparkSession
    """Run a statement whose answer Arrow cannot hold (OPTIMIZE's metrics); its row count.

    For `DeltaSpark.call`, in the child's session.
    """
    return len(session.sql(statement).collect())
