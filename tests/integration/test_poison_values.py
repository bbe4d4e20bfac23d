"""Hostile values produced to the real broker and run through the real batch.

Before the decoder guarded against them, some of these messages crashed a task (an
invalid UTF-8 string failed the writer's statistics; an event time past 2^53 failed
a cast; an Avro decimal failed the row conversion), and since a batch's plan is
saved and resumed, the batch failed on every re-run. Each message must now end as
exactly one row or one quarantined row with its reason, and the run must commit.
"""

from __future__ import annotations

import io
import json
import struct
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import pyarrow.dataset as ds
from confluent_kafka import Producer
from deltalake import DeltaTable
from fastavro import parse_schema, schemaless_writer

from strata.run import run_batch
from strata.schema.avro import without_logical_types
from tests.conftest import START_MS, expected_offsets

DAY_MS = 86_400_000


def produce(broker, topic: str, messages: list[tuple[int, bytes, int]]) -> dict[int, int]:
    """Produce (partition, value, Kafka timestamp) messages.

    Returns:
        Messages per partition.
    """
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    per: dict[int, int] = {}
    for partition, value, ts in messages:
        producer.produce(topic, value, b"k", partition=partition, timestamp=ts)
        per[partition] = per.get(partition, 0) + 1
    assert producer.flush(30) == 0
    return per


def click(i: int, **over) -> dict:
    return {
        "event_id": f"e{i}",
        "user_id": i,
        "page": "/p",
        "device": "mobile",
        "ts": START_MS + i * 1000,
        **over,
    }


def with_fragment(i: int, field: str, fragment: bytes) -> bytes:
    """Click `i` as JSON, with one field's value text replaced by `fragment`, byte for byte."""
    return json.dumps(click(i, **{field: "@@"})).encode().replace(b'"@@"', fragment)


def quarantine_reasons(p) -> dict[tuple[int, int], str]:
    q = p.table_rows("quarantine", ["_partition", "_offset", "reason"]).to_pylist()
    return {(r["_partition"], r["_offset"]): r["reason"] for r in q}


def test_poison_json_values_each_land_once_and_the_batch_commits(make_pipeline, broker, spark):
    p = make_pipeline(
        partitions=2, overrides={"schema_file": "poison.avsc", "event_time": {"max_lateness": "7d"}}
    )
    schema = json.loads((p.conf_dir.parent / "schemas" / "clicks.avsc").read_text())
    schema["fields"].append({"name": "score", "type": ["null", "double"], "default": None})
    (p.conf_dir.parent / "schemas" / "poison.avsc").write_text(json.dumps(schema))

    late_by = 52 * DAY_MS + 3 * 3_600_000
    poison = {
        "utf8": (with_fragment(1, "page", b'"/caf\xe9"'), 0),
        "surrogate": (with_fragment(2, "page", b'"\\ud800"'), 0),
        "nan": (with_fragment(3, "score", b"NaN"), 0),
        "infinity": (with_fragment(4, "score", b"-Infinity"), 0),
        "huge": (with_fragment(5, "score", b"1e400"), 0),
        "int": (with_fragment(6, "latency_ms", b"2147483648"), 0),
        "long": (with_fragment(7, "user_id", b"9223372036854775808"), 0),
        "nul": (with_fragment(8, "page", b'"a\\u0000b"'), 0),
        "year": (with_fragment(9, "ts", b"1000000000000000000"), 0),
        "late": (json.dumps(click(10)).encode(), late_by),
        "twice": (json.dumps(click(11))[:-1].encode() + b', "page": "/again"}', 0),
        "enum": (with_fragment(12, "device", b'"toaster"'), 0),
        "deep": (
            json.dumps(click(13))[:-1].encode() + b', "x": ' + b"[" * 4000 + b"]" * 4000 + b"}",
            0,
        ),
        # Arrow's JSON reader crashes on a block that begins with a top-level null.
        "null": (b"null", 0),
        "bom null": (b"\xef\xbb\xbf null", 0),
    }
    messages: list[tuple[int, bytes, int]] = []
    where: dict[str, tuple[int, int]] = {}
    counts = {0: 0, 1: 0}
    for n, (name, (value, late)) in enumerate(poison.items()):
        for good in range(3):  # good messages around each poison one
            i = 100 + n * 3 + good
            messages.append((good % 2, json.dumps(click(i)).encode(), START_MS + i * 1000 + 500))
            counts[good % 2] += 1
        partition = n % 2
        i = n + 1
        messages.append((partition, value, START_MS + i * 1000 + 500 + late))
        where[name] = (partition, counts[partition])
        counts[partition] += 1
    per = produce(broker, p.topic, messages)

    outcome = run_batch(p.cfg(), session=lambda _: spark)

    assert outcome.status == "committed"
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)
    schema_json = "not valid JSON for the schema:"
    latin1 = poison["utf8"][0].index(b"\xe9")
    assert quarantine_reasons(p) == {
        where["utf8"]: f"not valid JSON: not UTF-8 text (byte {latin1})",
        where["surrogate"]: "not valid JSON: field `page` holds a \\u escape of a lone surrogate "
        "(U+D800 to U+DFFF), which is not a Unicode character",
        where["nan"]: "not valid JSON: field `score` is NaN, which is not a JSON number",
        where["infinity"]: "not valid JSON: field `score` is -Infinity, which is not a JSON number",
        where["huge"]: f"{schema_json} field `score`: 1e400 is beyond the range of double",
        where["int"]: f"{schema_json} field `latency_ms`: 2147483648 is out of range for int "
        "(32 bits)",
        where["long"]: f"{schema_json} field `user_id`: 9223372036854775808 is out of range for "
        "long (64 bits)",
        where["year"]: "event time `ts` 1000000000000000000 (ms) lies outside 0001-01-01 to "
        "9999-12-31T23:59:59Z",
        where["late"]: "event time 2025-11-22T10:00:10Z is 52.1d before its Kafka timestamp "
        "2026-01-13T13:00:10Z, beyond event_time.max_lateness 7d",
        where["twice"]: f"{schema_json} field `page` appears twice",
        where["enum"]: "field `device`: 'toaster' is not a symbol of the enum "
        "(desktop, mobile, tablet)",
        where["null"]: f"{schema_json} the message is null, not an object",
        where["bom null"]: f"{schema_json} the message is null, not an object",
    }
    data = DeltaTable(p.cfg().location("table"))
    rows = {
        (r["_partition"], r["_offset"]): r
        for r in data.to_pyarrow_table(columns=["_partition", "_offset", "page"]).to_pylist()
    }
    # An escaped NUL is a character like any other: it lands, and the file's
    # statistics (which delta-rs filters by) still find it.
    assert rows[where["nul"]]["page"] == "a\x00b"
    assert data.to_pyarrow_dataset().count_rows(filter=ds.field("page") == "a\x00b") == 1
    assert where["deep"] in rows


ORDER_SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {
            "name": "amount",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
        },
        {
            "name": "fee",
            "type": {
                "type": "fixed",
                "name": "Fee",
                "size": 8,
                "logicalType": "decimal",
                "precision": 18,
                "scale": 4,
            },
        },
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at_ms", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "seen", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "qty", "type": "int"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {
            "name": "lines",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "Line",
                    "fields": [
                        {
                            "name": "price",
                            "type": {
                                "type": "bytes",
                                "logicalType": "decimal",
                                "precision": 6,
                                "scale": 2,
                            },
                        },
                        {"name": "when", "type": {"type": "long", "logicalType": "date"}},
                    ],
                },
            },
        },
    ],
}


def test_avro_logical_types_land_as_their_values_and_hostile_ones_are_quarantined(
    make_pipeline, broker, spark
):
    p = make_pipeline(partitions=2, overrides={"format": "avro", "schema_file": "order.avsc"})
    (p.conf_dir.parent / "schemas" / "order.avsc").write_text(json.dumps(ORDER_SCHEMA))
    logical = parse_schema(ORDER_SCHEMA)
    plain = without_logical_types(ORDER_SCHEMA)
    # The same encoding with `note` as bytes: how invalid UTF-8 inside a string arrives.
    raw_strings = parse_schema(
        {
            **plain,
            "fields": [
                *plain["fields"][:9],
                {"name": "note", "type": ["null", "bytes"]},
                plain["fields"][10],
            ],
        }
    )
    plain = parse_schema(plain)

    def encode(schema, record) -> bytes:
        buf = io.BytesIO()
        schemaless_writer(buf, schema, record)
        return buf.getvalue()

    def order(i: int) -> dict:
        at = datetime.fromtimestamp((START_MS + i * 1000) / 1000, tz=UTC)
        return {
            "id": uuid.UUID(int=i),
            "amount": Decimal("12.34") + i,
            "fee": Decimal("0.0005"),
            "day": date(2025, 11, 22),
            "at_ms": (datetime.min + timedelta(milliseconds=36_000_123)).time(),
            "at_us": (datetime.min + timedelta(microseconds=36_000_123_456)).time(),
            "ts": at,
            "seen": at + timedelta(microseconds=7),
            "qty": i,
            "note": "ok",
            "lines": [{"price": Decimal("1.50"), "when": 20414}],
        }

    raw_order = {
        "id": str(uuid.UUID(int=1)),
        "amount": (1234).to_bytes(2, "big", signed=True),
        "fee": (5).to_bytes(8, "big", signed=True),
        "day": 20414,
        "at_ms": 0,
        "at_us": 0,
        "ts": START_MS,
        "seen": START_MS * 1000,
        "qty": 1,
        "note": None,
        "lines": [],
    }
    poison = {
        "int": encode(plain, {**raw_order, "qty": 2**31}),
        "decimal": encode(plain, {**raw_order, "amount": (10**10).to_bytes(5, "big", signed=True)}),
        "year": encode(plain, {**raw_order, "seen": 253_402_300_800_000_000}),
        "time": encode(plain, {**raw_order, "at_ms": 86_400_000}),
        "utf8": encode(raw_strings, {**raw_order, "note": b"caf\xe9"}),
        "nested": encode(plain, {**raw_order, "lines": [{"price": b"\x7f\xff\xff", "when": 1}]}),
        "garbage": b"\x02garbage",
    }
    messages: list[tuple[int, bytes, int]] = []
    where: dict[str, tuple[int, int]] = {}
    counts = {0: 0, 1: 0}
    good_at: dict[tuple[int, int], int] = {}
    for n, (name, value) in enumerate(poison.items()):
        for good in range(2):
            i = 10 + n * 2 + good
            good_at[(good % 2, counts[good % 2])] = i
            messages.append((good % 2, encode(logical, order(i)), START_MS + i * 1000 + 500))
            counts[good % 2] += 1
        where[name] = (n % 2, counts[n % 2])
        counts[n % 2] += 1
        messages.append((n % 2, value, START_MS + 1500))
    per = produce(broker, p.topic, messages)

    outcome = run_batch(p.cfg(), session=lambda _: spark)

    assert outcome.status == "committed"
    assert p.landed() == expected_offsets(per)
    instants = "(0001-01-01 to 9999-12-31T23:59:59Z)"
    reasons = quarantine_reasons(p)
    assert reasons.pop(where["garbage"]).startswith("not valid Avro for the schema: EOFError")
    assert reasons == {
        where["int"]: f"field `qty`: {2**31} is out of range for int (32 bits)",
        where["decimal"]: "field `amount`: 100000000.00 has more digits than decimal(10, 2) holds",
        where["year"]: "field `seen`: 253402300800000000 is out of range for timestamp-micros "
        + instants,
        where["time"]: "field `at_ms`: 86400000 is out of range for time-millis "
        "(a time of day: 0 to 86399999)",
        where["utf8"]: "not valid Avro for the schema: a string is not UTF-8 text "
        "(byte 3 of the string)",
        where["nested"]: "field `lines[].price`: 83886.07 has more digits than decimal(6, 2) holds",
    }

    table = DeltaTable(p.cfg().location("table"))
    rows = {(r["_partition"], r["_offset"]): r for r in table.to_pyarrow_table().to_pylist()}
    assert set(rows) == set(good_at)
    for key, i in good_at.items():
        row = rows[key]
        at = datetime.fromtimestamp((START_MS + i * 1000) / 1000, tz=UTC)
        assert {k: row[k] for k in ORDER_SCHEMA_NAMES} == {
            "id": str(uuid.UUID(int=i)),
            "amount": Decimal("12.34") + i,
            "fee": Decimal("0.0005"),
            "day": date(2025, 11, 22),
            "at_ms": 36_000_123,
            "at_us": 36_000_123_456,
            "ts": at,
            "seen": at + timedelta(microseconds=7),
            "qty": i,
            "note": "ok",
            # `date` on a long is no logical type: the Avro spec reads it as the long.
            "lines": [{"price": Decimal("1.50"), "when": 20414}],
        }
        assert row["_event_time"] == at
    schema = pa.schema(table.schema())
    assert schema.field("amount").type == pa.decimal128(10, 2)
    assert schema.field("ts").type == pa.timestamp("us", tz="UTC")  # Delta keeps microseconds
    assert schema.field("day").type == pa.date32()
    # Plain Delta still: no table features that Trino's or delta-spark's readers could lack.
    protocol = table.protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)
    # The files' statistics are exact enough for delta-rs to prune by the new types.
    dataset = table.to_pyarrow_dataset()
    assert dataset.count_rows(filter=ds.field("day") == date(2025, 11, 22)) == len(rows)
    first = min(good_at.values())
    moment = datetime.fromtimestamp((START_MS + first * 1000) / 1000, tz=UTC)
    assert dataset.count_rows(filter=ds.field("ts") == moment) == 1


ORDER_SCHEMA_NAMES = [f["name"] for f in ORDER_SCHEMA["fields"]]


def test_a_confluent_message_of_another_schema_id_is_quarantined_not_misread(
    make_pipeline, broker, spark
):
    p = make_pipeline(partitions=1, overrides={"format": "confluent_avro", "schema_id": 7})
    schema = parse_schema(json.loads((p.conf_dir.parent / "schemas" / "clicks.avsc").read_text()))

    def framed(schema_id: int, i: int) -> bytes:
        buf = io.BytesIO()
        optional = {"session_id": None, "referrer": None, "country": None, "latency_ms": None}
        schemaless_writer(buf, schema, {**optional, **click(i)})
        return b"\x00" + struct.pack(">I", schema_id) + buf.getvalue()

    # A message of schema 8 that happens to decode with schema 7's reader: without the
    # id check it would land with its fields misread.
    messages = [(0, framed(7, 0), START_MS + 500), (0, framed(8, 1), START_MS + 1500)]
    messages += [(0, framed(7, 2), START_MS + 2500), (0, b"\x00\x00", START_MS + 3500)]
    per = produce(broker, p.topic, messages)

    outcome = run_batch(p.cfg(), session=lambda _: spark)

    assert outcome.status == "committed"
    assert p.landed() == expected_offsets(per)
    assert quarantine_reasons(p) == {
        (0, 1): "written with schema id 8, not the configured schema_id 7; decoding it with "
        "another schema would misread its fields (if the topic's schema changed, update "
        "schema_file and schema_id, then replay)",
        (0, 3): "not in Confluent wire format (expected magic byte 0 and a schema id)",
    }
    events = p.table_rows("table", ["event_id"]).column("event_id").to_pylist()
    assert sorted(events) == ["e0", "e2"]
