"""The table-format section of `make bench`: one load landed as Delta, plain Parquet and Iceberg.

The same 1,000,000 click events (4 partitions, 24 event hours) are run once per
`table_format`, each in a project of its own, against one local metastore (Iceberg
keeps its tables in the metastore's catalog; the others are registered there too, as
a deployment with a metastore does). Per format: whole-process throughput, CPU of the
process tree per GB of message values, peak memory, and the driver's commit time (the
three tables' commits, then their read-back before the ledger commit), of the first
batch (which creates the tables) and of a next batch of 50,000 events onto them. What differs is
the commit: Delta appends to its log, plain Parquet commits only the ledger, Iceberg
appends a snapshot through the metastore's lock.

Run it alone with `python -m bench.formats`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from bench.harness import (
    PARTITIONS,
    START_MS,
    clean_env,
    measure,
    run_alone,
    seed,
    strata_project,
)
from strata.local.events import click_events, produce
from strata.local.kafka import LocalKafka
from strata.local.metastore import LocalMetastore

EVENTS = 1_000_000
# The next batch's events, landing onto the tables the first batch created.
NEXT = 50_000
FORMATS = ("delta", "parquet", "iceberg")


def formats(broker: LocalKafka, work: Path) -> tuple[list[str], dict[str, Any]]:
    """Run the section on `broker`, in `work`; its printed lines and its figures.

    Args:
        broker: The local Kafka; a topic of its own is created.
        work: A scratch directory; the pipelines' projects and the metastore go under it.

    Returns:
        The lines to print and the figures for the JSON line.
    """
    strata = str(Path(sys.executable).parent / "strata")
    topic = "bench-formats"
    seed(broker, topic, EVENTS)
    runs: dict[str, dict[str, Any]] = {}
    again: dict[str, dict[str, Any]] = {}
    with LocalMetastore(work / "metastore").start() as metastore:
        confs = {}
        for fmt in FORMATS:
            conf = strata_project(work / f"formats-{fmt}", topic, broker.bootstrap, "per_task")
            path = conf / "pipelines" / "bench.yaml"
            body = yaml.safe_load(path.read_text())
            body |= {"table_format": fmt, "metastore": {"uri": metastore.uri, "database": fmt}}
            path.write_text(yaml.safe_dump(body))
            confs[fmt] = conf
        for label, into in (("first batch", runs), ("next batch", again)):
            if into is again:
                # A batch onto tables that exist: the commit a schedule makes every hour.
                produce(broker.bootstrap, topic, PARTITIONS, click_events(NEXT, START_MS, 24))
            for fmt, conf in confs.items():
                command = [strata, "run", "--pipeline", "bench", "--conf-dir", str(conf)]
                m = measure([*command, "--json"], clean_env())
                into[fmt] = m
                r = m["result"]
                print(
                    f"  formats {fmt}, {label}: {r['messages']:,} msgs, {m['wall']:.1f}s",
                    flush=True,
                )
    values = sum(int(r["result"]["bytes"]) for r in runs.values()) / len(runs)
    lines = [
        "",
        f"table formats: {EVENTS:,} events, 24 event hours, one run each, same metastore",
        f"{'':<22} {'msgs/s':>10} {'CPU s/GB':>10} {'peak MB':>9} {'commit s':>9} "
        f"{'read-back s':>12} {'next commit s':>14}",
    ]
    figures: dict[str, Any] = {}
    for fmt, m in runs.items():
        r = m["result"]
        commit, back = _driver(r, "commit"), _driver(r, "read_back")
        rate = int(r["messages"]) / m["wall"]
        cpu_gb = m["cpu"] / (values / 1e9)
        following = _driver(again[fmt]["result"], "commit")
        lines.append(
            f"{'strata ' + fmt:<22} {rate:>10,.0f} {cpu_gb:>10.1f} "
            f"{m['peak_rss'] / 2**20:>9,.0f} {commit:>9.2f} {back:>12.2f} {following:>14.2f}"
        )
        figures[f"format_{fmt}_msgs_per_s"] = round(rate)
        figures[f"format_{fmt}_cpu_per_gb"] = round(cpu_gb, 1)
        figures[f"format_{fmt}_commit_s"] = round(commit, 2)
        figures[f"format_{fmt}_next_commit_s"] = round(following, 2)
    delta = figures["format_delta_cpu_per_gb"]
    figures["format_iceberg_cpu_vs_delta"] = round(figures["format_iceberg_cpu_per_gb"] / delta, 2)
    lines.append(
        f"Iceberg vs Delta, CPU per GB: {figures['format_iceberg_cpu_vs_delta']}x; the three "
        f"tables' commits of the first batch (tables created) "
        f"{figures['format_iceberg_commit_s']:.2f}s vs {figures['format_delta_commit_s']:.2f}s, "
        f"of the next {figures['format_iceberg_next_commit_s']:.2f}s vs "
        f"{figures['format_delta_next_commit_s']:.2f}s"
    )
    return lines, figures


def _driver(result: dict[str, Any], stage: str) -> float:
    """A driver stage's wall seconds in a run's JSON summary (0 if it did not run)."""
    return float(result.get("stages", {}).get("driver", {}).get(stage, {}).get("wall", 0.0))


def main() -> int:
    """Run the section alone, on a broker and in a scratch directory of its own."""
    return run_alone("strata-bench-formats-", formats)


if __name__ == "__main__":
    sys.exit(main())
