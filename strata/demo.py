"""`make demo`: a local broker, a realistic click topic, one batch, and what landed.

Also the click-event generator the tests and the benchmark produce with.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from confluent_kafka import Producer

if TYPE_CHECKING:
    from strata.config import PipelineConfig

HOUR_MS = 3_600_000
_PAGES = ["/", "/search", "/cart", "/checkout", "/help"] + [f"/products/{i}" for i in range(50)]
_COUNTRIES = ["US", "DE", "IN", "BR", "JP", "FR", "GB", None]
_DEVICES = ["desktop", "mobile", "tablet"]


@dataclass(frozen=True)
class Message:
    """A message to produce.

    Attributes:
        key: Message key.
        value: Message value.
        timestamp_ms: Kafka timestamp (CreateTime).
        kind: `ok`, `late`, `malformed` or `future`: what the pipeline should make of it.
    """

    key: bytes
    value: bytes
    timestamp_ms: int
    kind: str


def click_events(
    count: int,
    start_ms: int,
    hours: int,
    *,
    late: int = 0,
    malformed: int = 0,
    future: int = 0,
    seed: int = 7,
) -> Iterator[Message]:
    """Generate click events spread evenly over `hours` event hours.

    Normal events reach Kafka within seconds of happening. Late events reach it
    hours after. Malformed ones are not valid for the schema. Future ones carry an
    event time a month ahead of their Kafka timestamp.

    Args:
        count: Normal events.
        start_ms: Event time of the first event.
        hours: Event hours the normal events span.
        late: Events that arrive 3 to 30 hours after they happened.
        malformed: Messages that must be quarantined as undecodable.
        future: Events a month ahead of their Kafka timestamp.
        seed: Random seed; the same arguments give the same messages.

    Yields:
        Messages in production order.
    """
    rng = random.Random(seed)
    span = hours * HOUR_MS
    specials = ["late"] * late + ["malformed"] * malformed + ["future"] * future
    positions = sorted(rng.sample(range(count + len(specials)), len(specials))) if specials else []
    rng.shuffle(specials)
    special_at = dict(zip(positions, specials, strict=True))
    normal = 0
    for i in range(count + len(specials)):
        kind = special_at.get(i, "ok")
        event_ms = start_ms + (normal * span) // max(count, 1)
        if kind == "ok":
            normal += 1
        user = rng.randrange(1, 200_000)
        record = {
            "event_id": str(uuid.UUID(int=rng.getrandbits(128))),
            "user_id": user,
            "session_id": f"s-{user:x}-{rng.randrange(1000)}",
            "page": rng.choice(_PAGES),
            "referrer": rng.choice([None, "https://example.com/", "https://example.org/?q=x"]),
            "country": rng.choice(_COUNTRIES),
            "device": rng.choice(_DEVICES),
            "latency_ms": rng.randrange(5, 900),
            "ts": event_ms,
        }
        kafka_ms = event_ms + rng.randrange(0, 5000)
        if kind == "late":
            kafka_ms = event_ms + rng.randrange(3, 30) * HOUR_MS
        elif kind == "future":
            record["ts"] = event_ms + 30 * 24 * HOUR_MS
        value = json.dumps(record, separators=(",", ":")).encode()
        if kind == "malformed":
            value = rng.choice(
                [
                    value[: len(value) // 2],
                    json.dumps({**record, "user_id": "not-a-number"}).encode(),
                    b"\x00\x01binary garbage",
                    json.dumps({k: v for k, v in record.items() if k != "page"}).encode(),
                ]
            )
        yield Message(str(user).encode(), value, kafka_ms, kind)


def produce(
    bootstrap: str, topic: str, partitions: int, messages: Iterator[Message]
) -> dict[str, int]:
    """Produce messages round-robin over partitions, keyed but placed explicitly.

    Args:
        bootstrap: Broker list.
        topic: Topic.
        partitions: Number of partitions to spread over.
        messages: What to produce.

    Returns:
        How many messages of each kind were produced.
    """
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 500_000,
        }
    )
    counts: dict[str, int] = {}
    for i, m in enumerate(messages):
        while True:
            try:
                producer.produce(
                    topic, m.value, m.key, partition=i % partitions, timestamp=m.timestamp_ms
                )
                break
            except BufferError:
                producer.poll(0.1)
        counts[m.kind] = counts.get(m.kind, 0) + 1
        if i % 50_000 == 0:
            producer.poll(0)
    producer.flush(120)
    return counts


def main() -> int:
    """Run the demo end to end against a throw-away local broker."""
    from strata.config import ENV_BOOTSTRAP, ENV_METASTORE, ENV_WAREHOUSE, load_pipeline
    from strata.local_broker import LocalBroker
    from strata.local_metastore import LocalMetastore
    from strata.quality import render_quality, run_quality
    from strata.report import render_summary
    from strata.run import run_batch
    from strata.status import pipeline_status, render_status

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
        print(render_quality(run_quality(cfg, outcome.batch)))
        print(f"quality summary page: {cfg.location('quality')}/index.html")
        print()
        print(render_status(pipeline_status(cfg)))
        print()
        _show_landed(cfg)
        _show_registered(cfg)
        again = run_batch(cfg)
        print()
        print("a second run right away: " + render_summary(again))
    return 0


def _show_registered(cfg: PipelineConfig) -> None:
    from strata.metastore import MetastoreClient

    assert cfg.metastore.uri is not None
    with MetastoreClient(cfg.metastore.uri, cfg.metastore.timeout_s) as client:
        print(f"metastore {cfg.metastore.uri}, database {cfg.metastore.database}:")
        for suffix in ("", "_raw", "_quarantine", "_ledger"):
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


if __name__ == "__main__":
    sys.exit(main())
