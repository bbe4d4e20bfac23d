"""Confluent Avro through a Schema Registry, end to end: broker, Spark tasks, the tables.

Producers write with confluent-kafka's `AvroSerializer` against the local registry
(with basic auth), as a producer service would; Strata's Spark tasks fetch the
writer schemas from the same registry.
"""

from __future__ import annotations

import json
import random
import struct
import uuid
from collections import Counter

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from strata.batch.plan import PlanStore
from strata.errors import SchemaRegistryUnavailable, from_task_failure
from strata.local.service import free_port
from strata.operations.report import summary_dict
from strata.run import run_batch
from strata.schema import registry as schema_registry_module
from tests.conftest import REGISTRY_PASSWORD, REGISTRY_USER, START_MS, expected_offsets
from tests.registry_stub import served
from tests.unit.test_registry import (
    READER,
    V1,
    V2,
    chain,
    click,
    client,
    message,
    referring,
    register,
    writer_schema,
)


def registry_overrides(url: str) -> dict:
    section = {
        "url": url,
        "username": REGISTRY_USER,
        "password": REGISTRY_PASSWORD,
        "allow_http_on_loopback": True,
    }
    return {"format": "confluent_avro", "schema_registry": section}


def test_two_schema_versions_interleaved_land_typed_and_an_incompatible_one_is_quarantined(
    make_pipeline, broker, spark, schema_registry
):
    p = make_pipeline(partitions=2, overrides=registry_overrides(schema_registry.url))
    ctx = SerializationContext(p.topic, MessageField.VALUE)
    registry = client(schema_registry.url)
    v1 = AvroSerializer(registry, json.dumps(V1), conf={"auto.register.schemas": True})
    v2 = AvroSerializer(registry, json.dumps(V2), conf={"auto.register.schemas": True})
    # A separate subject: the registry would refuse it under the topic's in real life.
    bad = AvroSerializer(
        registry,
        json.dumps(writer_schema(user_id="string")),
        conf={"auto.register.schemas": True, "subject.name.strategy": lambda *_: "other-value"},
    )
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    sent: dict[tuple[int, int], int] = {}
    for i in range(40):
        record = click(i, ts=START_MS + i * 1000)
        if i == 17:
            value = bad({**record, "user_id": "u17"}, ctx)
        elif i % 2:
            value = v2({**record, "campaign": f"c{i}"}, ctx)
        else:
            value = v1({k: v for k, v in record.items() if k != "country"}, ctx)
        producer.produce(p.topic, value, partition=i % 2, timestamp=START_MS + i * 1000 + 5)
        sent[(i % 2, i // 2)] = i
    producer.flush(30)

    outcome = run_batch(p.cfg(), session=lambda _: spark)

    assert outcome.status == "committed"
    assert summary_dict(outcome)["rows"] == 39 and summary_dict(outcome)["quarantined"] == 1
    per = {0: 20, 1: 20}
    assert p.landed() == expected_offsets(per)
    rows = p.table_rows("table").to_pylist()
    assert Counter((r["_partition"], r["_offset"]) for r in rows) == Counter(
        {k: 1 for k in expected_offsets(per) if k != (1, 8)}
    )
    by_event = {r["event_id"]: r for r in rows}
    for (partition, offset), i in sent.items():
        if i == 17:
            continue
        row = by_event[f"e{i}"]
        assert (row["_partition"], row["_offset"]) == (partition, offset)
        assert row["user_id"] == i and row["device"] == "tablet" and row["latency_ms"] == i
        assert row["country"] == ("DE" if i % 2 else None)  # v1 lacks it: the default
        assert int(row["_event_time"].timestamp() * 1000) == START_MS + i * 1000
    assert "campaign" not in p.table_rows("table").column_names
    quarantined = p.table_rows("quarantine").to_pylist()
    assert [(q["_partition"], q["_offset"]) for q in quarantined] == [(1, 8)]
    bad_id = int.from_bytes(quarantined[0]["_value"][1:5], "big")
    assert quarantined[0]["reason"].startswith(
        f"written with schema id {bad_id}, which cannot be read as clicks.avsc: "
    )
    assert READER["name"] == "Click"


def test_a_registry_that_cannot_be_reached_fails_the_batch_and_quarantines_nothing(
    make_pipeline, broker, spark, schema_registry
):
    gone = f"http://127.0.0.1:{free_port()}"
    p = make_pipeline(partitions=1, overrides=registry_overrides(gone))
    ctx = SerializationContext(p.topic, MessageField.VALUE)
    v2 = AvroSerializer(
        client(schema_registry.url), json.dumps(V2), conf={"auto.register.schemas": True}
    )
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(5):
        producer.produce(p.topic, v2({**click(i, ts=START_MS), "campaign": None}, ctx), partition=0)
    producer.flush(30)

    with pytest.raises(Exception) as err:  # noqa: PT011 - Spark's, carrying the task's error
        run_batch(p.cfg(), session=lambda _: spark)

    # What the command line ends with: the task's error, found in Spark's text.
    ours = from_task_failure(str(err.value))
    assert isinstance(ours, SchemaRegistryUnavailable)
    assert str(ours).startswith(f"the Schema Registry at {gone} could not be reached")
    assert REGISTRY_PASSWORD not in str(err.value)
    assert not (p.warehouse / p.name).exists() or p.table_rows("quarantine").num_rows == 0


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_table_that_follows_its_subject_takes_on_the_optional_fields_producers_add(
    make_pipeline, broker, spark, schema_registry, request, table_format
):
    from strata.store.ledger import committed_reader_schema

    overrides = registry_overrides(schema_registry.url)
    overrides["schema_registry"]["evolve"] = True
    if table_format == "iceberg":
        # The new column takes an Iceberg column id of its own (the name mapping with it).
        metastore = request.getfixturevalue("metastore")
        overrides |= {"table_format": "iceberg", "metastore": {"uri": metastore.uri}}
    p = make_pipeline(partitions=1, overrides=overrides)
    ctx = SerializationContext(p.topic, MessageField.VALUE)
    registry = client(schema_registry.url)
    base = AvroSerializer(registry, json.dumps(READER), conf={"auto.register.schemas": True})
    # The next version adds an optional field (taken on) and a required one (left out).
    v3 = AvroSerializer(
        registry,
        json.dumps(
            writer_schema(
                add=[
                    {"name": "campaign", "type": ["null", "string"], "default": None},
                    {"name": "score", "type": "int"},
                ]
            )
        ),
        conf={"auto.register.schemas": True},
    )
    producer = Producer({"bootstrap.servers": broker.bootstrap})

    def send(values: list[bytes]) -> None:
        for value in values:
            producer.produce(p.topic, value, partition=0, timestamp=START_MS + 5)
        producer.flush(30)

    send([base(click(i, ts=START_MS + i), ctx) for i in range(6)])
    assert run_batch(p.cfg(), session=lambda _: spark).status == "committed"
    assert "campaign" not in p.table_rows("table").column_names
    assert committed_reader_schema(p.cfg().places()) is not None

    second = [
        v3({**click(i, ts=START_MS + i), "campaign": f"c{i}", "score": i}, ctx)
        if i % 2
        else base(click(i, ts=START_MS + i), ctx)
        for i in range(10, 20)
    ]
    send(second)
    assert run_batch(p.cfg(), session=lambda _: spark).status == "committed"
    rows = {r["event_id"]: r for r in p.table_rows("table").to_pylist()}
    assert p.table_rows("table").num_rows == 6 + 10
    assert "score" not in p.table_rows("table").column_names
    assert [rows[f"e{i}"]["campaign"] for i in range(10, 20)] == [
        f"c{i}" if i % 2 else None for i in range(10, 20)
    ]
    assert all(rows[f"e{i}"]["campaign"] is None for i in range(6))  # older files: null
    batch, recorded = committed_reader_schema(p.cfg().places())
    assert batch == 2 and [f["name"] for f in recorded["fields"]][-1] == "campaign"

    # The table keeps the column when later messages no longer carry it.
    send([base(click(i, ts=START_MS + i), ctx) for i in range(30, 33)])
    outcome = run_batch(p.cfg(), session=lambda _: spark)
    assert outcome.status == "committed" and summary_dict(outcome)["quarantined"] == 0
    table = p.table_rows("table")
    assert "campaign" in table.column_names and table.num_rows == 6 + 10 + 3
    assert p.landed() == expected_offsets({0: 6 + 10 + 3})


def test_answers_about_a_schema_quarantine_its_messages_and_the_pipeline_goes_on(
    make_pipeline, broker, schema_registry
):
    url = schema_registry.url
    p = make_pipeline(partitions=2, overrides=registry_overrides(url))
    prefix = f"x-{uuid.uuid4().hex[:8]}"
    # A schema whose reference names a subject the registry does not know (40401), and
    # one whose references nest 1,200 deep: the same fate every run, not an outage.
    gone = f"{prefix}-gone"
    dangling = register(url, f"{prefix}-a", referring("Gone"), refs=[("strata.refs.Gone", gone, 1)])
    last, type_name = chain(url, f"{prefix}-chain", 1_200)
    deep = register(
        url, f"{prefix}-b", referring(type_name), refs=[(f"strata.refs.{type_name}", last, 1)]
    )
    ctx = SerializationContext(p.topic, MessageField.VALUE)
    good = AvroSerializer(client(url), json.dumps(V2), conf={"auto.register.schemas": True})
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    where: dict[tuple[int, int], int | None] = {}  # (partition, offset) -> bad schema id
    for i in range(30):
        if i % 10 == 3:
            value, bad = message(url, dangling), dangling
        elif i % 10 == 7:
            value, bad = message(url, deep), deep
        else:
            value, bad = good({**click(i, ts=START_MS + i * 1000), "campaign": None}, ctx), None
        producer.produce(p.topic, value, partition=i % 2, timestamp=START_MS + i * 1000)
        where[(i % 2, i // 2)] = bad
    producer.flush(30)

    done = p.cli("run", "--json")

    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["status"] == "committed"
    assert (summary["rows"], summary["quarantined"]) == (24, 6)
    per = {0: 15, 1: 15}
    assert p.landed() == expected_offsets(per)  # every offset exactly once
    assert sorted(p.table_rows("table").column("event_id").to_pylist()) == sorted(
        f"e{i}" for i in range(30) if i % 10 not in (3, 7)
    )
    reasons = {
        dangling: f"written with schema id {dangling}, which references version 1 of subject "
        f"'{gone}'; the Schema Registry at {url} answers 40401 (subject not found)",
        deep: f"written with schema id {deep}, whose references nest deeper than 32 levels "
        f"(version 1 of subject '{prefix}-chain-1167' is at level 33); Strata follows at "
        "most 32",
    }
    quarantined = p.table_rows("quarantine").to_pylist()
    assert {(q["_partition"], q["_offset"]): q["reason"] for q in quarantined} == {
        at: reasons[bad] for at, bad in where.items() if bad is not None
    }
    for q in quarantined:
        assert int.from_bytes(q["_value"][1:5], "big") == where[(q["_partition"], q["_offset"])]

    again = p.cli("run", "--json")
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["status"] == "idle"
    assert p.landed() == expected_offsets(per)


def test_a_topic_flooded_with_unknown_schema_ids_asks_the_registry_a_bounded_number_of_times(
    make_pipeline, broker, spark, schema_registry
):
    # Bytes that begin with the wire format's magic byte but are not Confluent Avro: a
    # random schema id each, twice over, among messages of a registered schema.
    url = schema_registry.url
    p = make_pipeline(partitions=2, overrides=registry_overrides(url))
    ctx = SerializationContext(p.topic, MessageField.VALUE)
    good = AvroSerializer(client(url), json.dumps(V2), conf={"auto.register.schemas": True})
    flood = random.Random(11).sample(range(10**8, 2**31), 3_000)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    sent: dict[tuple[int, int], int | None] = {}  # (partition, offset) -> flood id
    offsets = {0: 0, 1: 0}

    def send(value: bytes, partition: int, flooded: int | None) -> None:
        producer.produce(p.topic, value, partition=partition, timestamp=START_MS + 5)
        sent[(partition, offsets[partition])] = flooded
        offsets[partition] += 1

    body = good({**click(0, ts=START_MS), "campaign": None}, ctx)[5:]
    for round_ in range(2):
        for i, unknown in enumerate(flood):
            if i % 20 == 0:
                record = {**click(i, ts=START_MS + i), "campaign": None}
                send(good(record, ctx), i % 2, None)
            send(b"\x00" + struct.pack(">I", unknown) + body, i % 2, unknown)
    producer.flush(30)
    per = dict(offsets)
    asked_before = served(schema_registry.log_path)

    outcome = run_batch(p.cfg(), session=lambda _: spark)

    assert outcome.status == "committed"
    assert p.landed() == expected_offsets(per)
    assert summary_dict(outcome)["quarantined"] == 2 * len(flood)
    assert p.table_rows("table").num_rows == sum(1 for f in sent.values() if f is None)
    asked = served(schema_registry.log_path) - asked_before
    asked_ids = {int(path.rsplit("/", 1)[1]) for path in asked} & set(flood)
    plan = PlanStore(p.cfg().places()).load(1)
    assert plan is not None
    bound = len(plan.splits) * schema_registry_module.MAX_UNKNOWN_IDS
    assert 0 < sum(asked[f"/schemas/ids/{i}"] for i in asked_ids) <= bound
    # Each message is quarantined with its id and why: the registry's answer for the ids
    # asked about, the bound for the others.
    unknown = f"which the Schema Registry at {url} does not know"
    not_asked = (
        f"not asked of the Schema Registry at {url}: this task met "
        f"{schema_registry_module.MAX_UNKNOWN_IDS} schema ids the registry does not know, "
        f"and asks about at most {schema_registry_module.MAX_UNKNOWN_IDS}"
    )
    answered: set[int] = set()
    for q in p.table_rows("quarantine").to_pylist():
        written = sent[(q["_partition"], q["_offset"])]
        assert written is not None and int.from_bytes(q["_value"][1:5], "big") == written
        assert q["reason"] in (
            f"written with schema id {written}, {unknown}",
            f"written with schema id {written}, {not_asked}",
        ), q["reason"]
        if q["reason"].endswith(unknown):
            answered.add(written)
    assert answered == asked_ids
