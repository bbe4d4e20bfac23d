"""Messages and batches that used to crash a task or lie, through the broker and `strata run`.

A batch's plan is saved and resumed, so a task that fails on one message fails that
batch on every re-run: each case here runs the real command against the real broker
and checks that every offset lands exactly once.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from collections import Counter
from pathlib import Path

from confluent_kafka import Producer

from strata.local.events import HOUR_MS, click_events, produce
from tests.conftest import START_MS, expected_offsets, produce_clicks
from tests.faults import armed
from tests.kafka_wire import WireRecord
from tests.kafka_wire import produce as wire_produce


def _click(event_id: str, ts: int, **extra) -> bytes:
    body = {"event_id": event_id, "user_id": 1, "page": "/", "device": "mobile", "ts": ts, **extra}
    return json.dumps(body).encode()


def _committed_rows(p) -> int:
    """Rows the pipeline's tables hold (files written but never committed don't count)."""
    rows = 0
    for which in ("table", "quarantine", "raw"):
        if (Path(p.cfg().location(which)) / "_delta_log").exists():
            rows += p.table_rows(which, ["_offset"]).num_rows
    return rows


def _per_partition(total: int, partitions: int) -> dict[int, int]:
    return {q: len(range(q, total, partitions)) for q in range(partitions)}


def test_a_header_key_the_kafka_client_cannot_read_is_quarantined_and_the_batch_lands(
    make_pipeline, broker
):
    p = make_pipeline(partitions=2)
    kinds = produce(broker.bootstrap, p.topic, 2, click_events(3_000, START_MS, 2))
    per = _per_partition(sum(kinds.values()), 2)
    # Three clicks in one record batch, so one poll hands them over together; the
    # middle one carries a header key that is not UTF-8.
    ts = START_MS + HOUR_MS
    poison = _click("poison", ts)
    base = wire_produce(
        broker.bootstrap,
        p.topic,
        0,
        [
            WireRecord(_click("before", ts), b"u-before", [(b"trace-id", b"t1")], ts),
            WireRecord(poison, b"u-poison", [(b"\xff\xfetrace-id", b"t2")], ts),
            WireRecord(_click("after", ts), b"u-after", [(b"trace-id", b"t3")], ts),
        ],
    )
    assert base == per[0]
    per[0] += 3

    done = p.cli("run", "--json", "--no-quality")
    assert done.returncode == 0, done.stderr[-3000:]

    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)
    quarantined = [
        r
        for r in p.table_rows("quarantine").to_pylist()
        if (r["_partition"], r["_offset"]) == (0, base + 1)
    ]
    assert [(r["_key"], r["_value"], r["_headers"]) for r in quarantined] == [
        (b"u-poison", poison, None)
    ]
    assert quarantined[0]["reason"] == (
        "headers unreadable by the Kafka client: header key b'\\xff\\xfetrace-id' is not "
        "UTF-8 (invalid start byte at byte 0)"
    )
    landed = {
        r["event_id"]: r["_key"]
        for r in p.table_rows("table", ["event_id", "_key"]).to_pylist()
        if r["event_id"] in ("before", "after", "poison")
    }
    assert landed == {"before": b"u-before", "after": b"u-after"}
    raw = {
        r["_offset"]: r["_headers"]
        for r in p.table_rows("raw", ["_partition", "_offset", "_headers"]).to_pylist()
        if r["_partition"] == 0 and base <= r["_offset"] < base + 3
    }
    assert raw == {
        base: [{"key": "trace-id", "value": b"t1"}],
        base + 1: None,
        base + 2: [{"key": "trace-id", "value": b"t3"}],
    }
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["status"] == "committed"


# Most Linux systems start processes with a soft limit of 1024 open files. Spark's
# JVM lives with it; a writer holding one file per event hour cannot. The hard limit
# goes down too: the JVM raises its soft limit to the hard one at start-up, and the
# Python workers it starts would inherit that.
OPEN_FILES = 1024


def _limit_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


def test_a_batch_over_5000_event_hours_lands_once_under_a_low_open_files_limit(
    make_pipeline, broker
):
    hours = 5_000
    # One task reads both partitions, so one Python worker meets every hour. Every
    # event is up to seven months late, and none is refused for its age.
    p = make_pipeline(
        partitions=2,
        overrides={
            "event_time": {"max_lateness": None},
            "limits": {"max_open_files": 32},
            "spark": {"tasks": 1},
        },
    )
    per = produce_clicks(
        broker, p.topic, 2, hours, start_ms=START_MS - hours * HOUR_MS, hours=hours
    )
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "strata"),
            "run",
            "--json",
            "--no-quality",
            "--pipeline",
            p.name,
            "--conf-dir",
            str(p.conf_dir),
        ],
        capture_output=True,
        text=True,
        env=p.env(),
        timeout=900,
        preexec_fn=_limit_open_files,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    table = p.table_rows("table", ["_partition", "_offset", "dt", "hr"])
    landed = Counter(
        zip(table["_partition"].to_pylist(), table["_offset"].to_pylist(), strict=True)
    )
    assert landed == expected_offsets(per)
    assert p.table_rows("quarantine", ["_offset"]).num_rows == 0
    assert p.raw_copies() == expected_offsets(per)
    assert len(set(zip(table["dt"].to_pylist(), table["hr"].to_pylist(), strict=True))) == hours
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    # One file per hour: the open-files bound closed each hour's file once, for good.
    assert summary["files"]["table"] == hours


def test_large_messages_land_whole_and_once_in_byte_sized_chunks(make_pipeline, broker):
    # Small chunks, so the batch is read in many; the first partition ends with a
    # message of 101 MB: above the largest fetch response librdkafka accepts by
    # default (100 MB), which the broker serves (it accepts far larger messages).
    mb = 1 << 20
    p = make_pipeline(partitions=2, create=False, overrides={"limits": {"read_chunk_mb": 4}})
    # Kafka refuses record batches above 1 MB unless the topic allows more.
    broker.create_topic(p.topic, 2, {"max.message.bytes": str(200 * mb)})
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "message.max.bytes": 200 * mb,
            "linger.ms": 5,
            # Uncompressed, so the 101 MB message takes 101 MB on the wire.
            "compression.type": "none",
        }
    )
    ts = START_MS + 10 * 60_000
    sizes = {0: [3 * mb] * 12 + [101 * mb], 1: [3 * mb // 2] * 20}
    produced: dict[tuple[int, int], tuple[str, int]] = {}
    for partition, lengths in sizes.items():
        for i, length in enumerate(lengths):
            event_id = f"p{partition}-{i}"
            page = "/" + "abcdefghij" * (length // 10)
            producer.produce(
                p.topic, _click(event_id, ts, page=page), partition=partition, timestamp=ts
            )
            produced[(partition, i)] = (event_id, len(page))
        producer.flush(120)
    per = {q: len(lengths) for q, lengths in sizes.items()}

    done = p.cli("run", "--json", "--no-quality")
    assert done.returncode == 0, done.stderr[-3000:]

    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)
    rows = p.table_rows("table", ["_partition", "_offset", "event_id", "page"])
    landed = {
        (q, o): (e, len(page))
        for q, o, e, page in zip(
            rows["_partition"].to_pylist(),
            rows["_offset"].to_pylist(),
            rows["event_id"].to_pylist(),
            rows["page"].to_pylist(),
            strict=True,
        )
    }
    assert landed == produced
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["bytes"] > 130 * mb


def test_a_message_the_read_skipped_fails_the_batch_and_a_clean_rerun_lands_it(
    make_pipeline, broker
):
    p = make_pipeline(partitions=2)
    per = produce_clicks(broker, p.topic, 2, 2_000)
    failed = p.cli("run", "--no-quality", env=p.env(**armed(skip=(p.topic, 1, 321))))
    assert failed.returncode == 1
    error = failed.stderr.split("strata: error: ")[-1]
    assert error.startswith(
        f"partition 1 of `{p.topic}`: offset 321 holds a message but the read of "
    ), error
    assert "Traceback" not in error
    assert _committed_rows(p) == 0
    rerun = p.cli("run", "--no-quality")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert p.landed() == expected_offsets(per)
