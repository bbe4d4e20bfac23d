"""The scale section of `make bench`: a run's cost in the number of partitions.

A Kafka Connect or Secor installation reads topics of hundreds or thousands of
partitions, most of them nearly idle. This section lands the same 81,920 click events
from a topic of 8 partitions and from one of 4,096 (20 events each), then runs the
pipeline again with nothing new: wall time and CPU of the whole process tree, and
the ratios, beside the bare consume loop over the same topics (what the broker
itself takes to serve that many partitions). What grows with partitions (a request
per partition, a Python loop per partition) shows here before it shows anywhere else.

Run the section alone with `python -m bench.scale`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.harness import START_MS, clean_env, measure, run_alone, strata_project
from strata.local.broker import LocalBroker
from strata.local.events import click_events, produce

EVENTS = 81_920
FEW = 8
MANY = 4_096


def partitions(broker: LocalBroker, work: Path) -> tuple[list[str], dict[str, Any]]:
    """Run the section on `broker`, in `work`; its printed lines and its figures.

    Args:
        broker: The local broker; two topics of its own are created.
        work: A scratch directory; the pipelines' projects go under it.

    Returns:
        The lines to print and the figures for the JSON line.
    """
    strata = str(Path(sys.executable).parent / "strata")
    env = clean_env()
    runs: dict[int, dict[str, dict[str, Any]]] = {}
    for count in (FEW, MANY):
        topic = f"parts{count}"
        broker.create_topic(topic, count)
        # Each partition ends with a seal, so both topics hold EVENTS messages in all.
        events = click_events(EVENTS - count, START_MS, 6, seed=5)
        produce(broker.bootstrap, topic, count, events)
        # The local broker's high watermark is its last record batch's base offset: a
        # one-message batch at each partition's end makes it cover every event.
        seal = {"event_id": "seal", "user_id": 0, "page": "/", "device": "desktop", "ts": START_MS}
        broker.seal(topic, list(range(count)), json.dumps(seal).encode(), timestamp_ms=START_MS)
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
    lines.append(
        f"first run, {MANY:,} vs {FEW} partitions: {figures['parts_first_ratio']:.2f}x "
        f"(target <= 1.5x); no-op run at {MANY:,}: {figures['parts_noop_4096_s']:.2f}s "
        "(target <= 2s)"
    )
    return lines, figures


def main() -> int:
    """Run only this section, on a broker and in a scratch directory of its own."""
    return run_alone("strata-bench-scale-", partitions)


if __name__ == "__main__":
    sys.exit(main())
