"""`make demo`: a local broker, a realistic click topic, one batch, and what landed.

`python -m strata.local.demo --batches N` lands N batches, each of new events (late,
malformed and future ones among them), and checks the quality of each: what `make
report-screenshot` shows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from strata.local.events import HOUR_MS, Message, click_events, produce

if TYPE_CHECKING:
    from strata.config import PipelineConfig


def main(batches: int = 1) -> int:
    """Run the demo end to end against a throw-away local broker.

    Args:
        batches: Batches to land and check, each of new events.
    """
    from strata.config import ENV_BOOTSTRAP, ENV_METASTORE, ENV_WAREHOUSE, load_pipeline
    from strata.edge import status_settings
    from strata.local.broker import LocalBroker
    from strata.local.metastore import LocalMetastore
    from strata.operations.report import render_summary
    from strata.operations.status import pipeline_status, render_status
    from strata.quality.checks import render_quality
    from strata.quality.run import run_quality
    from strata.run import run_batch

    warehouse = Path("demo-warehouse").resolve()
    shutil.rmtree(warehouse, ignore_errors=True)
    warehouse.mkdir(parents=True)
    with LocalBroker() as broker, LocalMetastore(warehouse / "_metastore") as metastore:
        print(f"local broker (Tansu) on {broker.bootstrap}; Hive Metastore on {metastore.uri}")
        broker.create_topic("clicks", 4)
        # Six event hours ending at the start of the current hour, so the demo looks live.
        start = (int(time.time() * 1000) // HOUR_MS - 6) * HOUR_MS
        counts = produce(
            broker.bootstrap,
            "clicks",
            4,
            click_events(100_000, start, 6, late=40, malformed=12, future=1),
        )
        last = start + 6 * HOUR_MS - 1
        seal = {"event_id": "seal", "user_id": 0, "page": "/", "device": "desktop", "ts": last}
        broker.seal("clicks", [0, 1, 2, 3], json.dumps(seal).encode(), timestamp_ms=last)
        print(f"seeded `clicks` (4 partitions): {counts} + 4 sealing events")
        os.environ[ENV_BOOTSTRAP] = broker.bootstrap
        os.environ[ENV_WAREHOUSE] = str(warehouse)
        os.environ[ENV_METASTORE] = metastore.uri
        cfg = load_pipeline("clicks", "conf")
        outcome = run_batch(cfg)
        print()
        print(render_summary(outcome))
        print()
        checked = run_quality(
            cfg.places(), cfg.quality, cfg.schemas(), cfg.metastore, cfg.warehouse, outcome.batch
        )
        print(render_quality(checked))
        for number in range(2, batches + 1):
            # Each later batch: fewer events over the last two hours, a few of them late,
            # malformed or from the future, so the page has several reasons to show.
            events = list(
                click_events(
                    4_000 * number, last - 2 * HOUR_MS, 2, late=5, malformed=3 * number,
                    future=1, seed=number,
                )
            )  # fmt: skip
            if number == 3:
                # Valid for the schema, so landed, but beyond quality.ranges: the batch
                # fails that check, and the page and the index say so.
                events += [_slow_click(last - i * 60_000) for i in range(3)]
            counts = produce(broker.bootstrap, "clicks", 4, iter(events))
            broker.seal("clicks", [0, 1, 2, 3], json.dumps(seal).encode(), timestamp_ms=last)
            outcome = run_batch(cfg)
            print(f"\nbatch {number} of {batches}: seeded {counts} + 4 sealing events")
            print(render_summary(outcome))
            checked = run_quality(
                cfg.places(),
                cfg.quality,
                cfg.schemas(),
                cfg.metastore,
                cfg.warehouse,
                outcome.batch,
            )
            print(render_quality(checked))
        print(f"quality summary page: {cfg.location('quality')}/index.html")
        print()
        print(render_status(pipeline_status(cfg.places(), status_settings(cfg))))
        print()
        _show_landed(cfg)
        _show_registered(cfg)
        again = run_batch(cfg)
        print()
        print("a second run right away: " + render_summary(again))
        _show_queries(cfg)
    return 0


def _show_queries(cfg: PipelineConfig) -> None:
    """Two ready queries on what landed, as an analyst runs them with no server."""
    from strata.edge import answer_query

    for name in ("rows_per_hour", "ledger_ranges"):
        text, body = answer_query(cfg, name, None, None, "table", engine="embedded")
        print(f"\n$ strata sql query --pipeline {cfg.name} {name}   ({body['seconds']:.2f} s)")
        print(text)


def _slow_click(at_ms: int) -> Message:
    """A click whose page took two minutes: a valid event outside `quality.ranges`."""
    record = {"event_id": f"slow-{at_ms}", "user_id": 7, "page": "/checkout",
              "device": "mobile", "latency_ms": 120_000, "ts": at_ms}  # fmt: skip
    return Message(b"7", json.dumps(record).encode(), at_ms + 1_000, "ok")


def _show_registered(cfg: PipelineConfig) -> None:
    from strata.catalog.metastore import MetastoreClient
    from strata.store.places import NAME_SUFFIXES

    assert cfg.metastore.uri is not None
    with MetastoreClient(cfg.metastore.uri, cfg.metastore.timeout_s) as client:
        print(f"metastore {cfg.metastore.uri}, database {cfg.metastore.database}:")
        for suffix in NAME_SUFFIXES.values():
            table = client.get_table(cfg.metastore.database, cfg.name + suffix)
            if table is not None:
                provider = (table.parameters or {}).get("spark.sql.sources.provider", "hive")
                name = f"{cfg.metastore.database}.{table.tableName}"
                print(f"  {name} ({provider}) -> {table.sd.location}")


def _show_landed(cfg: PipelineConfig) -> None:
    import pyarrow as pa
    from deltalake import DeltaTable

    table = DeltaTable(cfg.location("table"))
    data = table.to_pyarrow_table(columns=["dt", "hr", "_offset"])
    per_hour = (
        data.group_by(["dt", "hr"])
        .aggregate([("_offset", "count")])
        .sort_by([("dt", "ascending"), ("hr", "ascending")])
    )
    files = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    print(f"table {cfg.location('table')}: {data.num_rows:,} rows in {len(files['path'])} files")
    for dt, hr, n in zip(
        *(per_hour.column(c).to_pylist() for c in ("dt", "hr", "_offset_count")), strict=True
    ):
        nfiles = sum(1 for p in files["path"] if p.startswith(f"dt={dt}/hr={hr}/"))
        print(f"  dt={dt}/hr={hr}: {n:>7,} rows, {nfiles} file(s)")
    quarantine = DeltaTable(cfg.location("quarantine")).to_pyarrow_table(
        columns=["_partition", "_offset", "reason"]
    )
    print(f"quarantine {cfg.location('quarantine')}: {quarantine.num_rows} rows")
    reasons = quarantine.group_by("reason").aggregate([("_offset", "count")])
    for reason, n in zip(
        reasons.column("reason").to_pylist(),
        reasons.column("_offset_count").to_pylist(),
        strict=True,
    ):
        print(f"  {n:>3} x {reason}")
    raw = DeltaTable(cfg.location("raw")).to_pyarrow_table(columns=["_offset"])
    print(f"raw copy {cfg.location('raw')}: {raw.num_rows:,} messages")


def _entry(argv: Sequence[str] | None = None) -> int:
    """`python -m strata.local.demo [--batches N]`."""
    parser = argparse.ArgumentParser(prog="python -m strata.local.demo", description=__doc__)
    parser.add_argument(
        "--batches", type=int, default=1, help="batches to land and check (default 1)"
    )
    args = parser.parse_args(argv)
    if args.batches < 1:
        parser.error("--batches takes a whole number of at least 1")
    return main(args.batches)


if __name__ == "__main__":
    sys.exit(_entry())
