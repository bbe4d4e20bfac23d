"""What every section of `make bench` shares: the load, the project, and the measurement.

The same events (`seed`) and the same pipeline configuration (`strata_project`) for
every program measured, and one way to measure a command (`measure`): wall time, and
CPU and peak memory of its whole process tree, sampled while it runs.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import yaml
from deltalake import DeltaTable

from strata.local.events import click_events, produce
from strata.local.kafka import LocalKafka

ROOT = Path(__file__).resolve().parents[1]


PARTITIONS = 4


S3_OPTIONS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_REGION": "us-east-1",
    "AWS_ALLOW_HTTP": "true",
}


START_MS = 1_763_805_600_000
"""The load's first event time (2025-11-22T10:00:00Z): fixed, so every run lands the same
files, and in the past, which Kafka accepts (it refuses timestamps more than an hour
ahead of its clock)."""

# Every topic keeps what the bench produces: its event times are fixed and long past,
# and Kafka's retention (7 days by default, by message timestamp) would delete them.
TOPIC_CONFIG = {"retention.ms": "-1", "retention.bytes": "-1"}


@contextmanager
def local_kafka(work: Path) -> Iterator[LocalKafka]:
    """Apache Kafka (one KRaft node on loopback) with its log under `work`, for a run.

    Its high watermark is the log end: what a section produces is exactly what a
    program reads. The broker runs outside every measured process tree.
    """
    with LocalKafka(work / "kafka") as broker:
        print(f"Apache Kafka on {broker.bootstrap}", flush=True)
        yield broker


def create_topic(broker: LocalKafka, topic: str, partitions: int) -> None:
    """Create a bench topic that keeps every message (`TOPIC_CONFIG`)."""
    broker.create_topic(topic, partitions, TOPIC_CONFIG)


def measure(
    cmd: list[str],
    env: dict[str, str] | None = None,
    executors: Callable[[], list[psutil.Process]] | None = None,
) -> dict[str, Any]:
    """Run a command; return wall time, CPU of its process tree, peak tree RSS, last JSON line.

    `executors` lists processes outside the command's tree that work for it (a
    cluster's executors and their Python workers): their CPU is added, and their peak
    memory reported apart as `executor_peak_rss`.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.monotonic()
    proc = psutil.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = executor_peak = 0
    cpu_seen: dict[int, float] = {}
    executor_cpu: dict[int, float] = {}
    kinds: dict[int, str] = {}
    done = threading.Event()

    peak_by_kind: dict[str, int] = {}

    def tally(tree: list[psutil.Process], cpu: dict[int, float]) -> int:
        rss = 0
        by_kind: dict[str, int] = {}
        for p in tree:
            try:
                used = p.memory_info().rss
                rss += used
                t = p.cpu_times()
                cpu[p.pid] = t.user + t.system
                # Named at every look: Spark's launcher script becomes the JVM by exec.
                kinds[p.pid] = (
                    "driver" if p.pid == proc.pid else "jvm" if "java" in p.name() else "workers"
                )
                by_kind[kinds[p.pid]] = by_kind.get(kinds[p.pid], 0) + used
            except psutil.NoSuchProcess:
                pass
        for kind, used in by_kind.items():
            peak_by_kind[kind] = max(peak_by_kind.get(kind, 0), used)
        return rss

    def sample() -> None:
        nonlocal peak, executor_peak
        while not done.is_set():
            try:
                tree = [proc, *proc.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            peak = max(peak, tally(tree, cpu_seen))
            if executors is not None:
                executor_peak = max(executor_peak, tally(executors(), executor_cpu))
            done.wait(0.1)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    out, err = proc.communicate()
    wall = time.monotonic() - began
    done.set()
    watcher.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    last = json.loads(out.strip().splitlines()[-1])
    # Reaped children count exactly; sampling catches processes reaped by no one.
    return {
        "wall": wall,
        "cpu": max(reaped, sum(cpu_seen.values())) + sum(executor_cpu.values()),
        "peak_rss": peak,
        "executor_peak_rss": executor_peak,
        # Sampled every 0.1 s, so a process living less than that is missed here.
        # Each kind's own peak (they need not peak at once); RSS, so pages a forked
        # Python worker still shares with Spark's daemon count in both.
        "peak_by_kind": peak_by_kind,
        "cpu_by_kind": {
            kind: sum(c for pid, c in cpu_seen.items() if kinds.get(pid) == kind)
            for kind in ("driver", "jvm", "workers")
        },
        "result": last,
    }


def seed(broker: LocalKafka, topic: str, count: int, hours: int = 24) -> int:
    """Create `topic` and produce clean click events over `hours` event hours into it.

    Returns:
        The count produced: every message of the topic.
    """
    create_topic(broker, topic, PARTITIONS)
    began = time.monotonic()
    produce(broker.bootstrap, topic, PARTITIONS, click_events(count, START_MS, hours, seed=11))
    print(
        f"  produced {count:,} events to `{topic}` in {time.monotonic() - began:.1f}s", flush=True
    )
    return count


def strata_project(
    work: Path,
    topic: str,
    bootstrap: str,
    layout: str,
    master: str = "local[2,4]",
    s3: str | None = None,
    tasks: int = 0,
) -> Path:
    """A throw-away project directory (conf + schemas) for the bench pipeline.

    With `s3` (an endpoint URL) the warehouse is a bucket there instead of local disk;
    `tasks` sets `spark.tasks` (0: the master's cores).
    """
    (work / "conf" / "pipelines").mkdir(parents=True)
    shutil.copytree(ROOT / "schemas", work / "schemas")
    body: dict[str, Any] = {
        "topics": [topic],
        "format": "json",
        "schema_file": "clicks.avsc",
        "warehouse": str(work / "warehouse"),
        "event_time": {"field": "ts", "unit": "ms"},
        "kafka": {"bootstrap_servers": bootstrap},
        "spark": {"master": master, "tasks": tasks},
        "layout": layout,
        # The ingest is measured; the quality suite is its own step (`strata quality`).
        "quality": {"gate": "off"},
    }
    if s3:
        body["warehouse"] = f"s3://bench/{work.name}"
        body["storage_options"] = S3_OPTIONS | {"AWS_ENDPOINT_URL": s3}
    (work / "conf" / "pipelines" / "bench.yaml").write_text(yaml.safe_dump(body))
    return work / "conf"


def files_by_hour(table_uri: str) -> Counter[tuple[str, str]]:
    """The files of a Delta table per event hour, (dt, hr)."""
    adds = pa.table(DeltaTable(table_uri).get_add_actions(flatten=True))
    return Counter(
        zip(
            adds.column("partition.dt").to_pylist(),
            adds.column("partition.hr").to_pylist(),
            strict=True,
        )
    )


def files_per_hour(table_uri: str) -> tuple[int, int, float]:
    """(files, event hours, max files in one hour) of a Delta table."""
    hours = files_by_hour(table_uri)
    return sum(hours.values()), len(hours), max(hours.values())


def clean_env() -> dict[str, str]:
    """This process's environment without STRATA_* overrides, which would redirect the runs."""
    return {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}


def run_alone(
    prefix: str, section: Callable[[LocalKafka, Path], tuple[list[str], dict[str, Any]]]
) -> int:
    """Run one section of the benchmark by itself, on a broker and a scratch directory.

    Args:
        prefix: The scratch directory's name prefix.
        section: The section: given the broker and the directory, its lines and figures.

    Returns:
        The exit code.
    """
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        with local_kafka(work) as broker:
            lines, figures = section(broker, work)
        print("\n".join([*lines, json.dumps(figures)]))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)
