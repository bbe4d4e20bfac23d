"""Kafka's traps on Apache Kafka itself, through the `strata` command line.

What the Kafka-wire broker (Tansu) cannot show is shown here on the real broker: a
transaction left open, compacted topics and their tombstones, retention and
DeleteRecords, `offsets_for_times`, CreatePartitions, topic ids, the lag Kafka's own
consumer-group tool reports, a broker killed mid-run, and the broker's own count of
down-converted messages. `broker` is overridden with the session's Apache Kafka, so
`make_pipeline` creates its topics there. Messages are produced here, not with
`produce_clicks`: Kafka needs no seal, and each test counts exactly what it produced.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
import yaml
from confluent_kafka import Consumer, Producer, TopicCollection, TopicPartition

# The admin module defines these without listing them in `__all__`.
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from strata import faults
from strata.local.events import click_events
from strata.local.kafka import LocalKafka, kafka_classpath
from strata.spark.jvm import java_binary
from strata.store.ledger import read_ledger
from tests.conftest import START_MS
from tests.faults import armed
from tests.kafka_wire import WireProducer, WireRecord, init_producer_id
from tests.kafka_wire import produce as wire_produce


@pytest.fixture
def broker(kafka: LocalKafka) -> LocalKafka:
    """The broker every `make_pipeline` pipeline of this module reads: Apache Kafka."""
    return kafka


def last_json(done: subprocess.CompletedProcess[str]) -> dict:
    """The JSON line a `--json` command ends its standard output with."""
    return json.loads(done.stdout.strip().splitlines()[-1])


def kafka_tool(kafka: LocalKafka, main: str, *args: str) -> str:
    """One of Kafka's own command-line tools, from the jars `make setup` fetched: what
    `bin/kafka-*.sh` runs. Returns its standard output."""
    java = java_binary()
    assert java is not None
    done = subprocess.run(
        [java, "-cp", kafka_classpath(), main, "--bootstrap-server", kafka.bootstrap, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def tool_rows(output: str) -> list[dict[str, str]]:
    """A Kafka tool's table (a header line, then one line per row) as dictionaries."""
    lines = [line.split() for line in output.splitlines() if line.strip()]
    header = next(i for i, words in enumerate(lines) if "PARTITION" in (w.upper() for w in words))
    names = [w.upper() for w in lines[header]]
    return [dict(zip(names, words, strict=False)) for words in lines[header + 1 :]]


def group_described(kafka: LocalKafka, group: str) -> list[dict[str, str]]:
    """`kafka-consumer-groups --describe --group GROUP`: a row per partition, with its
    CURRENT-OFFSET, LOG-END-OFFSET and LAG."""
    command = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
    return tool_rows(kafka_tool(kafka, command, "--describe", "--group", group))


def clicks(count: int, seed: int, start_ms: int = START_MS) -> list:
    """Valid click events (`strata.local.events.click_events`), each landing as a row."""
    return list(click_events(count, start_ms, 1, seed=seed))


def event_ids(messages) -> Counter[str]:
    return Counter(json.loads(m.value)["event_id"] for m in messages)


def landed_ids(p) -> Counter[str]:
    return Counter(p.table_rows("table", ["event_id"]).column("event_id").to_pylist())


def ledger_totals(p) -> dict[str, int]:
    rows = [r for r in read_ledger(p.cfg().places()).to_pylist() if r["kind"] == "ingest"]
    return {
        name: sum(r[name] or 0 for r in rows)
        for name in ("messages", "rows", "quarantined", "skipped", "gaps")
    }


def produce_keyed(kafka: LocalKafka, topic: str, messages, partitions: int = 1) -> None:
    """Produce messages in order, message i to partition i % partitions, acknowledged."""
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5})
    for i, m in enumerate(messages):
        producer.produce(topic, m.value, m.key, partition=i % partitions, timestamp=m.timestamp_ms)
    assert producer.flush(30) == 0


def _transaction(producer: Producer, topic: str, messages, commit: bool) -> None:
    """One transaction of a transactional producer over both partitions of `topic`."""
    producer.begin_transaction()
    for i, m in enumerate(messages):
        producer.produce(topic, m.value, m.key, partition=i % 2, timestamp=m.timestamp_ms)
    # Sent before the abort, as a failing application's are: an abort purges what the
    # client still holds, and those records would never reach the log.
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def _broker_setting(kafka: LocalKafka, name: str, value: str) -> None:
    """Set a dynamic broker setting and wait until the broker has it in effect: it learns
    it from the controller after the request returns."""
    entry = ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[entry])
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.incremental_alter_configs([resource])[resource].result(30)
    asked = ConfigResource(ResourceType.BROKER, "1")
    deadline = time.monotonic() + 30
    while admin.describe_configs([asked])[asked].result(30)[name].value != value:
        assert time.monotonic() < deadline, f"{name}={value} not in effect 30s after being set"
        time.sleep(0.05)


def hang_transaction(kafka: LocalKafka, topic: str, partition: int, messages) -> int:
    """Leave a transaction open on a partition whose coordinator knows nothing of it: a
    hanging transaction (KIP-664), as a coordinator bug or a producer that wrote past its
    transaction's abort leaves one. Returns its first offset.

    The broker checks a transactional write with the coordinator (KIP-890) unless told
    not to; it is told not to for this one write, by a producer without a transactional
    id, which the coordinator therefore never hears of.
    """
    _broker_setting(kafka, "transaction.partition.verification.enable", "false")
    try:
        producer_id, epoch = init_producer_id(kafka.bootstrap)
        return wire_produce(
            kafka.bootstrap,
            topic,
            partition,
            [WireRecord(m.value, m.key, timestamp_ms=m.timestamp_ms) for m in messages],
            producer=WireProducer(producer_id, epoch, "a-producer-gone"),
        )
    finally:
        _broker_setting(kafka, "transaction.partition.verification.enable", "true")


def test_a_transaction_left_open_is_shown_held_back_and_after_its_abort_the_rest_lands_once(
    make_pipeline, kafka
):
    p = make_pipeline(partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": p.name})
    producer.init_transactions(30)
    committed = [clicks(100, seed) for seed in (1, 2, 3)]
    for batch in committed:
        _transaction(producer, p.topic, batch, commit=True)
    aborted = clicks(60, 4)
    _transaction(producer, p.topic, aborted, commit=False)
    # Opened ten minutes ago by a producer gone since: 50 records on partition 0.
    began_ms = int(time.time() * 1000) - 600_000
    hanging = [
        m.__class__(m.key, m.value, began_ms + i, m.kind) for i, m in enumerate(clicks(50, 5))
    ]
    open_at = hang_transaction(kafka, p.topic, 0, hanging)
    after = clicks(200, 6)
    _transaction(producer, p.topic, after, commit=True)
    # Partition 0: 150 committed, 30 aborted, 4 markers, the open transaction's 50, then
    # 100 committed and a marker; partition 1 the same without the open transaction.
    assert open_at == 150 + 30 + 4
    high = {0: open_at + 50 + 100 + 1, 1: 150 + 30 + 4 + 100 + 1}

    first = p.cli("run", "--json")
    assert first.returncode == 0, first.stderr
    summary = last_json(first)
    # Everything a read_committed reader can read: partition 0 up to the open transaction.
    assert {r["partition"]: (r["start"], r["end"]) for r in summary["ranges"]} == {
        0: (0, open_at),
        1: (0, high[1]),
    }
    assert (summary["rows"], summary["quarantined"], summary["gaps"]) == (400, 0, 34 + 35)
    # Lag counts to the high watermark, and the run says what holds it.
    assert summary["lag_after"] == {f"{p.topic}:0": high[0] - open_at, f"{p.topic}:1": 0}
    [warning] = [w for w in summary["warnings"] if "held back by a transaction" in w]
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(began_ms // 1000))
    assert re.match(
        re.escape(
            f"partition 0 of `{p.topic}`: {high[0] - open_at} messages are held back by a "
            f"transaction open since {since}+00:00 ("
        )
        + r"1\d\.\dm"
        + re.escape(
            f" ago) at offset {open_at} (the last stable offset; the high watermark is "
            f"{high[0]}): no read_committed reader gets past it"
        ),
        warning,
    ), warning
    assert f"find-hanging --topic {p.topic} --partition 0" in warning
    assert f"abort --topic {p.topic} --partition 0 --start-offset {open_at}" in warning

    status = p.cli("status", "--json")
    assert status.returncode == 0, status.stderr
    parts = {q["partition"]: q for q in last_json(status)["partitions"]}
    assert {k: parts[0][k] for k in ("committed", "stable", "high", "lag", "held_back")} == {
        "committed": open_at,
        "stable": open_at,
        "high": high[0],
        "lag": high[0] - open_at,
        "held_back": high[0] - open_at,
    }
    assert (parts[0]["unstable_offset"], parts[0]["unstable_since"]) == (open_at, f"{since}+00:00")
    assert parts[1]["lag"] == 0 and "held_back" not in parts[1]
    scraped = p.cli("status", "--prometheus")
    assert (
        f'strata_held_back_messages{{partition="0",pipeline="{p.name}",topic="{p.topic}"}} '
        f"{float(high[0] - open_at)}" in scraped.stdout
    ), scraped.stdout
    # Kafka's own consumer-group tool counts the same lag: to the high watermark.
    described = group_described(kafka, p.cfg().group_id)
    assert {int(r["PARTITION"]): int(r["LAG"]) for r in described} == {0: high[0] - open_at, 1: 0}

    # The way out the warning names, with Kafka's own tool.
    transactions = "org.apache.kafka.tools.TransactionsCommand"
    found = tool_rows(
        kafka_tool(
            kafka,
            transactions,
            "find-hanging",
            "--topic",
            p.topic,
            "--max-transaction-timeout",
            "1",
        )
    )
    assert [(r["PARTITION"], r["STARTOFFSET"]) for r in found] == [("0", str(open_at))]
    kafka_tool(
        kafka,
        transactions,
        "abort",
        "--topic",
        p.topic,
        "--partition",
        "0",
        "--start-offset",
        str(open_at),
    )

    second = p.cli("run", "--json")
    assert second.returncode == 0, second.stderr
    rest = last_json(second)
    # Partition 1, read to its end already, has nothing new.
    assert [(r["partition"], r["start"], r["end"]) for r in rest["ranges"]] == [
        (0, open_at, high[0] + 1)
    ]
    # The aborted transaction's 50 records and its abort marker are gaps, never rows.
    assert (rest["rows"], rest["gaps"], rest["lag_after"][f"{p.topic}:0"]) == (100, 52, 0)
    assert not [w for w in rest["warnings"] if "held back" in w]
    # Every committed event landed once; no aborted one landed.
    assert landed_ids(p) == event_ids([m for batch in committed for m in batch] + after)
    assert ledger_totals(p) == {
        "messages": 500,
        "rows": 500,
        "quarantined": 0,
        "skipped": 0,
        "gaps": sum(high.values()) + 1 - 500,
    }


def _compacted_topic(kafka: LocalKafka, topic: str) -> tuple[int, list[int]]:
    """A compacted topic cleaned by the log cleaner: 50 keys written 4 times each, the
    last 10 of them deleted by a tombstone. Returns the log end and the tombstones' offsets.
    """
    kafka.create_topic(
        topic,
        1,
        {
            "cleanup.policy": "compact",
            "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "3600000",
        },
    )
    versions = clicks(200, 8)
    messages = [
        m.__class__(b"k%d" % (i % 50), m.value, m.timestamp_ms, m.kind)
        for i, m in enumerate(versions)
    ]
    tombstones = list(range(len(messages), len(messages) + 10))
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5})
    for m in messages:
        producer.produce(topic, m.value, m.key, partition=0, timestamp=m.timestamp_ms)
    for k in range(40, 50):
        producer.produce(topic, None, b"k%d" % k, partition=0, timestamp=START_MS + 4_000_000)
    assert producer.flush(30) == 0
    # The cleaner leaves the active segment alone: a message stamped more than segment.ms
    # after the segment's first batch rolls it.
    time.sleep(0.3)
    [closer] = clicks(1, 9, START_MS + 5_000_000)
    producer.produce(topic, closer.value, b"closer", partition=0, timestamp=closer.timestamp_ms)
    assert producer.flush(30) == 0
    end = len(messages) + 10 + 1
    # The survivors: the newest value of 40 keys, 10 tombstones, and the closer.
    deadline = time.monotonic() + 60
    while _offsets_held(kafka, topic, end) != 51:
        assert time.monotonic() < deadline, "the log cleaner did not compact the topic in 60s"
        time.sleep(0.5)
    return end, tombstones


def _offsets_held(kafka: LocalKafka, topic: str, end: int) -> int:
    consumer = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": "counting", "enable.partition.eof": True}
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        held = 0
        while True:
            [m] = consumer.consume(1, 10) or [None]
            assert m is not None, "no end of partition within 10s"
            if m.error() is not None:
                return held
            held += 1
    finally:
        consumer.close()


@pytest.mark.parametrize("rule", ["quarantine", "skip", "fail"])
def test_a_compacted_topic_lands_its_survivors_and_its_tombstones_follow_on_tombstone(
    make_pipeline, kafka, rule
):
    # Quarantine is the default: that pipeline leaves the key out.
    rules = {} if rule == "quarantine" else {"on_tombstone": rule}
    p = make_pipeline(partitions=1, create=False, overrides=rules)
    end, tombstones = _compacted_topic(kafka, p.topic)
    removed = end - 51

    done = p.cli("run", "--json")
    if rule == "fail":
        assert done.returncode == 1, done.stdout + done.stderr
        error = last_json(done)["error"]
        assert error.startswith(
            f"batch 1: partition 0 of `{p.topic}`: 10 tombstones (null values), the first at "
            f"offset {tombstones[0]}; on_tombstone is `fail`, so nothing was committed."
        ), error
        assert "Set on_tombstone to `skip`" in error and "Traceback" not in done.stderr
        assert read_ledger(p.cfg().places()).num_rows == 0
        # The batch's plan stands; under another rule it finishes with the same offsets.
        path = p.conf_dir / "pipelines" / f"{p.name}.yaml"
        path.write_text(
            yaml.safe_dump({**yaml.safe_load(path.read_text()), "on_tombstone": "skip"})
        )
        done = p.cli("run", "--json")
        rule = "skip"
    assert done.returncode == 0, done.stderr
    summary = last_json(done)
    assert summary["batch"] == 1
    assert [(r["start"], r["end"]) for r in summary["ranges"]] == [(0, end)]
    quarantined = 10 if rule == "quarantine" else 0
    skipped = 10 if rule == "skip" else 0
    assert (summary["messages"], summary["rows"], summary["quarantined"]) == (51, 41, quarantined)
    assert (summary["skipped"], summary["gaps"]) == (skipped, removed)
    assert ledger_totals(p) == {
        "messages": 51,
        "rows": 41,
        "quarantined": quarantined,
        "skipped": skipped,
        "gaps": removed,
    }
    # Each key's newest value landed, and the tombstones where the rule says.
    keys = Counter(p.table_rows("table", ["_key"]).column("_key").to_pylist())
    assert keys == Counter([b"k%d" % k for k in range(40)] + [b"closer"])
    reasons = p.table_rows("quarantine", ["_offset", "reason"]).to_pylist()
    assert sorted((r["_offset"], r["reason"]) for r in reasons) == (
        [(o, "empty value (tombstone)") for o in tombstones] if rule == "quarantine" else []
    )
    # The raw copy keeps every message read, tombstones included.
    assert p.raw_copies() == Counter((0, o) for o in [*range(150, 190), *tombstones, end - 1])


def _timed(messages) -> list:
    """The messages stamped with their own event time, so Kafka's timestamps increase."""
    return [m.__class__(m.key, m.value, json.loads(m.value)["ts"], m.kind) for m in messages]


@pytest.mark.parametrize("how", ["retention", "delete_records"])
def test_offsets_deleted_before_they_were_read_stop_the_run_until_the_loss_is_accepted(
    make_pipeline, kafka, how
):
    p = make_pipeline(partitions=1, create=False)
    kafka.create_topic(p.topic, 1, {"segment.ms": "100"})
    read, lost, fresh = clicks(100, 20), clicks(100, 21), clicks(30, 22)
    produce_keyed(kafka, p.topic, read)
    assert p.cli("run").returncode == 0
    produce_keyed(kafka, p.topic, lost)
    if how == "delete_records":
        assert kafka.delete_records(p.topic, {0: 200}) == {0: 200}
    else:
        # The messages are stamped long ago: retention deletes every segment at once.
        kafka.alter_topic_config(p.topic, {"retention.ms": "100"})
        deadline = time.monotonic() + 60
        while _log_start(kafka, p.topic) < 200:
            assert time.monotonic() < deadline, "retention deleted nothing in 60s"
            time.sleep(0.5)
        kafka.alter_topic_config(p.topic, {"retention.ms": "-1"})
    produce_keyed(kafka, p.topic, fresh)

    stopped = p.cli("run", "--json")
    assert stopped.returncode == 1, stopped.stdout
    assert last_json(stopped)["error"] == (
        f"partition 0 of `{p.topic}`: committed offset 100 is below the log start 200; 100 "
        "messages were deleted by retention before they were read. Nothing was read. Re-run "
        "with --accept-loss to record the loss in the ledger and go on from the log start."
    )
    assert [r["batch"] for r in read_ledger(p.cfg().places()).to_pylist()] == [1]

    accepted = p.cli("run", "--json", "--accept-loss", "INC-7: the pipeline was paused")
    assert accepted.returncode == 0, accepted.stderr
    summary = last_json(accepted)
    assert [(r["start"], r["end"], r["rows"]) for r in summary["ranges"]] == [(200, 230, 30)]
    rows = read_ledger(p.cfg().places()).to_pylist()
    [loss] = [r for r in rows if r["kind"] == "loss"]
    assert (loss["batch"], loss["start_offset"], loss["end_offset"]) == (2, 100, 200)
    assert "INC-7: the pipeline was paused" in loss["note"]
    # Nothing but the lost range is skipped: the rest landed once, none of the lost.
    assert landed_ids(p) == event_ids(read + fresh)


def _log_start(kafka: LocalKafka, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "watching"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), 10)[0]
    finally:
        consumer.close()


def test_starting_offsets_at_a_moment_start_each_partition_at_the_brokers_answer(
    make_pipeline, kafka
):
    # Event i is stamped 36 s after event i - 1; the moment falls between events 40 and 41.
    moment_ms = START_MS + 40 * 36_000 + 500
    moment = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(moment_ms // 1000)) + ".500+00:00"
    p = make_pipeline(partitions=2, overrides={"starting_offsets": moment})
    messages = _timed(clicks(100, 30))
    produce_keyed(kafka, p.topic, messages, partitions=2)

    done = p.cli("run", "--json")
    assert done.returncode == 0, done.stderr
    # Event 41 is offset 20 of partition 1; event 42 offset 21 of partition 0.
    assert {r["partition"]: (r["start"], r["end"]) for r in last_json(done)["ranges"]} == {
        0: (21, 50),
        1: (20, 50),
    }
    assert landed_ids(p) == event_ids(messages[41:])
    notes = {r["partition"]: r["note"] for r in read_ledger(p.cfg().places()).to_pylist()}
    assert notes[0] == (
        f"began at offset 21: starting_offsets {moment}: the first message at or after it"
    ), notes


def test_partitions_added_to_a_topic_are_read_from_their_log_start(make_pipeline, kafka):
    p = make_pipeline(partitions=1, overrides={"starting_offsets": "latest"})
    assert p.cli("run").returncode == 0  # records partition 0's start: its end, 0
    before = clicks(50, 40)
    produce_keyed(kafka, p.topic, before)
    kafka.create_partitions(p.topic, 3)
    added = clicks(60, 41)
    produce_keyed(kafka, p.topic, added, partitions=3)

    done = p.cli("run", "--json")
    assert done.returncode == 0, done.stderr
    summary = last_json(done)
    # `latest` is for a topic new to the pipeline; the added partitions start at 0.
    assert {r["partition"]: (r["start"], r["end"]) for r in summary["ranges"]} == {
        0: (0, 70),
        1: (0, 20),
        2: (0, 20),
    }
    assert summary["new_partitions"] == [f"{p.topic}:1", f"{p.topic}:2"]
    assert landed_ids(p) == event_ids(before + added)
    notes = {r["partition"]: r["note"] for r in read_ledger(p.cfg().places()).to_pylist()}
    assert notes[1] == (
        "began at offset 0: a partition added to a topic already read starts at its log start"
    )


def _topic_id(kafka: LocalKafka, topic: str) -> str:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    described = admin.describe_topics(TopicCollection([topic]))[topic].result(30)
    return str(described.topic_id)


def test_a_topic_deleted_and_created_again_is_told_by_its_id_until_a_seek_records_it(
    make_pipeline, kafka
):
    p = make_pipeline(partitions=1)
    old_id = _topic_id(kafka, p.topic)
    first = clicks(50, 50)
    produce_keyed(kafka, p.topic, first)
    assert p.cli("run").returncode == 0
    kafka.delete_topic(p.topic)
    kafka.create_topic(p.topic, 1)
    new_id = _topic_id(kafka, p.topic)
    # More than was committed: by its watermarks alone the new log looks like progress.
    second = clicks(80, 51)
    produce_keyed(kafka, p.topic, second)

    stopped = p.cli("run", "--json")
    assert stopped.returncode == 1, stopped.stdout
    error = last_json(stopped)["error"]
    assert error.startswith(
        f"topic `{p.topic}` (id {old_id} when batch 1 was committed, {new_id} now; partition 0) "
        "was deleted and created again under the same name"
    ), error
    assert read_ledger(p.cfg().places()).num_rows == 1

    seek = p.cli("ledger", "seek", "--topic", p.topic, "--to", "earliest", "--reason", "INC-9")
    assert seek.returncode == 0, seek.stderr
    done = p.cli("run", "--json")
    assert done.returncode == 0, done.stderr
    assert [(r["start"], r["end"]) for r in last_json(done)["ranges"]] == [(0, 80)]
    assert landed_ids(p) == event_ids(first + second)


def test_the_lag_strata_status_shows_is_the_lag_kafkas_consumer_group_tool_shows(
    make_pipeline, kafka
):
    p = make_pipeline(partitions=2)
    produce_keyed(kafka, p.topic, clicks(300, 60), partitions=2)
    assert p.cli("run", "--max-offsets", "100").returncode == 0

    status = p.cli("status", "--json")
    assert status.returncode == 0, status.stderr
    shown = {
        q["partition"]: (q["committed"], q["high"], q["lag"])
        for q in last_json(status)["partitions"]
    }
    assert shown == {0: (100, 150, 50), 1: (100, 150, 50)}
    described = group_described(kafka, p.cfg().group_id)
    assert {
        int(r["PARTITION"]): (int(r["CURRENT-OFFSET"]), int(r["LOG-END-OFFSET"]), int(r["LAG"]))
        for r in described
    } == shown


# Small fetches: when the task stops mid-read, most of its range is still on the broker.
SMALL_FETCHES = {
    "fetch.max.bytes": 16_384,
    "max.partition.fetch.bytes": 8_192,
    "message.max.bytes": 8_192,
    "queued.max.messages.kbytes": 16,
    "queued.min.messages": 20,
}


def _stopped(proc: subprocess.Popen) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            if child.status() == psutil.STATUS_STOPPED:
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def _thaw(proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while proc.poll() is None and time.monotonic() < deadline:
        for task in _stopped(proc):
            task.send_signal(signal.SIGCONT)
        time.sleep(0.1)


def test_a_broker_killed_mid_run_and_restarted_on_its_log_leaves_the_next_run_exact(
    make_pipeline, kafka, tmp_path
):
    p = make_pipeline(partitions=2, overrides={"kafka": {"properties": SMALL_FETCHES}})
    messages = clicks(6000, 70)
    produce_keyed(kafka, p.topic, messages, partitions=2)
    out, err = tmp_path / "run.out", tmp_path / "run.err"
    # Output to files: librdkafka's refusals while the broker is down would fill a pipe.
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "strata"), "run", "--pipeline", p.name]
            + ["--conf-dir", str(p.conf_dir)],
            stdout=stdout,
            stderr=stderr,
            env=p.env(**armed(stop_at=faults.MID_READ, once=tmp_path / "stopped")),
        )
    try:
        deadline = time.monotonic() + 240
        while not _stopped(proc):
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()[-3000:]
            time.sleep(0.1)
        kafka.kill()
        _thaw(proc, 3)
        kafka.start()
        _thaw(proc, 300)
        code = proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = err.read_text()
    # The run read on once the broker was back, or stopped saying why; nothing half-done.
    assert code in (0, 1), said[-3000:]
    if code == 1:
        assert said.strip().splitlines()[-1].startswith("strata: error: "), said[-3000:]

    again = p.cli("run", "--json")
    assert again.returncode == 0, again.stderr
    assert landed_ids(p) == event_ids(messages)
    assert p.raw_copies() == Counter((q, o) for q in (0, 1) for o in range(3000))
    assert ledger_totals(p) == {
        "messages": 6000,
        "rows": 6000,
        "quarantined": 0,
        "skipped": 0,
        "gaps": 0,
    }


def test_the_broker_converts_no_message_down_while_strata_reads(make_pipeline, kafka):
    p = make_pipeline(partitions=2)
    # Compressed batches, the format every current producer writes: an old client would
    # make the broker decompress and rewrite each one it fetches.
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "compression.type": "zstd"})
    messages = clicks(2000, 80)
    for i, m in enumerate(messages):
        producer.produce(p.topic, m.value, m.key, partition=i % 2, timestamp=m.timestamp_ms)
    assert producer.flush(30) == 0

    done = p.cli("run", "--json")
    assert done.returncode == 0, done.stderr
    assert landed_ids(p) == event_ids(messages)
    # The broker counted Strata's fetches of the topic (its JMX answers), and converted none.
    fetches = f"kafka.server:type=BrokerTopicMetrics,name=TotalFetchRequestsPerSec,topic={p.topic}"
    assert kafka.jmx_value(fetches, "Count") >= 1
    assert kafka.fetch_message_conversions() == 0
    assert last_json(done)["kafka_client"].startswith("librdkafka ")
