"""The local Apache Kafka: what Kafka does that the Kafka-wire broker (Tansu) does not.

The session's broker (`kafka`, which is also every test's `broker`) serves the module;
the first test starts one of its own, to see what it listens on and what a stop leaves.
"""

from __future__ import annotations

import json
import socket
import time
import uuid

import psutil
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from strata.batch.read import RangeProgress, read_ranges
from strata.local.kafka import LOOPBACK, LocalKafka
from strata.local.service import port_open
from strata.store.ranges import OffsetRange
from tests.conftest import START_MS


def _topic() -> str:
    return "k-" + uuid.uuid4().hex[:8]


def _consumer(kafka: LocalKafka, **config: str) -> Consumer:
    return Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": "tests", "enable.auto.commit": False}
        | config
    )


def _read_all(kafka: LocalKafka, topic: str, partitions: int, **config: str):
    """Every (partition, offset, value) a consumer reads from the start: until each
    partition's position reaches its end, or nothing more arrives for 2 s (a
    `read_committed` consumer's position stays at its last message's while aborted
    records and markers are skipped)."""
    consumer = _consumer(kafka, **config)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = [consumer.get_watermark_offsets(tp, 10)[1] for tp in tps]
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        read, idle_since = [], time.monotonic()
        while time.monotonic() - idle_since < 2:
            positions = [tp.offset for tp in consumer.position(tps)]
            if all(pos >= end for pos, end in zip(positions, ends, strict=True)):
                break
            for m in consumer.consume(500, 0.5):
                assert m.error() is None, m.error()
                read.append((m.partition(), m.offset(), m.value()))
                idle_since = time.monotonic()
        return sorted(read)
    finally:
        consumer.close()


def _listening(pid: int) -> set[tuple[str, int]]:
    return {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.Process(pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    }


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def test_kafka_listens_on_loopback_only_and_a_stop_leaves_no_process_or_port(tmp_path):
    kafka = LocalKafka(tmp_path / "kafka").start()
    try:
        pid = kafka.pid
        assert pid is not None
        # The broker announces itself at the address clients were given.
        consumer = _consumer(kafka)
        brokers = consumer.list_topics(timeout=10).brokers
        consumer.close()
        assert [(b.host, b.port) for b in brokers.values()] == [(LOOPBACK, kafka.port)]
        assert kafka.fetch_message_conversions() == 0  # starts the JMX agent
        # Broker, controller and JMX, and nothing else, every one on loopback: the JVM's
        # own JMX options would add the JDK's local connector on every interface.
        assert _listening(pid) == {
            (LOOPBACK, kafka.port),
            (LOOPBACK, kafka.controller_port),
            (LOOPBACK, kafka.jmx_port),
        }
    finally:
        kafka.stop()
    assert kafka.pid is None and not psutil.pid_exists(pid)
    assert all(_bindable(p) for p in (kafka.port, kafka.controller_port, kafka.jmx_port))
    # Its own log, in the directory it was given.
    assert "Kafka Server started" in kafka.log_path.read_text()
    assert kafka.log_path == tmp_path / "kafka" / "server.log"


def test_a_topic_created_with_configs_shows_them_and_takes_changes(kafka):
    topic = _topic()
    kafka.create_topic(
        topic, 2, {"cleanup.policy": "compact", "retention.ms": "3600000", "segment.ms": "60000"}
    )
    kafka.alter_topic_config(topic, {"retention.ms": "7200000"})
    shown = kafka.topic_config(topic)
    assert {k: shown[k] for k in ("cleanup.policy", "retention.ms", "segment.ms")} == {
        "cleanup.policy": "compact",
        "retention.ms": "7200000",
        "segment.ms": "60000",
    }


def test_the_high_watermark_is_the_log_end(kafka):
    # Produced in large batches: a broker that reports the base offset of the last
    # batch (Tansu) would say far less than 1,000.
    topic = _topic()
    kafka.create_topic(topic, 1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 50})
    for i in range(1000):
        producer.produce(topic, b"%d" % i, partition=0)
    producer.flush(30)
    consumer = _consumer(kafka)
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), 10) == (0, 1000)
    finally:
        consumer.close()


def test_read_committed_sees_committed_transactions_only_and_stops_at_an_open_one(kafka):
    topic = _topic()
    kafka.create_topic(topic, 1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": topic})
    producer.init_transactions(30)
    for values, commit in (([b"c0", b"c1", b"c2"], True), ([b"a0", b"a1"], False)):
        producer.begin_transaction()
        for v in values:
            producer.produce(topic, v, partition=0)
        # Sent before the abort, as a failing application's would be: an abort purges
        # what the client still holds, and the aborted records would never reach the log.
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"open", partition=0)
    producer.flush(30)
    try:
        # Offsets: c0-c2 at 0-2, the commit marker at 3, a0 a1 at 4-5 (kept in the log),
        # the abort marker at 6, the open transaction's message at 7.
        committed = _consumer(kafka, **{"isolation.level": "read_committed"})
        uncommitted = _consumer(kafka, **{"isolation.level": "read_uncommitted"})
        try:
            tp = TopicPartition(topic, 0)
            # read_committed ends at the last stable offset: the open transaction's start.
            assert committed.get_watermark_offsets(tp, 10) == (0, 7)
            assert uncommitted.get_watermark_offsets(tp, 10) == (0, 8)
        finally:
            committed.close()
            uncommitted.close()
        assert _read_all(kafka, topic, 1, **{"isolation.level": "read_committed"}) == [
            (0, 0, b"c0"),
            (0, 1, b"c1"),
            (0, 2, b"c2"),
        ]
        # The aborted records stay in the log, and each marker takes an offset.
        assert _read_all(kafka, topic, 1, **{"isolation.level": "read_uncommitted"}) == [
            (0, 0, b"c0"),
            (0, 1, b"c1"),
            (0, 2, b"c2"),
            (0, 4, b"a0"),
            (0, 5, b"a1"),
            (0, 7, b"open"),
        ]
    finally:
        producer.abort_transaction(30)


def test_offsets_for_times_answers_the_first_offset_at_or_after_the_time(kafka):
    topic = _topic()
    kafka.create_topic(topic, 1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(10):
        producer.produce(topic, b"%d" % i, partition=0, timestamp=START_MS + i * 1000)
    producer.flush(30)
    consumer = _consumer(kafka)
    try:
        found = [
            consumer.offsets_for_times([TopicPartition(topic, 0, START_MS + at)], 10)[0].offset
            for at in (6500, 60_000)
        ]
    finally:
        consumer.close()
    # The first message at or after 6.5 s is offset 7; none is at or after 60 s (-1).
    assert found == [7, -1]


def test_delete_records_moves_the_log_start(kafka):
    topic = _topic()
    kafka.create_topic(topic, 1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(10):
        producer.produce(topic, b"%d" % i, partition=0)
    producer.flush(30)

    assert kafka.delete_records(topic, {0: 4}) == {0: 4}

    assert _read_all(kafka, topic, 1) == [(0, o, b"%d" % o) for o in range(4, 10)]


def test_added_partitions_take_messages(kafka):
    topic = _topic()
    kafka.create_topic(topic, 1)
    kafka.create_partitions(topic, 3)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for p in range(3):
        producer.produce(topic, b"%d" % p, partition=p)
    producer.flush(30)
    assert _read_all(kafka, topic, 3) == [(p, 0, b"%d" % p) for p in range(3)]


def test_a_killed_broker_restarts_on_its_log(kafka):
    topic = _topic()
    kafka.create_topic(topic, 2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "acks": "all"})
    for i in range(100):
        producer.produce(topic, b"%d" % i, partition=i % 2)
    assert producer.flush(30) == 0

    kafka.kill()
    assert not port_open(kafka.port)
    kafka.restart()

    assert _read_all(kafka, topic, 2) == sorted((i % 2, i // 2, b"%d" % i) for i in range(100))


def test_the_project_client_reads_without_down_conversion(kafka):
    topic = _topic()
    kafka.create_topic(topic, 1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "compression.type": "zstd"})
    values = [json.dumps({"n": i}).encode() for i in range(200)]
    for v in values:
        producer.produce(topic, v, partition=0)
    producer.flush(30)
    progress: dict[tuple[str, int, int], RangeProgress] = {}
    chunks = read_ranges(
        {"bootstrap.servers": kafka.bootstrap}, [OffsetRange(topic, 0, 0, 200)], 5, progress
    )
    assert [v for c in chunks for v in c.table["_value"].to_pylist()] == values
    # The broker counted the fetches (JMX answers for real), and converted none.
    fetched = f"kafka.server:type=BrokerTopicMetrics,name=TotalFetchRequestsPerSec,topic={topic}"
    assert kafka.jmx_value(fetched, "Count") >= 1
    assert kafka.fetch_message_conversions() == 0
