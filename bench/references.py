"""The reference programs the job is measured against, in the same run.

- bare loop: one consumer assigned every partition, `consume(10000)`, counting bytes
  and nothing else. The broker's serving limit on this machine.
- naive peer: the same loop, plus a pyarrow JSON decode and one Parquet file per
  event hour per poll, in one process: what a user writes by hand in 50 lines, with
  no raw copy, no quarantine, no exactly-once commit.
- naive peer + raw copy: the naive peer that also writes every message as it came
  (coordinates, timestamp, value bytes) to one Parquet file per poll: what Strata's
  raw copy costs by itself, apart from its other guarantees.

All three, like the job, ask consume() for no more messages than are left to read:
it waits out its timeout until it holds as many as asked for, which would add a
second of idling to the end of every read.

Each runs as `python -m bench.references {bare,naive,naive_raw} BOOTSTRAP TOPIC
PARTITIONS OUT` and prints one JSON line.
"""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq
from confluent_kafka import Consumer, TopicPartition

from strata.batch.read import READ_TUNING


def _consumer(bootstrap: str, topic: str, partitions: int) -> tuple[Consumer, dict[int, int]]:
    consumer = Consumer(
        {
            **READ_TUNING,
            "bootstrap.servers": bootstrap,
            "group.id": "bench-reference",
            "enable.auto.commit": False,
        }
    )
    ends = {
        p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
        for p in range(partitions)
    }
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    return consumer, ends


def run(kind: str, bootstrap: str, topic: str, partitions: int, out: Path) -> dict[str, float]:
    """Read every partition to its high watermark; for `naive`, also decode and write."""
    consumer, ends = _consumer(bootstrap, topic, partitions)
    began = time.monotonic()
    if kind == "bare":
        # Nothing but the loop: the load has no offset gaps, so a count tells when to stop.
        total = sum(ends.values())
        messages = nbytes = 0
        while messages < total:
            for m in consumer.consume(min(10_000, total - messages), timeout=1.0):
                value = m.value()
                if value is not None:
                    messages += 1
                    nbytes += len(value)
        seconds = time.monotonic() - began
        consumer.close()
        return {"messages": messages, "bytes": nbytes, "seconds": seconds, "files": 0}
    remaining = {p: e for p, e in ends.items() if e > 0}
    total = sum(ends.values())
    messages = nbytes = files = polls = 0
    raw = kind == "naive_raw"
    while remaining:
        batch: list[Any] = consumer.consume(min(10_000, total - messages), timeout=1.0)
        values = []
        coordinates: list[tuple[int, int, int]] = []
        for m in batch:
            if m.error() is not None:
                continue
            p = m.partition()
            end = remaining.get(p)
            if end is None or m.offset() >= end:
                continue
            value = m.value()
            messages += 1
            nbytes += len(value)
            values.append(value)
            if raw:
                coordinates.append((p, m.offset(), m.timestamp()[1]))
            if m.offset() == end - 1:
                del remaining[p]
        if raw and values:
            numbers, offsets, stamps = zip(*coordinates, strict=True)
            copy = pa.table(
                {
                    "_topic": pa.array([topic] * len(values), pa.string()),
                    "_partition": pa.array(numbers, pa.int32()),
                    "_offset": pa.array(offsets, pa.int64()),
                    "_timestamp": pa.array(stamps, pa.timestamp("ms", tz="UTC")),
                    "_value": pa.array(values, pa.binary()),
                }
            )
            (out / "raw").mkdir(parents=True, exist_ok=True)
            pq.write_table(copy, out / "raw" / f"poll-{polls:06d}.parquet")
            files += 1
        if values:
            table = pajson.read_json(io.BytesIO(b"\n".join(values)))
            hours = pc.strftime(
                pc.cast(pc.multiply(table.column("ts"), 1000), pa.timestamp("us", tz="UTC")),
                format="%Y-%m-%d/%H",
            )
            for hour in pc.unique(hours).to_pylist():
                dt, hr = hour.split("/")
                target = out / f"dt={dt}" / f"hr={hr}"
                target.mkdir(parents=True, exist_ok=True)
                pq.write_table(
                    table.filter(pc.equal(hours, hour)), target / f"poll-{polls:06d}.parquet"
                )
                files += 1
            polls += 1
    seconds = time.monotonic() - began
    consumer.close()
    return {"messages": messages, "bytes": nbytes, "seconds": seconds, "files": files}


if __name__ == "__main__":
    kind, bootstrap, topic, partitions, out = sys.argv[1:6]
    print(json.dumps(run(kind, bootstrap, topic, int(partitions), Path(out))))
