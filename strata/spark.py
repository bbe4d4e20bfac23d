"""The Spark session and the execution of a batch's tasks.

Spark spreads the splits over executors, retries failed tasks, and scales out on a
cluster. It carries only task descriptions out and file metadata back: rows stay
in the Python workers, in Arrow.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from functools import partial
from typing import TYPE_CHECKING

from strata.config import PipelineConfig
from strata.task import SplitJob, SplitResult, map_split, reduce_rows, run_split

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class JavaMissing(Exception):
    """No suitable Java runtime for Spark."""


def require_java() -> str:
    """Check for Java 17 or newer, as Spark 4 needs.

    Returns:
        The Java version string.

    Raises:
        JavaMissing: With the fix, if Java is absent or too old.
    """
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise JavaMissing(
            "java not found: Spark needs Java 17 or newer. Install openjdk-17-jre-headless "
            "(Debian/Ubuntu) or set JAVA_HOME to a JDK 17."
        )
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaMissing(
            f"{java} -version failed ({exc}); Spark needs a working Java 17+"
        ) from None
    match = re.search(r'version "(\d+)', out)
    major = int(match.group(1)) if match else 0
    if major < 17:
        raise JavaMissing(f"{java} is Java {major or 'unknown'}; Spark needs Java 17 or newer")
    return out.splitlines()[0] if out else "java"


def default_tasks(cfg: PipelineConfig) -> int:
    """Tasks per batch: the configured number, or the cores of a local master."""
    if cfg.spark.tasks:
        return cfg.spark.tasks
    match = re.match(r"local\[(\d+|\*)", cfg.spark.master)
    if match:
        return os.cpu_count() or 2 if match.group(1) == "*" else int(match.group(1))
    return 2


def build_session(cfg: PipelineConfig) -> SparkSession:
    """The active Spark session, or a new one built from the pipeline's settings.

    Under spark-submit the session already exists and its settings win.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    require_java()
    # Workers must run the same interpreter (the virtualenv's) as the driver.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if cfg.spark.master.startswith("local"):
        # A local session needs no network beyond loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(cfg.spark.master)
        .appName(f"strata-{cfg.name}")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.memory", "1g")
        .config("spark.ui.showConsoleProgress", "false")
        # A speculative copy of a task would read its ranges from Kafka a second time
        # for nothing: each attempt writes files of its own names, and only the
        # successful attempt's files are committed, so it buys no safety either.
        .config("spark.speculation", "false")
    )
    for key, value in cfg.spark.conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def execute(
    spark: SparkSession, jobs: list[SplitJob], label: str, reducers: int = 0
) -> list[SplitResult]:
    """Run one task per split and collect their metadata.

    Args:
        spark: The session.
        jobs: The splits.
        label: Printed with progress lines.
        reducers: 0 for the `per_task` layout; otherwise the `shuffle` layout with
            this many writing tasks.

    Returns:
        Each task's result (with `shuffle`, plus one holding the reducers' files).
    """
    sc = spark.sparkContext
    sc.setJobDescription(label)
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
            sys.stderr.write(
                f"strata: {label}: {done}/{len(jobs)} tasks done, {running} running, "
                f"{time.monotonic() - began:.0f}s\n"
            )

    watcher = threading.Thread(target=report, daemon=True)
    watcher.start()
    try:
        splits = sc.parallelize(jobs, len(jobs))
        if not reducers:
            return splits.map(run_split).collect()
        cfg, batch = jobs[0].cfg, jobs[0].batch
        out = (
            splits.flatMap(map_split)
            .partitionBy(reducers)
            .mapPartitionsWithIndex(partial(reduce_rows, cfg, batch))
            .collect()
        )
        results: list[SplitResult] = [payload for kind, payload in out if kind == "meta"]
        files = [f for kind, payload in out if kind == "files" for f in payload]
        results.append(SplitResult(task=-1, ranges=[], files={"table": files}, seconds=0.0))
        return results
    finally:
        stop.set()
