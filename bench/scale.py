"""The scale sections of `make bench`: a run's cost in partitions, and in routed tables.

A Kafka Connect or Secor installation reads topics of hundreds or thousands of
partitions, most of them nearly idle, and often hundreds of topics, each landing in a
table of its own. Two sections measure what grows with them, each as a first run and
a run again with nothing new (a no-op run): wall time and CPU of the whole process
tree, peak memory, and the ratios. What grows with partitions or tables (a request per
partition, a Python loop per partition, a Spark job or a Delta open per table) shows
here before it shows anywhere else.

- `partitions`: the same 81,920 click events from a topic of 8 partitions and from
  one of 4,096 (20 events each), beside the bare consume loop over the same topics
  (what the broker itself takes to serve that many partitions).
- `topics`: 200 topics of 2,000 events each, routed to 200 tables (`routing`), against
  one topic of 4 partitions holding the same 400,000 events, landing in one table.

Run them alone with `python -m bench.scale` (both), or `python -m bench.scale topics`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any

import yaml

from bench.harness import (
    PARTITIONS,
    START_MS,
    clean_env,
    create_topic,
    measure,
    run_alone,
    strata_project,
)
from strata.local.events import click_events, produce
from strata.local.kafka import LocalKafka

EVENTS = 81_920
FEW = 8
MANY = 4_096

TOPICS = 200
PER_TOPIC = 2_000

Section = Callable[[LocalKafka, Path], tuple[list[str], dict[str, Any]]]


def partitions(broker: LocalKafka, work: Path) -> tuple[list[str], dict[str, Any]]:
    """Run the section on `broker`, in `work`; its printed lines and its figures.

    Args:
        broker: The local Kafka; two topics of its own are created.
        work: A scratch directory; the pipelines' projects go under it.

    Returns:
        The lines to print and the figures for the JSON line.
    """
    strata = str(Path(sys.executable).parent / "strata")
    env = clean_env()
    runs: dict[int, dict[str, dict[str, Any]]] = {}
    for count in (FEW, MANY):
        topic = f"parts{count}"
        began = time.monotonic()
        create_topic(broker, topic, count)
        created = time.monotonic() - began
        produce(broker.bootstrap, topic, count, click_events(EVENTS, START_MS, 6, seed=5))
        print(
            f"  {count:,} partitions: topic created in {created:.1f}s, "
            f"{EVENTS:,} events produced in {time.monotonic() - began - created:.1f}s",
            flush=True,
        )
        # The broker's own cost of serving this many partitions: the bare consume loop.
        bare = measure(
            [sys.executable, "-m", "bench.references", "bare", broker.bootstrap, topic,
             str(count), str(work / f"bare-{count}")],
            env,
        )  # fmt: skip
        conf = strata_project(work / f"parts-{count}", topic, broker.bootstrap, "per_task")
        cmd = [strata, "run", "--pipeline", "bench", "--conf-dir", str(conf), "--json"]
        first = measure(cmd, env)
        noop = measure(cmd, env)
        if first["result"].get("messages") != EVENTS or noop["result"]["status"] != "idle":
            raise RuntimeError(f"{count} partitions: {first['result']}, then {noop['result']}")
        runs[count] = {"first": first, "noop": noop, "bare": bare}
        print(f"  {count:,} partitions: first run {first['wall']:.1f}s", flush=True)
    few, many = runs[FEW], runs[MANY]
    figures = {
        "parts_first_8_s": round(few["first"]["wall"], 2),
        "parts_first_4096_s": round(many["first"]["wall"], 2),
        "parts_first_ratio": round(many["first"]["wall"] / few["first"]["wall"], 2),
        "parts_noop_8_s": round(few["noop"]["wall"], 2),
        "parts_noop_4096_s": round(many["noop"]["wall"], 2),
        "parts_peak_mb_4096": round(many["first"]["peak_rss"] / 2**20),
        "parts_bare_8_s": round(few["bare"]["result"]["seconds"], 2),
        "parts_bare_4096_s": round(many["bare"]["result"]["seconds"], 2),
    }
    lines = [
        "",
        f"Partitions: {EVENTS:,} events from a topic of {FEW} partitions and of {MANY:,}",
        f"{'':<34} {'wall s':>8} {'CPU s':>8} {'peak MB':>9}",
    ]
    for count, label in ((FEW, f"{FEW} partitions"), (MANY, f"{MANY:,} partitions")):
        for kind in ("first", "noop"):
            m = runs[count][kind]
            what = "first run" if kind == "first" else "no-op run"
            lines.append(
                f"{what + ', ' + label:<34} {m['wall']:>8.2f} {m['cpu']:>8.2f} "
                f"{m['peak_rss'] / 2**20:>9,.0f}"
            )
    lines.append(
        f"bare consume loop (the broker serving them): {figures['parts_bare_8_s']:.2f}s at "
        f"{FEW} partitions, {figures['parts_bare_4096_s']:.2f}s at {MANY:,}"
    )
    # Where a run's wall time went that its CPU does not account for: the driver's stages.
    for kind in ("first", "noop"):
        stages = many[kind]["result"].get("stages", {}).get("driver", {})
        what = "first run" if kind == "first" else "no-op run"
        lines.append(
            f"  {what} at {MANY:,}, driver (wall/CPU s): "
            + ", ".join(f"{name} {s['wall']:.1f}/{s['cpu']:.1f}" for name, s in stages.items())
        )
    lines.append(
        f"first run, {MANY:,} vs {FEW} partitions: {figures['parts_first_ratio']:.2f}x "
        f"(target <= 1.5x); no-op run at {MANY:,}: {figures['parts_noop_4096_s']:.2f}s "
        "(target <= 2s)"
    )
    return lines, figures


def topics(broker: LocalKafka, work: Path) -> tuple[list[str], dict[str, Any]]:
    """Run the section on `broker`, in `work`; its printed lines and its figures.

    200 topics of one partition each, routed to 200 tables, against one topic of
    `PARTITIONS` partitions holding the same events, landing in one table.

    Args:
        broker: The local Kafka; 201 topics of its own are created.
        work: A scratch directory; the pipelines' projects go under it.

    Returns:
        The lines to print and the figures for the JSON line.
    """
    strata = str(Path(sys.executable).parent / "strata")
    env = clean_env()
    events = TOPICS * PER_TOPIC
    # Both sides hold the same `events` click events over 6 event hours.
    one = "topics_one"
    create_topic(broker, one, PARTITIONS)
    produce(broker.bootstrap, one, PARTITIONS, click_events(events, START_MS, 6, seed=9))
    names = [f"routed_{i:03}" for i in range(TOPICS)]
    stream = click_events(events, START_MS, 6, seed=9)
    for name in names:
        create_topic(broker, name, 1)
        produce(broker.bootstrap, name, 1, islice(stream, PER_TOPIC))
    print(f"  produced {events:,} events to 1 topic and to {TOPICS} topics", flush=True)

    conf = strata_project(work / "topics-one", one, broker.bootstrap, "per_task")
    routed = strata_project(work / "topics-routed", names[0], broker.bootstrap, "per_task")
    # Every topic to a table named after it (`routed_007` to `routed_007`), one schema.
    path = routed / "pipelines" / "bench.yaml"
    body = yaml.safe_load(path.read_text())
    body.update(topics=names, routing={"table": "{topic}"})
    path.write_text(yaml.safe_dump(body))

    runs: dict[str, dict[str, dict[str, Any]]] = {}
    # What each table should hold: every event of its topics, then nothing more.
    cases = (("one", conf, {"bench": events}), ("routed", routed, dict.fromkeys(names, PER_TOPIC)))
    for label, project, expected in cases:
        cmd = [strata, "run", "--pipeline", "bench", "--conf-dir", str(project), "--json"]
        first = measure(cmd, env)
        noop = measure(cmd, env)
        landed, idle = _landed(first["result"]), _landed(noop["result"])
        if landed != {t: (n, "committed") for t, n in expected.items()}:
            raise RuntimeError(f"{label}: not every event landed: {first['result']}")
        if idle != dict.fromkeys(expected, (0, "idle")):
            raise RuntimeError(f"{label}: the second run was not a no-op: {noop['result']}")
        runs[label] = {"first": first, "noop": noop}
        print(
            f"  {label}: first run {first['wall']:.1f}s, no-op run {noop['wall']:.1f}s",
            flush=True,
        )
    single, many = runs["one"], runs["routed"]
    figures = {
        "topics_first_1_s": round(single["first"]["wall"], 2),
        "topics_first_200_s": round(many["first"]["wall"], 2),
        "topics_first_ratio": round(many["first"]["wall"] / single["first"]["wall"], 2),
        "topics_cpu_ratio": round(many["first"]["cpu"] / single["first"]["cpu"], 2),
        "topics_noop_1_s": round(single["noop"]["wall"], 2),
        "topics_noop_200_s": round(many["noop"]["wall"], 2),
        "topics_noop_ratio": round(many["noop"]["wall"] / single["noop"]["wall"], 2),
        "topics_peak_mb_1": round(single["first"]["peak_rss"] / 2**20),
        "topics_peak_mb_200": round(many["first"]["peak_rss"] / 2**20),
    }
    lines = [
        "",
        f"Topics: {events:,} events from one topic of {PARTITIONS} partitions into one "
        f"table, and from {TOPICS} topics ({PER_TOPIC:,} events each) routed to {TOPICS} tables",
        f"{'':<34} {'wall s':>8} {'CPU s':>8} {'peak MB':>9}",
    ]
    for label, what in (("one", "1 topic"), ("routed", f"{TOPICS} routed topics")):
        for kind in ("first", "noop"):
            m = runs[label][kind]
            run = "first run" if kind == "first" else "no-op run"
            lines.append(
                f"{run + ', ' + what:<34} {m['wall']:>8.2f} {m['cpu']:>8.2f} "
                f"{m['peak_rss'] / 2**20:>9,.0f}"
            )
    lines.append(
        f"{TOPICS} routed topics vs 1 topic: first run {figures['topics_first_ratio']:.2f}x "
        f"wall (target <= 1.5x), {figures['topics_cpu_ratio']:.2f}x CPU; no-op run "
        f"{figures['topics_noop_ratio']:.2f}x, {figures['topics_noop_200_s']:.2f}s "
        "(target <= 2s)"
    )
    return lines, figures


def _landed(result: dict[str, Any]) -> dict[str, tuple[int, str]]:
    """The messages a run landed in each table, and the table's status.

    Args:
        result: The run's `--json` body; a routed run's has one body per table.

    Returns:
        `{table: (messages, status)}`; a pipeline without routing is its one table.
    """
    bodies = result["tables"] if "tables" in result else {result.get("pipeline", "bench"): result}
    return {t: (b.get("messages") or 0, b.get("status", "?")) for t, b in bodies.items()}


def scale(broker: LocalKafka, work: Path) -> tuple[list[str], dict[str, Any]]:
    """Both sections, one after the other: their lines and their figures together."""
    lines, figures = partitions(broker, work)
    more, also = topics(broker, work)
    return [*lines, *more], figures | also


SECTIONS: dict[str, Section] = {"partitions": partitions, "topics": topics, "all": scale}


def main(argv: list[str] | None = None) -> int:
    """Run this file's sections alone, on a broker and in a scratch directory of their own.

    Args:
        argv: One section's name (`partitions`, `topics`), or none for both.

    Returns:
        The exit code.
    """
    args = sys.argv[1:] if argv is None else argv
    which = args[0] if args else "all"
    if which not in SECTIONS or len(args) > 1:
        print(f"usage: python -m bench.scale [{'|'.join(SECTIONS)}]", file=sys.stderr)
        return 2
    return run_alone("strata-bench-scale-", SECTIONS[which])


if __name__ == "__main__":
    sys.exit(main())
