"""The table-maintenance section of `make bench`: what 200 small batches cost, and undo.

Hourly runs commit many small batches. This section measures, on the local Kafka:

1. A no-op `strata run` (nothing new, so no JVM) on a pipeline whose ledger holds 2
   batches and on one holding 200, then on the latter after `strata compact` and
   `strata checkpoint` (beside the 2-batch one again): the median of 3 of each, wall
   and CPU of the process tree.
2. `strata compact --older-than 0s` on the 200-batch pipeline: its time and the data
   table's files before and after.
3. A Spark scan of one event hour of the data table, before and after compaction.

The 200 batches are run in this process with one shared Spark session, so building
the state costs one JVM, not 200. Run the section alone with
`python -m bench.maintenance`.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import DeltaTable

from bench.harness import (
    PARTITIONS,
    clean_env,
    files_by_hour,
    files_per_hour,
    measure,
    run_alone,
    seed,
    strata_project,
)
from strata.config import load_pipeline
from strata.local.kafka import LocalKafka
from strata.run import run_batch
from strata.spark.session import build_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Messages per partition in one batch: 4 partitions x 25 = 100 events, about 7 event
# minutes of the load, so every event hour collects the small files of ~9 batches.
PER_BATCH = 25
MANY = 200
FEW = 2
REPEATS = 3


@contextmanager
def without_strata_env() -> Iterator[None]:
    """Hide STRATA_* variables from in-process `load_pipeline` calls, then restore them."""
    hidden = {k: v for k, v in os.environ.items() if k.startswith("STRATA_")}
    for key in hidden:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.update(hidden)


def ingest(conf: Path, batches: int, spark: SparkSession) -> list[float]:
    """Run `batches` batches of the bench pipeline in this process; each one's seconds.

    Raises:
        RuntimeError: If a run committed no batch (the load ran out early).
    """
    cfg = load_pipeline("bench", conf)
    took = []
    for n in range(batches):
        began = time.monotonic()
        outcome = run_batch(cfg, max_offsets=PER_BATCH, session=lambda _: spark)
        took.append(time.monotonic() - began)
        if outcome.batch is None:
            raise RuntimeError(f"run {n + 1} of {batches} committed no batch ({outcome.status})")
        if (n + 1) % 50 == 0:
            print(
                f"  batch {n + 1}/{batches}: last 50 took {sum(took[-50:]):.1f}s",
                flush=True,
            )
    return took


def noop(strata: str, conf: Path, env: dict[str, str]) -> dict[str, Any]:
    """One `strata run` with nothing to read, measured.

    Raises:
        RuntimeError: If the run was not idle: it read something, so it is no no-op.
    """
    m = measure([strata, "run", "--pipeline", "bench", "--conf-dir", str(conf), "--json"], env)
    if m["result"]["status"] != "idle":
        raise RuntimeError(f"expected an idle run, got {m['result']['status']}")
    return m


def noops(
    strata: str, confs: dict[str, Path], env: dict[str, str]
) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) of REPEATS no-op runs per pipeline.

    The pipelines take turns, so a slow moment of the machine hits all of them alike.
    """
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in confs}
    for _ in range(REPEATS):
        for label, conf in confs.items():
            runs[label].append(noop(strata, conf, env))
    return {
        label: (
            statistics.median(m["wall"] for m in ms),
            statistics.median(m["cpu"] for m in ms),
        )
        for label, ms in runs.items()
    }


def hour_scan(spark: SparkSession, uri: str, hour: tuple[str, str]) -> tuple[int, float]:
    """Files of one event hour, and the best of REPEATS Spark scans counting rows per page.

    The files are the Delta table's current ones (Spark has no Delta connector here), so
    files a compaction removed are not read.
    """
    adds = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
    paths = [f"{uri}/{a['path']}" for a in adds if (a["partition.dt"], a["partition.hr"]) == hour]
    df = spark.read.parquet(*paths)
    # One untimed pass first: the first Parquet scan of a session pays for JIT and
    # class loading, which would be charged to whichever scan came first.
    df.groupBy("page").count().collect()
    best = float("inf")
    for _ in range(REPEATS):
        began = time.monotonic()
        df.groupBy("page").count().collect()
        best = min(best, time.monotonic() - began)
    return len(paths), best


def compaction_totals(report: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per table, the sums of a `strata compact --json` report's partitions."""
    totals: dict[str, dict[str, int]] = {}
    for p in report["partitions"]:
        t = totals.setdefault(
            p["table"], {"partitions": 0, "files_before": 0, "files_after": 0, "merged": 0}
        )
        t["partitions"] += 1
        for key in ("files_before", "files_after", "merged"):
            t[key] += p[key]
    return totals


def maintenance(broker: LocalKafka, work: Path) -> tuple[list[str], dict[str, Any]]:
    """Run the section on `broker`, in `work`; its printed lines and its figures.

    Args:
        broker: The local Kafka; two topics of its own are created.
        work: A scratch directory; the pipelines' projects go under it.

    Returns:
        The lines to print and the figures for the JSON line.
    """
    strata = str(Path(sys.executable).parent / "strata")
    env = clean_env()
    messages = MANY * PARTITIONS * PER_BATCH
    confs = {}
    for batches in (FEW, MANY):
        topic = f"maint{batches}"
        # Exactly `batches` batches drain the topic.
        seed(broker, topic, batches * PARTITIONS * PER_BATCH)
        # One task per batch, as a small hourly run has: at most one file per event hour.
        confs[batches] = strata_project(
            work / f"maint-{batches}", topic, broker.bootstrap, "per_task", tasks=1
        )
    uri = load_pipeline("bench", confs[MANY]).location("table")

    with without_strata_env():
        # The job's own session builder, as `strata run` starts it.
        cfg = load_pipeline("bench", confs[MANY])
        spark = build_session(cfg.spark, cfg.name)
    try:
        with without_strata_env():
            ingest(confs[FEW], FEW, spark)
            began = time.monotonic()
            took = ingest(confs[MANY], MANY, spark)
        built = time.monotonic() - began
        print(f"  {MANY} batches committed in {built:.0f}s", flush=True)

        idle = noops(strata, {"few": confs[FEW], "many": confs[MANY]}, env)
        print("  no-op runs measured", flush=True)

        # The hour with the most small files: where compaction should pay the most.
        hour = files_by_hour(uri).most_common(1)[0][0]
        files_before = files_per_hour(uri)
        scan_files_before, scan_before = hour_scan(spark, uri, hour)
        compacted = measure(
            [
                strata,
                "compact",
                *("--pipeline", "bench", "--conf-dir", str(confs[MANY])),
                *("--older-than", "0s", "--json"),
            ],
            env,
        )
        files_after = files_per_hour(uri)
        scan_files_after, scan_after = hour_scan(spark, uri, hour)
        print("  compaction and scans measured", flush=True)

        checkpointed = measure(
            [strata, "checkpoint", "--pipeline", "bench", "--conf-dir", str(confs[MANY]), "--json"],
            env,
        )
        # The 2-batch pipeline is measured again beside the maintained one: a no-op takes
        # about a second, and the machine's pace drifts by a good part of that over the
        # minutes compaction takes, so only runs taking turns compare.
        again = noops(strata, {"few": confs[FEW], "maintained": confs[MANY]}, env)
        kept = again["maintained"]
    finally:
        spark.stop()

    totals = compaction_totals(compacted["result"])
    left = [p for p in compacted["result"]["partitions"] if p["outcome"] != "compacted"]
    figures: dict[str, Any] = {
        "noop_2_s": round(idle["few"][0], 3),
        "noop_200_s": round(idle["many"][0], 3),
        "noop_200_maintained_s": round(kept[0], 3),
        "noop_2_cpu_s": round(idle["few"][1], 3),
        "noop_200_cpu_s": round(idle["many"][1], 3),
        "noop_200_maintained_cpu_s": round(kept[1], 3),
        "noop_ratio": round(idle["many"][0] / idle["few"][0], 2),
        "noop_2_again_s": round(again["few"][0], 3),
        "noop_maintained_ratio": round(kept[0] / again["few"][0], 2),
        "batch_first_s": round(statistics.median(took[:20]), 3),
        "batch_last_s": round(statistics.median(took[-20:]), 3),
        "compact_s": round(compacted["wall"], 2),
        "compact_cpu_s": round(compacted["cpu"], 2),
        "compact_files_before": files_before[0],
        "compact_files_after": files_after[0],
        "checkpoint_s": round(checkpointed["wall"], 2),
        "hour_scan_files_before": scan_files_before,
        "hour_scan_files_after": scan_files_after,
        "hour_scan_before_s": round(scan_before, 3),
        "hour_scan_after_s": round(scan_after, 3),
    }
    per_table = ", ".join(
        f"{name} {t['files_before']} -> {t['files_after']} "
        f"({t['partitions']} partition{'' if t['partitions'] == 1 else 's'})"
        for name, t in totals.items()
    )
    lines = [
        "",
        f"Table maintenance: {messages:,} messages in {MANY} batches of {PARTITIONS} x {PER_BATCH} "
        "messages (one Spark task each), 24 event hours",
        f"{'no-op `strata run` (median of ' + str(REPEATS) + ')':<50} {'wall s':>8} {'CPU s':>8}",
        f"{f'ledger of {FEW} batches':<50} {idle['few'][0]:>8.2f} {idle['few'][1]:>8.2f}",
        f"{f'ledger of {MANY} batches':<50} {idle['many'][0]:>8.2f} {idle['many'][1]:>8.2f}",
        f"{f'ledger of {MANY} batches, compacted + checkpointed':<50} "
        f"{kept[0]:>8.2f} {kept[1]:>8.2f}",
        f"{f'ledger of {FEW} batches, measured again beside it':<50} "
        f"{again['few'][0]:>8.2f} {again['few'][1]:>8.2f}",
        f"no-op after {MANY} batches vs after {FEW}: {figures['noop_ratio']}x (target <= 1.1x); "
        f"after compact + checkpoint: {figures['noop_maintained_ratio']}x (vs the 2-batch one "
        "measured beside it)",
        f"in-process batch, median of the first 20 / last 20: {figures['batch_first_s']:.2f}s / "
        f"{figures['batch_last_s']:.2f}s",
        f"compact --older-than 0s: {compacted['wall']:.1f}s wall, {compacted['cpu']:.1f} CPU s "
        f"(report: {compacted['result']['seconds']:.1f}s); data table {files_before[0]} -> "
        f"{files_after[0]} files over {files_before[1]} hours (max per hour {files_before[2]} -> "
        f"{files_after[2]})",
        f"  per table: {per_table}"
        + (f"; {len(left)} partitions left as they were" if left else ""),
        f"checkpoint: {checkpointed['wall']:.1f}s wall",
        f"Spark scan of one event hour (dt={hour[0]}/hr={hour[1]}), rows per page, best of "
        f"{REPEATS}: {scan_files_before} files {scan_before:.3f}s -> {scan_files_after} files "
        f"{scan_after:.3f}s",
    ]
    return lines, figures


def main() -> int:
    """Run only this section, on a broker and in a scratch directory of its own."""
    return run_alone("strata-bench-maint-", maintenance)


if __name__ == "__main__":
    sys.exit(main())
