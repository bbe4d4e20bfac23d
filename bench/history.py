"""The history section of `make bench`: a run's cost after 10,000 committed batches.

A pipeline that runs hourly commits 8,760 batches a year. What a run reads must not
grow with them: this section builds a pipeline with `BATCHES` committed batches of
history, one offset per partition and one event hour each (as an hourly pipeline
lands them), and a fresh pipeline with one, then measures on each a `strata run` of a
small batch and a no-op `strata run`, and gives the ratios (target <= 1.2x). Each is
measured `ROUNDS` times (per round a small batch of a new event hour, then a no-op run)
and the medians compared: a no-op run takes under a second, and one run of each would
compare the machine's noise more than the pipelines.

The history is made through the real commit path: each batch's split is read and
written by the task's own code (`run_split`, as a Spark task runs it), its files
committed to the three tables with the batch's app transaction (`commit_files`, as
`commit_table` does), and its ledger rows by `commit_ledger`, as a run commits them;
each table's handle is kept open and brought forward after each commit, as a runner
committing batch after batch would.
Only Spark, the plan and the read-back are left out. No file is edited and no
maintenance runs: the Delta logs and the tables grow as they would.

Run the section alone with `python -m bench.history`.
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from itertools import repeat
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from bench.harness import clean_env, create_topic, measure, run_alone, strata_project
from strata.batch.planning import check_topic_ids, data_columns
from strata.batch.reconcile import RANGES_KEY, TABLES
from strata.batch.task import SplitJob, SplitResult, TaskSpec, run_split
from strata.config import TableName, load_pipeline
from strata.local.events import HOUR_MS, click_events, produce
from strata.local.kafka import LocalKafka
from strata.schema.avro import table_layout
from strata.store.delta import commit_files, ensure_table, open_table
from strata.store.ledger import commit_ledger, ledger_row
from strata.store.ranges import OffsetRange

BATCHES = 10_000
PARTITIONS = 2
SMALL = 2_000
"""Events of the small batch measured on both pipelines."""
ROUNDS = 3
"""Small batches (each followed by a no-op run) measured on each pipeline."""
HISTORY_START_MS = 1_704_067_200_000
"""The first batch's event hour (2024-01-01T00:00:00Z). Each batch is an hour later, so
10,000 batches and the small ones after them end in February 2025: in the past, as
Kafka wants a message's timestamp (it refuses one more than an hour ahead of its clock),
where starting from the other sections' 2025-11-22 would end in 2027."""


def build_history(broker: LocalKafka, work: Path, topic: str, batches: int) -> Path:
    """A pipeline with `batches` committed batches, made through the real commit path.

    Each partition gets one message per batch; batch `b` reads offset
    `b - 1` of every partition, whose events are of event hour `b - 1`. The batches'
    splits are read and written by `WORKERS` processes; then each table's commits, in
    batch order, by a process of its own (the tables' logs are apart, as the commits of
    one run are in order).

    Args:
        broker: The local Kafka; the topic is created on it.
        work: The project's directory (created).
        topic: The pipeline's topic.
        batches: How many batches to commit.

    Returns:
        The project's configuration directory.
    """
    create_topic(broker, topic, PARTITIONS)
    produce(
        broker.bootstrap,
        topic,
        PARTITIONS,
        click_events(batches * PARTITIONS, HISTORY_START_MS, batches, seed=3),
    )
    conf = strata_project(work, topic, broker.bootstrap, "per_task")
    cfg = load_pipeline("bench", conf)
    ids = check_topic_ids(cfg.places(), cfg.source(), topics={topic})
    # Spawned, not forked: the parent holds librdkafka's and delta-rs' threads.
    spawn = get_context("spawn")
    with ProcessPoolExecutor(WORKERS, spawn) as pool:
        numbers = range(1, batches + 1)
        splits = list(pool.map(_split, repeat(conf), repeat(topic), numbers, chunksize=64))
    # Every table's commits at once: the ledger's, the longest, must not wait for a worker.
    with ProcessPoolExecutor(len(TABLES) + 1, spawn) as pool:
        done = [pool.submit(_commit_table, conf, name, splits) for name in TABLES]
        done.append(pool.submit(_commit_ledger, conf, splits, ids))
        for future in done:
            future.result()
    return conf


WORKERS = 2


def _split(conf: Path, topic: str, batch: int) -> SplitResult:
    """Read and write one batch's split, as its Spark task would."""
    cfg = load_pipeline("bench", conf)
    spec = TaskSpec(cfg.places(), cfg.decoding(), cfg.kafka, cfg.group_id, cfg.limits)
    ranges = [OffsetRange(topic, p, batch - 1, batch) for p in range(PARTITIONS)]
    return run_split(SplitJob(spec, batch, 0, ranges, frozenset(TABLES), "kafka", "hist"))


def _commit_table(conf: Path, name: TableName, splits: list[SplitResult]) -> None:
    """Commit every batch's files of one table, with its app transaction, in order."""
    cfg = load_pipeline("bench", conf)
    places = cfg.places()
    ref = places.table(name)
    schema, partition_by = table_layout(cfg.schemas(), name)
    # One snapshot kept open and brought forward after each commit: opening the table
    # anew per batch would measure the builder, not the pipeline.
    table = ensure_table(ref.uri, schema, partition_by, ref.options, ref.name)
    for batch, split in enumerate(splits, 1):
        meta: dict[str, Any] = {RANGES_KEY: [vars(r) for r in split.ranges]}
        files = split.files.get(name, [])
        if not commit_files(table, schema, partition_by, files, places.pipeline, batch, meta):
            raise RuntimeError(f"batch {batch} of the history was not committed to {name}")
        table.update_incremental()


def _commit_ledger(conf: Path, splits: list[SplitResult], ids: dict[str, str]) -> None:
    """Commit every batch's ledger rows, in order, as a run commits them."""
    cfg = load_pipeline("bench", conf)
    places, columns = cfg.places(), data_columns(cfg.schemas())
    # The high watermark each batch was planned at: the log end, one message a batch.
    marks = {f"{r.topic}:{r.partition}": len(splits) for r in splits[0].ranges}
    # As for the other tables, one snapshot brought forward after each commit: the
    # first batch creates the ledger, and the handle is opened once it stands.
    ledger = None
    for batch, split in enumerate(splits, 1):
        rows = [ledger_row(r, marks) for r in split.ranges]
        if not commit_ledger(places, batch, rows, columns, ids, ledger=ledger):
            raise RuntimeError(f"batch {batch} of the history was not committed to the ledger")
        if ledger is None:
            ledger = open_table(places.ledger.uri, places.options)
        else:
            ledger.update_incremental()


def history(broker: LocalKafka, work: Path) -> tuple[list[str], dict[str, Any]]:
    """Run the section on `broker`, in `work`; its printed lines and its figures.

    Args:
        broker: The local Kafka; two topics of its own are created.
        work: A scratch directory; the pipelines' projects go under it.

    Returns:
        The lines to print and the figures for the JSON line.
    """
    strata = str(Path(sys.executable).parent / "strata")
    env = clean_env()
    runs: dict[str, dict[str, dict[str, Any]]] = {}
    built: dict[str, float] = {}
    for label, topic, count in (("fresh", "fresh", 1), ("history", "history", BATCHES)):
        began = time.monotonic()
        conf = build_history(broker, work / label, topic, count)
        built[label] = time.monotonic() - began
        print(f"  {label}: {count:,} batches committed in {built[label]:.0f}s", flush=True)
        # The build's gigabyte of files is still being written back to disk when it
        # returns: flushed first, so the history's runs do not pay for the builder's.
        os.sync()
        cmd = [strata, "run", "--pipeline", "bench", "--conf-dir", str(conf), "--json"]
        rounds: dict[str, list[dict[str, Any]]] = {"small": [], "noop": []}
        for n in range(ROUNDS):
            # A small batch: new events an hour after the last batch's.
            after = HISTORY_START_MS + (count + 1 + n) * HOUR_MS
            produce(broker.bootstrap, topic, PARTITIONS, click_events(SMALL, after, 1, seed=4))
            small, noop = measure(cmd, env), measure(cmd, env)
            # Exactly the small batch: Kafka's high watermark is the log end.
            read = small["result"].get("messages", 0)
            if read != SMALL or noop["result"]["status"] != "idle":
                raise RuntimeError(f"{label}: {small['result']}, then {noop['result']}")
            rounds["small"].append(small)
            rounds["noop"].append(noop)
        runs[label] = {kind: _median(each) for kind, each in rounds.items()}
    fresh, old = runs["fresh"], runs["history"]
    figures = {
        "history_batches": BATCHES,
        "history_build_s": round(built["history"], 1),
        "history_small_fresh_s": round(fresh["small"]["wall"], 2),
        "history_small_s": round(old["small"]["wall"], 2),
        "history_small_ratio": round(old["small"]["wall"] / fresh["small"]["wall"], 2),
        "history_noop_fresh_s": round(fresh["noop"]["wall"], 2),
        "history_noop_s": round(old["noop"]["wall"], 2),
        "history_noop_ratio": round(old["noop"]["wall"] / fresh["noop"]["wall"], 2),
        "history_peak_mb": round(max(m["peak_rss"] for m in old.values()) / 2**20),
    }
    lines = [
        "",
        f"History: a pipeline with {BATCHES:,} committed batches against a fresh one "
        f"(history built in {built['history']:.0f}s; medians of {ROUNDS} runs)",
        f"{'':<34} {'wall s':>8} {'CPU s':>8} {'peak MB':>9} {'ratio':>7}",
    ]
    for kind, what in (("small", f"small batch ({SMALL:,} events)"), ("noop", "no-op run")):
        for label in ("fresh", "history"):
            m = runs[label][kind]
            ratio = m["wall"] / fresh[kind]["wall"]
            lines.append(
                f"{what + ', ' + label:<34} {m['wall']:>8.2f} {m['cpu']:>8.2f} "
                f"{m['peak_rss'] / 2**20:>9,.0f} {ratio:>6.2f}x"
            )
    lines.append(
        f"after {BATCHES:,} batches: small batch {figures['history_small_ratio']:.2f}x, no-op run "
        f"{figures['history_noop_ratio']:.2f}x a fresh pipeline's (target <= 1.2x, no "
        "maintenance run in between)"
    )
    return lines, figures


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median wall time, with the median CPU and the highest peak memory."""
    middle = dict(sorted(runs, key=lambda m: m["wall"])[len(runs) // 2])
    middle["cpu"] = sorted(m["cpu"] for m in runs)[len(runs) // 2]
    middle["peak_rss"] = max(m["peak_rss"] for m in runs)
    return middle


def main() -> int:
    """Run only this section, on a broker and in a scratch directory of its own."""
    return run_alone("strata-bench-history-", history)


if __name__ == "__main__":
    sys.exit(main())
