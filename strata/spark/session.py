"""The Spark session, and tasks run on it with their progress logged.

Spark spreads the tasks over executors, retries failed ones, and scales out on a
cluster. It carries only task descriptions out and file metadata back: rows stay
in the Python workers, in Arrow. What a batch's tasks are is `strata.batch.task`.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

from strata.config import SparkConfig
from strata.log import get_logger
from strata.spark.jvm import (
    JVM_OPTIONS,
    LOG_OPTION,
    driver_options,
    dump_options,
    require_java,
    start_driver,
)

logger = get_logger(__name__)

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

_Item = TypeVar("_Item")
_Out = TypeVar("_Out")


def default_tasks(spark: SparkConfig, pipeline: str, submits: bool = False) -> int:
    """Tasks per batch: the configured number, the cores of a local master, or the cluster's.

    Never starts Spark: a plan is made (and saved) before any session, by `strata plan`
    and Airflow's plan task too. On a cluster the count comes from the running
    session when there is one (spark-submit's job starts it first), else from the
    Spark properties that size the cluster, else 2 with a warning.

    Args:
        spark: The pipeline's `spark` settings.
        pipeline: The pipeline's name, for the warning.
        submits: Whether Airflow submits the pipeline's job to a cluster
            (`airflow.spark_mode: spark_submit`).
    """
    if spark.tasks:
        return spark.tasks
    submitted = submitted_master()
    # Airflow's plan task of a spark_submit pipeline plans for the connection's
    # cluster, whatever `spark.master` says.
    if submitted or not submits:
        cores = local_cores(submitted or spark.master)
        if cores is not None:
            return cores
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    # A local session in this process (a test's, a notebook's) says nothing of a cluster.
    if active is not None and not (active.sparkContext.master or "local").startswith("local"):
        return cluster_parallelism(active)
    conf = dict(spark.conf)
    if submitted:
        from pyspark import SparkConf

        conf.update(SparkConf().getAll())
    sized = parallelism_from_conf(conf)
    if sized:
        return sized
    logger.warning(
        "%s: the cluster's cores are unknown before Spark starts; the batch is split into 2 "
        "tasks. Set spark.tasks (or spark.default.parallelism) to its cores",
        pipeline,
    )
    return 2


def local_cores(master: str) -> int | None:
    """The cores a `local`, `local[N]`, `local[N,F]` or `local[*]` master runs; None otherwise."""
    match = re.match(r"local(?:\[(\d+|\*)|$)", master)
    if match is None:
        return None
    if match.group(1) is None:
        return 1
    return (os.cpu_count() or 2) if match.group(1) == "*" else int(match.group(1))


def parallelism_from_conf(conf: dict[str, str]) -> int | None:
    """The cores the Spark properties give a job, when they say: None if they do not."""

    def number(key: str) -> int | None:
        value = conf.get(key, "")
        return int(value) if value.isdigit() and int(value) > 0 else None

    if number("spark.default.parallelism"):
        return number("spark.default.parallelism")
    if number("spark.cores.max"):  # standalone
        return number("spark.cores.max")
    cores = number("spark.executor.cores")
    dynamic = conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true"
    executors = number(
        "spark.dynamicAllocation.maxExecutors" if dynamic else "spark.executor.instances"
    )
    if cores and executors:
        return cores * executors
    return None


def cluster_parallelism(spark: SparkSession, wait_s: float = 60.0) -> int:
    """The cores of a running session's executors.

    The Spark properties decide when they size the job. Otherwise Spark's
    `defaultParallelism` counts registered executors' cores (at least 2), and right
    after the session starts none may have registered yet: the count is read once it
    has not grown for a few seconds. Read once per application.
    """
    sc = spark.sparkContext
    app = sc.applicationId
    if app in _PARALLELISM:
        return _PARALLELISM[app]
    sized = parallelism_from_conf(dict(sc.getConf().getAll()))
    if sized:
        _PARALLELISM[app] = sized
        return sized
    deadline = time.monotonic() + wait_s
    seen, steady_since = 0, time.monotonic()
    while time.monotonic() < deadline:
        # The driver is listed among the executors; the others carry the cores.
        executors = len(sc.statusTracker().getExecutorInfos()) - 1
        if executors != seen:
            seen, steady_since = executors, time.monotonic()
        elif executors > 0 and time.monotonic() - steady_since >= 3:
            break
        time.sleep(0.5)
    _PARALLELISM[app] = max(sc.defaultParallelism, 1)
    return _PARALLELISM[app]


_PARALLELISM: dict[str, int] = {}


def submitted_master() -> str | None:
    """The master spark-submit was given, when this process runs under it."""
    # spark-submit starts the JVM first and hands its properties to the Python driver
    # through the gateway; a session built here starts one of its own.
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects to spark-submit's JVM
    return SparkConf().get("spark.master")


def session_defaults(driver_java_options: str) -> dict[str, str]:
    """Strata's Spark properties for a session it starts; a pipeline's `spark.conf` wins.

    Args:
        driver_java_options: The driver JVM's options (`strata.spark.jvm.driver_options`).
    """
    return {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.python.worker.reuse": "true",
        # Spark's daemon, with PySpark imported from its installed package rather than
        # compiled from Spark's zip in every worker (see strata.spark.daemon).
        "spark.python.daemon.module": "strata.spark.daemon",
        # The quick compiler and the serial collector (see strata.spark.jvm); the driver maps
        # its classes from the class archive when one is built, and logs through Strata's
        # log4j2 configuration.
        "spark.driver.extraJavaOptions": f"{driver_java_options} {LOG_OPTION}",
        "spark.executor.extraJavaOptions": JVM_OPTIONS,
        "spark.driver.memory": "1g",
        "spark.ui.showConsoleProgress": "false",
        # A speculative copy of a task would read its ranges from Kafka a second time
        # for nothing: each attempt writes files of its own names, and only the
        # successful attempt's files are committed, so it buys no safety either.
        "spark.speculation": "false",
    }


def local_session(master: str, settings: dict[str, str], name: str) -> SparkSession:
    """A local session with these properties, its workers on this interpreter, on loopback."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    quiet_known_warnings()
    start_driver({**settings, "spark.master": master, "spark.app.name": name})
    builder = SparkSession.builder.master(master).appName(name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def train_class_archive(dump_to: str) -> None:
    """Run what a batch's driver runs in a fresh JVM, which writes its classes on exit.

    Started in a child process by `strata.spark.jvm.build_class_archive`, with the settings
    of a real run's session so that the archive holds the classes a run loads.
    """
    from pyspark import SparkContext

    spark = local_session("local[2]", session_defaults(dump_options(dump_to)), "strata-archive")
    sc = spark.sparkContext
    # Both layouts' jobs: one task per split, and the shuffle to writing tasks.
    sc.parallelize(range(4), 2).map(lambda x: x * 2).collect()
    sc.parallelize(range(4), 2).flatMap(lambda x: [(x, x)]).partitionBy(2).mapPartitionsWithIndex(
        lambda i, rows: [(i, sum(1 for _ in rows))]
    ).collect()
    gateway = SparkContext._gateway
    spark.stop()
    # The JVM exits, and writes the archive, once its standard input closes.
    if gateway is not None:
        gateway.shutdown()
        gateway.proc.stdin.close()
        gateway.proc.wait(timeout=300)


def build_session(spark: SparkConfig, pipeline: str) -> SparkSession:
    """The active Spark session, or a new one built from the pipeline's settings.

    Under spark-submit the submitted settings win: the pipeline's `spark.master` and
    `spark.conf` fill in only what was not submitted.

    Args:
        spark: The pipeline's `spark` settings.
        pipeline: The pipeline's name (the application's is `strata-<name>`).
    """
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    java = require_java()
    submitted = submitted_master()
    master = submitted or spark.master
    # Workers of a local master run the driver's interpreter; on a cluster the
    # executors' Python is the shipped environment's (`spark.pyspark.python`).
    if master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        # A local session needs no network beyond loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    given = SparkConf() if submitted else None
    settings = {**session_defaults(driver_options(java)), **spark.conf}
    quiet_known_warnings()
    if not submitted:
        start_driver({**settings, "spark.master": master, "spark.app.name": f"strata-{pipeline}"})
    builder = SparkSession.builder
    if given is None or not given.contains("spark.app.name"):
        builder = builder.appName(f"strata-{pipeline}")
    if not submitted:
        builder = builder.master(master)
    for key, value in settings.items():
        if given is None or not given.contains(key):
            builder = builder.config(key, value)
    return builder.getOrCreate()


# PySpark 4.2 warns that it does not yet fully support pandas 3 the first time py4j
# converts an argument (its numpy converter imports `pyspark.testing.utils`, which checks
# the pandas version on import). Strata hands Spark no pandas data: the warning says
# nothing about a run, and it is the only one left out.
_PANDAS_WARNING = r"PySpark does not yet fully support pandas >= 3\.0\.0"


def quiet_known_warnings() -> None:
    """Leave out the one warning PySpark gives every process that starts a session."""
    warnings.filterwarnings("ignore", message=_PANDAS_WARNING, category=FutureWarning)


def run_each(
    spark: SparkSession, fn: Callable[[_Item], _Out], items: list[_Item], label: str
) -> list[_Out]:
    """Run `fn` on each item in a Spark task of its own and collect the results, in order.

    Args:
        spark: The session.
        fn: A module-level function (Spark pickles it by name for the executors).
        items: Its arguments, one task each.
        label: The Spark job's description, printed with progress lines.

    Returns:
        `fn(item)` per item.
    """
    sc = spark.sparkContext
    sc.setJobDescription(label)
    with progress(sc, label, len(items)):
        return sc.parallelize(items, len(items)).map(fn).collect()


@contextmanager
def progress(sc: SparkContext, label: str, total: int) -> Iterator[None]:
    """Log the tasks done and running every 10 s while the block runs."""
    stop = threading.Event()

    def report() -> None:
        began = time.monotonic()
        while not stop.wait(10):
            tracker = sc.statusTracker()
            done = running = 0
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    done += info.numCompletedTasks
                    running += info.numActiveTasks
            logger.info(
                "%s: %s/%s tasks done, %s running, %.0fs",
                label,
                done,
                total,
                running,
                time.monotonic() - began,
            )

    watcher = threading.Thread(target=report, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
