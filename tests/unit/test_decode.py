"""Decoding: every message lands once, as a row or as a quarantined row with its reason."""

from __future__ import annotations

import gc
import io
import json
import struct
import tempfile
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pytest
from fastavro import parse_schema, schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata.batch.decode import DecodeRules, decode_chunk, partition_stats
from strata.batch.write import PartitionedWriter
from strata.config import EventTimeConfig, PipelineConfig
from strata.schema.avro import (
    QUARANTINE_SCHEMA,
    RAW_SCHEMA,
    partition_columns,
    without_logical_types,
)
from tests.conftest import ROOT

T0 = 1_763_805_600_000  # 2025-11-22T10:00:00Z


def rules(fmt: str = "json", **event_time) -> DecodeRules:
    cfg = PipelineConfig(
        name="clicks",
        topics=["clicks"],
        format=fmt,
        schema_file="clicks.avsc",
        schema_id=42 if fmt == "confluent_avro" else None,
        schemas_dir=str(ROOT / "schemas"),
        event_time=EventTimeConfig(field="ts", **event_time),
    )
    return DecodeRules.of_decoding(cfg.decoding())


def click(i: int, **over) -> dict:
    return {
        "event_id": f"e{i}",
        "user_id": i,
        "page": "/p",
        "device": "mobile",
        "ts": T0 + i * 1000,
        **over,
    }


def raw(values: list[bytes | None], kafka_ts: list[int] | None = None) -> pa.Table:
    n = len(values)
    ts = kafka_ts or [T0 + i * 1000 + 500 for i in range(n)]
    return pa.table(
        [
            pa.array(["clicks"] * n),
            pa.array([i % 2 for i in range(n)], pa.int32()),
            pa.array(range(n), pa.int64()),
            pa.array(ts, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
            pa.array([b"k"] * n, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array([None] * n, RAW_SCHEMA.field("_headers").type),
            pa.array([1] * n, pa.int64()),
            pa.nulls(n, pa.string()),
        ],
        schema=RAW_SCHEMA,
    )


def enc(d: dict) -> bytes:
    return json.dumps(d).encode()


def test_clean_json_decodes_to_typed_columns_with_coordinates():
    out = decode_chunk(raw([enc(click(i)) for i in range(5)]), rules())
    assert out.quarantine.num_rows == 0
    rows = out.rows.to_pylist()
    assert [r["user_id"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[2]["_offset"] == 2 and rows[2]["_partition"] == 0 and rows[3]["_partition"] == 1
    assert rows[0]["dt"] == "2025-11-22" and rows[0]["hr"] == "10"
    assert rows[0]["session_id"] is None and rows[0]["device"] == "mobile"
    assert out.rows.schema.field("_event_time").type == pa.timestamp("us", tz="UTC")


def test_each_bad_message_is_quarantined_with_its_own_reason():
    values = [
        enc(click(0)),
        b'{"event_id": "e1", "user_id": "x", "page": "/", "device": "desktop", "ts": 1}',
        enc(click(2))[:20],
        None,
        b"  ",
        enc({k: v for k, v in click(5).items() if k != "page"}),
        b"[1, 2]",
        enc(click(7)),
        b"\x00\x01binary",
        b"\xff\xfe{}",
    ]
    out = decode_chunk(raw(values), rules())
    assert out.rows.column("_offset").to_pylist() == [0, 7]
    reasons = dict(
        zip(
            out.quarantine.column("_offset").to_pylist(),
            out.quarantine.column("reason").to_pylist(),
            strict=True,
        )
    )
    assert "changed from number to string" in reasons[1] or "user_id" in reasons[1]
    assert reasons[2].startswith("not valid JSON for the schema")
    assert reasons[3] == "empty value (tombstone)"
    assert reasons[4] == "empty value"
    assert reasons[5] == "missing required field `page`"
    assert reasons[6].startswith("not valid JSON")
    assert reasons[8] == "not valid JSON: a NUL byte at position 0"
    assert reasons[9] == "not valid JSON: not UTF-8 text (byte 0)"
    assert out.quarantine.column("_value").to_pylist()[0] == values[1]


def test_raw_newlines_inside_json_are_whitespace():
    pretty = json.dumps(click(0), indent=2).encode()
    out = decode_chunk(raw([pretty, enc(click(1))]), rules())
    assert out.rows.num_rows == 2 and out.quarantine.num_rows == 0


def test_event_time_checks_epoch_zero_missing_and_future():
    values = [
        enc(click(0, ts=0)),
        enc(click(1, ts=None)),
        enc(click(2, ts=T0 + 40 * 86_400_000)),
        enc(click(3)),
    ]
    out = decode_chunk(raw(values), rules(max_future_skew="1h"))
    reasons = dict(
        zip(
            out.quarantine.column("_offset").to_pylist(),
            out.quarantine.column("reason").to_pylist(),
            strict=True,
        )
    )
    assert out.rows.column("_offset").to_pylist() == [3]
    assert "1970-01-01T00:00:00Z is before 2000-01-01" in reasons[0]
    assert reasons[1] == "missing required field `ts`"
    assert "ahead of its Kafka timestamp" in reasons[2] and "allowed skew 1.0h" in reasons[2]


def test_late_events_keep_their_own_hour_and_are_counted():
    late_kafka = T0 + 5 * 3_600_000
    out = decode_chunk(
        raw([enc(click(0)), enc(click(1))], kafka_ts=[T0 + 10, late_kafka]), rules(late_after="1h")
    )
    assert out.rows.column("hr").to_pylist() == ["10", "10"]
    stats = partition_stats(out.rows, 3_600_000)
    assert stats[("clicks", 1)]["late_rows"] == 1 and stats[("clicks", 0)]["late_rows"] == 0
    assert stats[("clicks", 1)]["max_lateness_ms"] == late_kafka - (T0 + 1000)


def test_iso8601_event_times_use_the_configured_zone_for_naive_strings(tmp_path):
    schema = json.loads((ROOT / "schemas" / "clicks.avsc").read_text())
    for f in schema["fields"]:
        if f["name"] == "ts":
            f["type"] = "string"
    (tmp_path / "iso.avsc").write_text(json.dumps(schema))
    cfg = PipelineConfig(
        name="iso",
        topics=["x"],
        schema_file="iso.avsc",
        schemas_dir=str(tmp_path),
        event_time=EventTimeConfig(field="ts", unit="iso8601", timezone="Europe/Berlin"),
    )
    r = DecodeRules.of_decoding(cfg.decoding())
    values = [
        enc(click(0, ts="2025-11-22T11:30:00")),
        enc(click(1, ts="2025-11-22T10:30:00Z")),
        enc(click(2, ts="yesterday")),
    ]
    out = decode_chunk(raw(values), r)
    assert out.rows.column("hr").to_pylist() == ["10", "10"]
    assert out.quarantine.column("reason").to_pylist() == ["missing or unreadable event time `ts`"]


def test_avro_and_confluent_wire_format():
    schema = parse_schema(json.loads((ROOT / "schemas" / "clicks.avsc").read_text()))

    def avro(d: dict) -> bytes:
        buf = io.BytesIO()
        full = {"session_id": None, "referrer": None, "country": None, "latency_ms": None, **d}
        schemaless_writer(buf, schema, full)
        return buf.getvalue()

    out = decode_chunk(raw([avro(click(0)), b"\x02garbage", avro(click(2))]), rules("avro"))
    assert out.rows.column("_offset").to_pylist() == [0, 2]
    assert (
        out.quarantine.column("reason").to_pylist()[0].startswith("not valid Avro for the schema")
    )

    wire = b"\x00" + struct.pack(">I", 42)
    out = decode_chunk(raw([wire + avro(click(0)), avro(click(1))]), rules("confluent_avro"))
    assert out.rows.column("_offset").to_pylist() == [0]
    # Plain Avro starts with the event_id length, not the wire format's magic byte 0.
    assert out.quarantine.column("reason").to_pylist() == [
        "not in Confluent wire format (expected magic byte 0 and a schema id)"
    ]


junk = st.one_of(
    st.builds(lambda i: enc(click(i)), st.integers(0, 10_000)),
    st.binary(max_size=40),
    st.builds(lambda i: enc(click(i, ts=0)), st.integers(0, 100)),
    st.builds(lambda i: enc(click(i, user_id="u")), st.integers(0, 100)),
    st.none(),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(junk, max_size=60))
def test_every_message_lands_exactly_once(values):
    out = decode_chunk(raw(values), rules())
    offsets = out.rows.column("_offset").to_pylist() + out.quarantine.column("_offset").to_pylist()
    assert sorted(offsets) == list(range(len(values)))
    assert all(out.quarantine.column("reason").to_pylist())


def test_schema_that_does_not_fit_the_event_time_unit_fails_at_load():
    from strata.errors import SchemaError

    with pytest.raises(SchemaError, match="unit is iso8601 but field 'ts' is int64"):
        rules(unit="iso8601")


SCHEMA_JSON = "not valid JSON for the schema:"
INSTANTS = "(0001-01-01 to 9999-12-31T23:59:59Z)"
YEARS = "0001-01-01 to 9999-12-31T23:59:59Z"
DATE = "date (days from 1970-01-01; 0001-01-01 to 9999-12-31)"


def reasons_by_offset(out) -> dict[int, str]:
    return dict(
        zip(
            out.quarantine.column("_offset").to_pylist(),
            out.quarantine.column("reason").to_pylist(),
            strict=True,
        )
    )


def rules_for(path: Path, fmt: str = "json", table_format: str = "parquet", **event_time):
    cfg = PipelineConfig(
        name="t",
        topics=["t"],
        format=fmt,
        schema_file=path.name,
        schema_id=7 if fmt == "confluent_avro" else None,
        schemas_dir=str(path.parent),
        table_format=table_format,
        event_time=EventTimeConfig(field="ts", **event_time),
    )
    return DecodeRules.of_decoding(cfg.decoding())


def test_invalid_utf8_inside_a_string_value_is_quarantined_not_written():
    # Arrow's JSON reader copies a string's bytes as they are: before, these rows
    # decoded, and the writer's statistics failed on them, on every re-run.
    good = enc(click(0))
    values = [
        good,
        good.replace(b'"/p"', b'"/caf\xe9"'),  # Latin-1, not UTF-8
        good.replace(b'"e', b'"\xed\xa0\x80'),  # an encoded surrogate
        good.replace(b'"mobile"', b'"mob\xc3"'),  # truncated sequence
        good[:-1] + b', "extra": "\xff"}',  # in a field the schema does not have
        enc(click(5)),
    ]
    out = decode_chunk(raw(values), rules())
    assert out.rows.column("_offset").to_pylist() == [0, 5]
    out.rows.validate(full=True)
    reasons = reasons_by_offset(out)
    for offset in (1, 2, 3, 4):
        position = next(i for i in range(len(values[offset])) if values[offset][i] >= 0x80)
        assert reasons[offset] == f"not valid JSON: not UTF-8 text (byte {position})"


def test_lone_surrogate_escapes_are_quarantined_and_pairs_decode():
    good = enc(click(0))
    values = [
        good.replace(b'"/p"', b'"\\ud83d\\ude00"'),  # a valid pair: U+1F600
        good.replace(b'"/p"', b'"\\ud800"'),
        good.replace(b'"/p"', b'"x\\udc00y"'),
        good.replace(b'"/p"', b'"\\ud800\\u0041"'),
        good[:-1] + b', "ignored": ["\\udfff"]}',
    ]
    out = decode_chunk(raw(values), rules())
    assert out.rows.column("page").to_pylist() == ["\U0001f600"]
    reasons = reasons_by_offset(out)
    lone = (
        "holds a \\u escape of a lone surrogate (U+D800 to U+DFFF), which is not a Unicode "
        "character"
    )
    assert reasons[1] == f"not valid JSON: field `page` {lone}"
    assert reasons[2] == reasons[3] == f"not valid JSON: field `page` {lone}"
    assert reasons[4] == f"not valid JSON: field `ignored[]` {lone}"


def with_fragment(field: str, fragment: bytes) -> bytes:
    """A valid click whose field's JSON text is replaced by `fragment`, byte for byte."""
    marker = "@@MARK@@"
    return enc(click(0, **{field: marker})).replace(f'"{marker}"'.encode(), fragment)


# Each hostile value's one documented outcome: a reason, or the value it lands as.
JSON_OUTCOMES = [
    ("latency_ms", b"NaN", "not valid JSON: field `latency_ms` is NaN, which is not a JSON number"),
    (
        "latency_ms",
        b"Infinity",
        "not valid JSON: field `latency_ms` is Infinity, which is not a JSON number",
    ),
    (
        "user_id",
        b"-Infinity",
        "not valid JSON: field `user_id` is -Infinity, which is not a JSON number",
    ),
    (
        "latency_ms",
        b"2147483648",
        f"{SCHEMA_JSON} field `latency_ms`: 2147483648 is out of range for int (32 bits)",
    ),
    (
        "user_id",
        b"9223372036854775808",
        f"{SCHEMA_JSON} field `user_id`: 9223372036854775808 is out of range for long (64 bits)",
    ),
    (
        "user_id",
        b"1e400",
        "not valid JSON for the schema: field `user_id`: 1e400 is beyond the range of double",
    ),
    (
        "user_id",
        b"1.5",
        "not valid JSON for the schema: field `user_id`: 1.5 is not written as an integer",
    ),
    ("page", b'"a\\u0000b"', {"page": "a\x00b"}),
    (
        "page",
        b'"a\x01b"',
        "not valid JSON: field `page` holds a raw control character (U+0000 to U+001F), "
        "which JSON requires to be escaped",
    ),
    ("page", b"17", "not valid JSON for the schema: field `page` should be a string, not a number"),
    (
        "device",
        b'"toaster"',
        "field `device`: 'toaster' is not a symbol of the enum (desktop, mobile, tablet)",
    ),
    (
        "ts",
        b"-1",
        "event time 1969-12-31T23:59:59Z is before 2000-01-01T00:00:00Z "
        "(epoch zero or an unset clock)",
    ),
    (
        "ts",
        b"1000000000000000000",
        "event time `ts` 1000000000000000000 (ms) lies outside 0001-01-01 to 9999-12-31T23:59:59Z",
    ),
    ("ts", b"NaN", "not valid JSON: field `ts` is NaN, which is not a JSON number"),
    (
        "session_id",
        b'{"deep": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        "not valid JSON for the schema: field `session_id` should be a string, not an object",
    ),
]


@pytest.mark.parametrize(("field", "fragment", "outcome"), JSON_OUTCOMES)
def test_each_hostile_json_value_has_one_outcome(field, fragment, outcome):
    message = with_fragment(field, fragment)
    out = decode_chunk(
        raw([enc(click(1)), message, enc(click(2))], kafka_ts=[T0 + 1500] * 3), rules()
    )
    landed = {r["_offset"]: r for r in out.rows.to_pylist()}
    assert set(landed) | set(reasons_by_offset(out)) == {0, 1, 2} and {0, 2} <= set(landed)
    if isinstance(outcome, str):
        assert reasons_by_offset(out) == {1: outcome}
    else:
        assert {k: landed[1][k] for k in outcome} == outcome


def test_extra_duplicate_and_deeply_nested_keys():
    good = enc(click(0))
    values = [
        good[:-1] + b', "extra": {"a": ' + b"[" * 5000 + b"]" * 5000 + b"}}",
        good[:-1] + b', "extra": 1, "extra": 2}',  # a key the schema does not have, twice
        good[:-1] + b', "page": "/again"}',
    ]
    out = decode_chunk(raw(values), rules())
    assert out.rows.column("_offset").to_pylist() == [0, 1]
    assert reasons_by_offset(out) == {
        2: "not valid JSON for the schema: field `page` appears twice"
    }


LOGICAL_SCHEMA = {
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
            "type": [
                "null",
                {
                    "type": "fixed",
                    "name": "Fee",
                    "size": 8,
                    "logicalType": "decimal",
                    "precision": 18,
                    "scale": 4,
                },
            ],
            "default": None,
        },
        {
            "name": "total",
            "type": [
                "null",
                {"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 2},
            ],
            "default": None,
        },
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at_ms", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {
            "name": "seen",
            "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}],
            "default": None,
        },
        {
            "name": "local",
            "type": ["null", {"type": "long", "logicalType": "local-timestamp-millis"}],
            "default": None,
        },
        {
            "name": "local_us",
            "type": ["null", {"type": "long", "logicalType": "local-timestamp-micros"}],
            "default": None,
        },
        {
            "name": "nanos",
            "type": ["null", {"type": "long", "logicalType": "timestamp-nanos"}],
            "default": None,
        },
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
                        {
                            "name": "when",
                            "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}],
                        },
                    ],
                },
            },
        },
    ],
}
AT = datetime(2025, 11, 22, 10, 0, tzinfo=UTC)
AT_MS = int(AT.timestamp() * 1000)
EXPECTED_ROW = {
    "id": "0b8f3bde-3d3b-4c1f-9d2e-6a1f0e6c2a10",
    "amount": Decimal("12.34"),
    "fee": Decimal("0.0005"),
    "total": Decimal("123456789012345678901234567890123456.78"),
    "day": date(2025, 11, 22),
    "at_ms": 36_000_123,
    "at_us": 36_000_123_456,
    "ts": AT,
    "seen": AT + timedelta(microseconds=7),
    "local": datetime(2025, 11, 22, 11, 30),
    "local_us": datetime(2025, 11, 22, 11, 30, 0, 5),
    "nanos": 1_763_805_600_000_000_001,
    "lines": [{"price": Decimal("1.50"), "when": AT}, {"price": Decimal("-0.01"), "when": None}],
}


@pytest.fixture(scope="module")
def logical_schema(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("schemas") / "order.avsc"
    path.write_text(json.dumps(LOGICAL_SCHEMA))
    return path


def write_and_read_back(decoded, rules_, root: Path) -> pa.Table:
    """Rows through the real writer into a local directory, as a task writes them."""
    writer = PartitionedWriter(
        pafs.LocalFileSystem(),
        str(root),
        rules_.out_schema,
        partition_columns(rules_.partitioning),
        1,
        "t00000",
        1 << 20,
        1000,
    )
    writer.write(decoded.rows)
    files = writer.close()
    for f in files:
        json.loads(f.stats, parse_constant=lambda token: pytest.fail(f"{token} in {f.stats}"))
    if not files:
        return rules_.out_schema.empty_table()
    return ds.dataset(str(root), format="parquet", partitioning="hive").to_table()


def test_avro_logical_types_decode_and_write_to_their_values(logical_schema, tmp_path):
    r = rules_for(logical_schema, "avro")
    record = {
        **EXPECTED_ROW,
        "id": uuid.UUID(EXPECTED_ROW["id"]),
        "lines": [
            {"price": Decimal("1.50"), "when": AT},
            {"price": Decimal("-0.01"), "when": None},
        ],
    }
    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(LOGICAL_SCHEMA), record)
    out = decode_chunk(raw([buf.getvalue()], kafka_ts=[AT_MS + 100]), r)
    assert out.quarantine.num_rows == 0
    row = out.rows.to_pylist()[0]
    assert {k: row[k] for k in EXPECTED_ROW} == EXPECTED_ROW
    assert row["_event_time"] == AT and (row["dt"], row["hr"]) == ("2025-11-22", "10")
    back = write_and_read_back(out, r, tmp_path).to_pylist()[0]
    assert {k: back[k] for k in EXPECTED_ROW} == EXPECTED_ROW


def test_json_logical_types_are_read_as_their_avro_numbers(logical_schema, tmp_path):
    # JSON carries a logical type as Avro's JSON encoding does: its underlying number
    # (a decimal as a number or a numeric string).
    r = rules_for(logical_schema, "json")
    body = {
        "id": EXPECTED_ROW["id"],
        "amount": 12.34,
        "fee": "0.0005",
        "total": "123456789012345678901234567890123456.78",
        "day": 20414,
        "at_ms": 36_000_123,
        "at_us": 36_000_123_456,
        "ts": AT_MS,
        "seen": AT_MS * 1000 + 7,
        "local": int(datetime(2025, 11, 22, 11, 30, tzinfo=UTC).timestamp() * 1000),
        "local_us": int(datetime(2025, 11, 22, 11, 30, tzinfo=UTC).timestamp() * 1_000_000) + 5,
        "nanos": 1_763_805_600_000_000_001,
        "lines": [{"price": 1.5, "when": AT_MS}, {"price": "-0.01"}],
    }
    hostile = [
        (
            {"ts": "2025-11-22T10:00:00Z"},
            "not valid JSON for the schema: field `ts` should be a number, not a string",
        ),
        (
            {"amount": 1.255},
            f"{SCHEMA_JSON} field `amount`: 1.255 has more decimal places than "
            "decimal128(10, 2) holds",
        ),
        (
            {"amount": 123456789.5},
            "field `amount`: 123456789.50 has more digits than decimal(10, 2) holds",
        ),
        (
            {"amount": "12,5"},
            "not valid JSON for the schema: field `amount`: '12,5' is not a decimal128 number",
        ),
        (
            {"day": 2_932_897},
            f"field `day`: 2932897 is out of range for {DATE}",
        ),
        (
            {"at_ms": -1},
            "field `at_ms`: -1 is out of range for time-millis (a time of day: 0 to 86399999)",
        ),
        (
            {"seen": 2**62},
            f"field `seen`: {2**62} is out of range for timestamp-micros {INSTANTS}",
        ),
        (
            {"ts": 253402300800000},
            f"field `ts`: 253402300800000 is out of range for timestamp-millis {INSTANTS}",
        ),
        ({"id": "not-a-uuid"}, "field `id`: 'not-a-uuid' is not a UUID"),
        (
            {"lines": [{"price": 10000}]},
            "field `lines[].price`: 10000.00 has more digits than decimal(6, 2) holds",
        ),
    ]
    values = [json.dumps(body).encode()] + [json.dumps({**body, **h}).encode() for h, _ in hostile]
    out = decode_chunk(raw(values, kafka_ts=[AT_MS + 100] * len(values)), r)
    assert reasons_by_offset(out) == {i + 1: why for i, (_, why) in enumerate(hostile)}
    row = out.rows.to_pylist()[0]
    assert {k: row[k] for k in EXPECTED_ROW} == EXPECTED_ROW
    back = write_and_read_back(out, r, tmp_path).to_pylist()[0]
    assert {k: back[k] for k in EXPECTED_ROW} == EXPECTED_ROW


def test_hostile_avro_values_are_quarantined_by_field(logical_schema):
    r = rules_for(logical_schema, "avro")
    # Written without logical types: the raw numbers and bytes a producer can send.
    plain = parse_schema(without_logical_types(LOGICAL_SCHEMA))
    base = {
        "id": EXPECTED_ROW["id"],
        "amount": (1234).to_bytes(2, "big", signed=True),
        "fee": None,
        "total": None,
        "day": 20414,
        "at_ms": 0,
        "at_us": 0,
        "ts": AT_MS,
        "seen": None,
        "local": None,
        "local_us": None,
        "nanos": None,
        "lines": [],
    }
    hostile = [
        (
            {"amount": (10**10).to_bytes(5, "big", signed=True)},
            "field `amount`: 100000000.00 has more digits than decimal(10, 2) holds",
        ),
        (
            {"amount": b"\x7f" * 40},
            "field `amount`: a 40-byte value has more digits than decimal(10, 2) holds",
        ),
        (
            {"day": 2**40},
            f"field `day`: {2**40} is out of range for {DATE}",
        ),
        (
            {"at_ms": 86_400_000},
            "field `at_ms`: 86400000 is out of range for time-millis "
            "(a time of day: 0 to 86399999)",
        ),
        (
            {"ts": -(2**62)},
            f"field `ts`: {-(2**62)} is out of range for timestamp-millis {INSTANTS}",
        ),
        (
            {"lines": [{"price": b"", "when": 2**62}]},
            f"field `lines[].when`: {2**62} is out of range for timestamp-millis {INSTANTS}",
        ),
        (
            {"id": "{0B8F3BDE-3D3B-4C1F-9D2E-6A1F0E6C2A10}"},
            "field `id`: '{0B8F3BDE-3D3B-4C1F-9D2E-6A1F0E6C2A10}' is not a UUID",
        ),
    ]
    values = []
    for over, _ in [({}, None), *hostile]:
        buf = io.BytesIO()
        schemaless_writer(buf, plain, {**base, **over})
        values.append(buf.getvalue())
    out = decode_chunk(raw(values, kafka_ts=[AT_MS] * len(values)), r)
    assert out.rows.column("_offset").to_pylist() == [0]
    assert reasons_by_offset(out) == {i + 1: why for i, (_, why) in enumerate(hostile)}


def test_avro_int_beyond_32_bits_and_invalid_strings_are_quarantined():
    schema = parse_schema(json.loads((ROOT / "schemas" / "clicks.avsc").read_text()))
    wide = json.loads((ROOT / "schemas" / "clicks.avsc").read_text())
    for f in wide["fields"]:
        if f["name"] == "latency_ms":
            f["type"] = ["null", "long"]  # same encoding as int, any 64-bit value
        if f["name"] == "page":
            f["type"] = "bytes"  # same encoding as string, any bytes
    wide = parse_schema(wide)

    def avro(s, **over) -> bytes:
        buf = io.BytesIO()
        full = {"session_id": None, "referrer": None, "country": None, "latency_ms": None}
        schemaless_writer(buf, s, {**full, **click(0), **over})
        return buf.getvalue()

    values = [
        avro(schema, latency_ms=12),
        avro(wide, latency_ms=2**31, page=b"/p"),
        avro(wide, page=b"/caf\xe9"),
        avro(wide, page=b"\xed\xa0\x80"),
        avro(wide, latency_ms=-(2**31), page=b"/p"),  # the smallest int: lands
    ]
    out = decode_chunk(raw(values), rules("avro"))
    assert out.rows.column("_offset").to_pylist() == [0, 4]
    assert reasons_by_offset(out) == {
        1: "field `latency_ms`: 2147483648 is out of range for int (32 bits)",
        2: "not valid Avro for the schema: a string is not UTF-8 text (byte 4 of the string)",
        3: "not valid Avro for the schema: a string is not UTF-8 text (byte 0 of the string)",
    }


def test_avro_doubles_keep_nan_and_infinity(tmp_path):
    path = tmp_path / "m.avsc"
    path.write_text(
        json.dumps(
            {
                "type": "record",
                "name": "M",
                "fields": [
                    {"name": "ts", "type": "long"},
                    {"name": "v", "type": "double"},
                    {"name": "f", "type": "float"},
                ],
            }
        )
    )
    schema = parse_schema(json.loads(path.read_text()))
    values = []
    for v in (float("nan"), float("inf"), float("-inf"), 1e308):
        buf = io.BytesIO()
        schemaless_writer(buf, schema, {"ts": T0, "v": v, "f": v if v != 1e308 else 1.0})
        values.append(buf.getvalue())
    out = decode_chunk(raw(values, kafka_ts=[T0] * 4), rules_for(path, "avro"))
    got = out.rows.column("v").to_pylist()
    assert (
        out.quarantine.num_rows == 0
        and got[0] != got[0]
        and got[1:] == [float("inf"), float("-inf"), 1e308]
    )


def test_json_floats_must_be_finite_json_numbers(tmp_path):
    path = tmp_path / "m.avsc"
    path.write_text(
        json.dumps(
            {
                "type": "record",
                "name": "M",
                "fields": [
                    {"name": "ts", "type": "long"},
                    {"name": "v", "type": ["null", "double"], "default": None},
                    {"name": "f", "type": ["null", "float"], "default": None},
                    {
                        "name": "vs",
                        "type": ["null", {"type": "array", "items": "double"}],
                        "default": None,
                    },
                ],
            }
        )
    )
    fragments = [
        (b'"v": 1.5, "f": 3.4e38', None),
        (b'"v": NaN', "not valid JSON: field `v` is NaN, which is not a JSON number"),
        (b'"f": -Infinity', "not valid JSON: field `f` is -Infinity, which is not a JSON number"),
        (b'"f": 1e39', "field `f`: 1e+39 is beyond the range of float (32 bits)"),
        (
            b'"v": 1e400',
            "not valid JSON for the schema: field `v`: 1e400 is beyond the range of double",
        ),
        (
            b'"vs": [1, Infinity]',
            "not valid JSON: field `vs[]` is Infinity, which is not a JSON number",
        ),
    ]
    values = [b'{"ts": %d, ' % T0 + f + b"}" for f, _ in fragments]
    out = decode_chunk(raw(values, kafka_ts=[T0] * len(values)), rules_for(path))
    assert out.rows.to_pylist()[0]["f"] == pytest.approx(3.4e38)
    assert reasons_by_offset(out) == {i: why for i, (_, why) in enumerate(fragments) if why}


def test_a_confluent_message_written_with_another_schema_id_is_quarantined():
    schema = parse_schema(json.loads((ROOT / "schemas" / "clicks.avsc").read_text()))

    def framed(schema_id: int, i: int) -> bytes:
        buf = io.BytesIO()
        full = {"session_id": None, "referrer": None, "country": None, "latency_ms": None}
        schemaless_writer(buf, schema, {**full, **click(i)})
        return b"\x00" + struct.pack(">I", schema_id) + buf.getvalue()

    r = rules("confluent_avro")
    assert r.schema_id == 42
    out = decode_chunk(raw([framed(42, 0), framed(8, 1), framed(42, 2), b"\x00\x00\x00"]), r)
    assert out.rows.column("_offset").to_pylist() == [0, 2]
    assert reasons_by_offset(out) == {
        1: "written with schema id 8, not the configured schema_id 42; decoding it with another "
        "schema would misread its fields (if the topic's schema changed, update schema_file and "
        "schema_id, then replay)",
        3: "not in Confluent wire format (expected magic byte 0 and a schema id)",
    }


def test_events_later_than_max_lateness_are_quarantined_against_their_own_kafka_timestamp():
    day = 86_400_000
    values = [enc(click(i)) for i in range(4)]
    kafka = [T0 + 7 * day, T0 + 1000 + 7 * day + 1, T0 + 2000 + 52 * day + 3 * 3_600_000, None]
    out = decode_chunk(raw(values, kafka_ts=kafka), rules(max_lateness="7d"))
    assert out.rows.column("_offset").to_pylist() == [0, 3]
    assert reasons_by_offset(out) == {
        1: "event time 2025-11-22T10:00:01Z is 7.0d before its Kafka timestamp "
        "2025-11-29T10:00:01Z, beyond event_time.max_lateness 7d",
        2: "event time 2025-11-22T10:00:02Z is 52.1d before its Kafka timestamp "
        "2026-01-13T13:00:02Z, beyond event_time.max_lateness 7d",
    }
    # Unbounded: every late event lands in its own hour.
    out = decode_chunk(raw(values, kafka_ts=kafka), rules(max_lateness=None))
    assert out.rows.column("_offset").to_pylist() == [0, 1, 2, 3]
    assert set(out.rows.column("hr").to_pylist()) == {"10"}


def test_a_message_without_a_kafka_timestamp_skips_both_skew_checks():
    values = [enc(click(0, ts=T0 + 400 * 86_400_000)), enc(click(1, ts=T0 - 400 * 86_400_000))]
    out = decode_chunk(raw(values, kafka_ts=[None, None]), rules())
    assert out.quarantine.num_rows == 0 and out.rows.num_rows == 2


def test_a_producer_set_kafka_timestamp_at_the_edge_of_int64_is_compared_without_overflow():
    values = [enc(click(0)), enc(click(1))]
    out = decode_chunk(raw(values, kafka_ts=[2**63 - 1, -(2**63)]), rules())
    reasons = reasons_by_offset(out)
    assert (
        "before its Kafka timestamp" in reasons[0]
        and "beyond event_time.max_lateness 7d" in reasons[0]
    )
    assert "ahead of its Kafka timestamp" in reasons[1]


def test_event_times_in_every_unit_including_far_and_pre_1970_values():
    ns = decode_chunk(raw([enc(click(0, ts=T0 * 1_000_000 + 999))]), rules(unit="ns"))
    assert ns.rows.column("_event_time").cast(pa.int64()).to_pylist() == [T0 * 1000]
    s = decode_chunk(raw([enc(click(0, ts=T0 // 1000)), enc(click(1, ts=2**62))]), rules(unit="s"))
    assert s.rows.column("_offset").to_pylist() == [0]
    assert reasons_by_offset(s) == {
        1: f"event time `ts` {2**62} (s) lies outside 0001-01-01 to 9999-12-31T23:59:59Z"
    }
    early = T0 - 56 * 365 * 86_400_000  # 1969-12-04, before the epoch
    out = decode_chunk(
        raw([enc(click(0, ts=early - 1))], kafka_ts=[early]), rules(min_valid="1900-01-01")
    )
    row = out.rows.to_pylist()[0]
    assert (row["dt"], row["hr"]) == (
        row["_event_time"].strftime("%Y-%m-%d"),
        row["_event_time"].strftime("%H"),
    )


def test_iso8601_event_times_beyond_year_9999_are_quarantined(tmp_path):
    schema = json.loads((ROOT / "schemas" / "clicks.avsc").read_text())
    for f in schema["fields"]:
        if f["name"] == "ts":
            f["type"] = "string"
    (tmp_path / "iso.avsc").write_text(json.dumps(schema))
    r = rules_for(tmp_path / "iso.avsc", unit="iso8601", timezone="America/New_York")
    values = [
        enc(click(0, ts="9999-12-31T23:00:00")),
        enc(click(1, ts="0001-01-01T00:00:00+01:00")),
    ]
    out = decode_chunk(raw(values, kafka_ts=[None, None]), r)
    assert reasons_by_offset(out) == {
        0: f"event time `ts` 9999-12-31T23:00:00 lies outside {YEARS}",
        1: f"event time `ts` 0001-01-01T00:00:00+01:00 lies outside {YEARS}",
    }


def test_rejected_rows_go_to_quarantine_with_their_reason_whatever_their_value():
    values = [enc(click(0)), enc(click(1)), None, b"garbage", enc(click(4))]
    headers = "headers could not be read: invalid UTF-8 in header key"
    out = decode_chunk(raw(values), rules(), rejected={1: headers, 2: headers, 3: ""})
    assert out.rows.column("_offset").to_pylist() == [0, 4]
    assert reasons_by_offset(out) == {1: headers, 2: headers, 3: "rejected before decoding"}
    with pytest.raises(IndexError, match="rejected row 5 is not a row of this chunk of 5"):
        decode_chunk(raw(values), rules(), rejected={5: headers})


# Hostile values inside otherwise valid records, for the property tests below.
PROPERTY_SCHEMA = {
    "type": "record",
    "name": "Event",
    "fields": [
        {"name": "ts", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "n", "type": ["null", "int"], "default": None},
        {"name": "big", "type": ["null", "long"], "default": None},
        {"name": "score", "type": ["null", "double"], "default": None},
        {"name": "ratio", "type": ["null", "float"], "default": None},
        {"name": "ok", "type": ["null", "boolean"], "default": None},
        {"name": "blob", "type": ["null", "bytes"], "default": None},
        {
            "name": "kind",
            "type": {"type": "enum", "name": "Kind", "symbols": ["a", "b"]},
            "default": "a",
        },
        {"name": "tags", "type": ["null", {"type": "array", "items": "string"}], "default": None},
        {
            "name": "ctx",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "Ctx",
                    "fields": [
                        {"name": "ip", "type": ["null", "string"]},
                        {
                            "name": "at",
                            "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}],
                        },
                    ],
                },
            ],
            "default": None,
        },
        {
            "name": "amount",
            "type": [
                "null",
                {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
            ],
            "default": None,
        },
        {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}], "default": None},
        {
            "name": "clock",
            "type": ["null", {"type": "int", "logicalType": "time-millis"}],
            "default": None,
        },
        {
            "name": "seen",
            "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}],
            "default": None,
        },
        {
            "name": "local",
            "type": ["null", {"type": "long", "logicalType": "local-timestamp-millis"}],
            "default": None,
        },
        {
            "name": "id",
            "type": ["null", {"type": "string", "logicalType": "uuid"}],
            "default": None,
        },
    ],
}
AVRO_EXTRA = {
    "name": "attrs",
    "type": ["null", {"type": "map", "values": "string"}],
    "default": None,
}
DAY_MS = 86_400_000
EVENT_TIMES = [
    T0,
    T0 - 5 * DAY_MS,
    0,
    946_684_799_999,  # just below min_valid (2000-01-01)
    -1,
    -(2**63),
    T0 + 400 * DAY_MS,  # far future
    253_402_300_800_000,  # beyond year 9999
    2**63 - 1,
    T0 - 30 * DAY_MS,  # beyond max_lateness
]
KAFKA_TIMES = [T0, T0 + 3_600_000, T0 + 10 * DAY_MS, None]
# Half of the events in the believable range, half at one of the edges.
event_time = st.integers(T0 - DAY_MS, T0 + 3_600_000) | st.sampled_from(EVENT_TIMES)
# Text from every Unicode plane, surrogates excepted (they are not characters).
text = st.text(st.characters(exclude_categories=("Cs",)), max_size=30) | st.sampled_from(
    ["", "\x00", "\U00010000", "\U0001f600", "\U000e0001", "\U0010ffff", "é" * 3000]
)
JSON_HOSTILE = [
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"1e400",
    b"-1e400",
    b"1e39",
    b"2147483648",
    b"-2147483649",
    b"9223372036854775808",
    b"100000000000000000000000000000",
    b"1.5",
    b"-0",
    b"true",
    b"null",
    b"{}",
    b"[]",
    b'{"a": [1, {"b": null}]}',
    b"[" * 3000 + b"]" * 3000,
    b'"\\ud800"',
    b'"a\\udc00b"',
    b'"\\ud83d\\ude00"',
    b'"a\\u0000b"',
    b'"\xff\xfe"',
    b'"ok\xc3("',
    b'"\xed\xa0\x80"',
    b'"a\x01b"',
    b'"' + b"x" * 100_000 + b'"',
    b'"2025-11-22T10:00:00Z"',
    b'"not-a-uuid"',
    b'"12.345"',
    b'"1e5"',
    b"[1, NaN]",
    b'["a", "\\ud800"]',
    b'{"ip": "\xff", "at": 1e400}',
    b'{"ip": 5}',
    b'"c"',
    b"86400000",
    b"2932897",
]


# What a message is: garbage bytes, a truncated record, an ordinary record, a record
# with hostile values, or (Avro only) one with invalid UTF-8 inside its strings.
MESSAGE_KINDS = ["garbage", "truncated", "plain", "plain", "plain", "hostile", "hostile", "evil"]


def json_value(field: dict, draw, hostile: bool) -> bytes:
    """A valid JSON value of the field's type, most of the time; else something hostile."""
    if hostile and draw(st.integers(0, 5)) == 0:
        return draw(st.sampled_from(JSON_HOSTILE))
    kind = field["type"][1] if isinstance(field["type"], list) else field["type"]
    logical = kind.get("logicalType") if isinstance(kind, dict) else None
    name = kind if isinstance(kind, str) else kind["type"]
    if logical == "decimal":
        return json.dumps(draw(st.sampled_from([0, 1.25, "-3.5", 1234567.89]))).encode()
    if logical == "uuid":
        return json.dumps(str(uuid.UUID(int=draw(st.integers(0, 2**128 - 1))))).encode()
    if logical == "date":
        return str(draw(st.integers(-719_162, 2_932_896))).encode()
    if logical == "time-millis":
        return str(draw(st.integers(0, 86_399_999))).encode()
    if logical is not None or name in ("int", "long"):
        return str(draw(st.integers(-(2**31), 2**31 - 1))).encode()
    if name in ("double", "float"):
        return json.dumps(draw(st.floats(width=32, allow_nan=False, allow_infinity=False))).encode()
    if name == "boolean":
        return b"true"
    if name == "enum":
        return draw(st.sampled_from([b'"a"', b'"b"', b'"zzz"'] if hostile else [b'"a"', b'"b"']))
    if name == "array":
        return json.dumps(draw(st.lists(text, max_size=3)), ensure_ascii=False).encode()
    if name == "record":
        at = draw(st.sampled_from(EVENT_TIMES) if hostile else st.integers(0, T0))
        return json.dumps({"ip": draw(text), "at": at}).encode()
    return json.dumps(draw(text), ensure_ascii=draw(st.booleans())).encode()


@st.composite
def json_message(draw) -> bytes | None:
    kind = draw(st.sampled_from(MESSAGE_KINDS))
    if kind == "garbage":
        return draw(st.binary(max_size=60) | st.none())
    hostile = kind in ("hostile", "evil")
    parts = [b'"ts": ' + str(draw(event_time)).encode()]
    for field in PROPERTY_SCHEMA["fields"][1:]:
        if field["name"] == "name" or draw(st.booleans()):
            value = json_value(field, draw, hostile)
            parts.append(json.dumps(field["name"]).encode() + b": " + value)
    if hostile and draw(st.booleans()):  # an extra key, or a duplicate one
        key = draw(st.sampled_from(["extra", "name", "ts", "\U0001f600"]))
        parts.append(json.dumps(key).encode() + b": " + draw(st.sampled_from(JSON_HOSTILE)))
    body = b"{" + b", ".join(draw(st.permutations(parts))) + b"}"
    if kind == "truncated":
        return body[: draw(st.integers(0, len(body)))]
    return body


@pytest.fixture(scope="module")
def property_rules(tmp_path_factory) -> dict[str, DecodeRules]:
    root = tmp_path_factory.mktemp("property")
    (root / "json.avsc").write_text(json.dumps(PROPERTY_SCHEMA))
    avro = {**PROPERTY_SCHEMA, "fields": [*PROPERTY_SCHEMA["fields"], AVRO_EXTRA]}
    (root / "avro.avsc").write_text(json.dumps(avro))
    return {
        "json": rules_for(root / "json.avsc", "json"),
        "avro": rules_for(root / "avro.avsc", "avro"),
    }


def check_decoded_and_written(
    values: list, kafka: list, r: DecodeRules, strict_stats: bool
) -> None:
    chunk = raw(values, kafka_ts=kafka)
    out = decode_chunk(chunk, r)  # never raises, whatever the values
    row_offsets = out.rows.column("_offset").to_pylist()
    quarantined = out.quarantine.column("_offset").to_pylist()
    assert sorted(row_offsets + quarantined) == list(range(len(values)))
    assert all(out.quarantine.column("reason").to_pylist())
    out.rows.validate(full=True)
    with tempfile.TemporaryDirectory() as root:
        for name, table, schema, parts in (
            ("table", out.rows, r.out_schema, partition_columns(r.partitioning)),
            ("quarantine", out.quarantine, QUARANTINE_SCHEMA, []),
        ):
            writer = PartitionedWriter(
                pafs.LocalFileSystem(), f"{root}/{name}", schema, parts, 1, "t00000", 1 << 20, 50
            )
            writer.write(table)
            files = writer.close()
            for f in files:
                stats = json.loads(f.stats)  # Python's json also takes NaN and Infinity
                assert stats["numRecords"] == f.rows
                if strict_stats:
                    json.dumps(stats, allow_nan=False)
            back = (
                ds.dataset(f"{root}/{name}", format="parquet", partitioning="hive").to_table()
                if files
                else table.slice(0, 0)
            )
            expected = row_offsets if name == "table" else quarantined
            assert sorted(back.column("_offset").to_pylist()) == sorted(expected)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(json_message(), st.sampled_from(KAFKA_TIMES)), max_size=25),
)
def test_hostile_json_values_never_crash_and_every_message_lands_once(property_rules, messages):
    values = [v for v, _ in messages]
    kafka = [k for _, k in messages]
    check_decoded_and_written(values, kafka, property_rules["json"], strict_stats=True)


AVRO_HOSTILE_FIELDS = {
    "n": st.integers(-(2**63), 2**63 - 1),
    "big": st.integers(-(2**63), 2**63 - 1),
    "score": st.floats(),
    "ratio": st.floats(width=32),
    "amount": st.binary(max_size=40),
    "day": st.integers(-(2**40), 2**40),
    "clock": st.integers(-(2**40), 2**40),
    "seen": st.integers(-(2**63), 2**63 - 1),
    "local": st.integers(-(2**63), 2**63 - 1),
    "id": text,
    "tags": st.lists(text, max_size=4),
    "attrs": st.dictionaries(text, text, max_size=3),
    "blob": st.binary(max_size=50),
    "ctx": st.fixed_dictionaries(
        {"ip": text | st.none(), "at": st.integers(-(2**63), 2**63 - 1) | st.none()}
    ),
}


AVRO_PLAIN_FIELDS = {
    "n": st.integers(-(2**31), 2**31 - 1),
    "amount": st.integers(-(10**9) + 1, 10**9 - 1).map(lambda v: v.to_bytes(8, "big", signed=True)),
    "day": st.integers(-719_162, 2_932_896),
    "clock": st.integers(0, 86_399_999),
    "seen": st.integers(T0 * 1000 - 10**12, T0 * 1000 + 10**12),
    "local": st.integers(T0 - 10**9, T0 + 10**9),
    "id": st.uuids().map(str),
    "ctx": st.fixed_dictionaries({"ip": text | st.none(), "at": st.integers(0, T0) | st.none()}),
}


# The same wire encoding as the schema, with strings as bytes: how a producer sends
# invalid UTF-8 inside an Avro string.
def _strings_as_bytes(avro_type):
    if avro_type == "string":
        return "bytes"
    if isinstance(avro_type, list):
        return [_strings_as_bytes(t) for t in avro_type]
    if isinstance(avro_type, dict):
        return {
            k: _strings_as_bytes(v) if k in ("type", "items", "values", "fields") else v
            for k, v in avro_type.items()
        }
    return avro_type


@st.composite
def avro_message(draw) -> bytes | None:
    kind = draw(st.sampled_from(MESSAGE_KINDS))
    if kind == "garbage":
        return draw(st.binary(max_size=60) | st.none())
    schema = {**PROPERTY_SCHEMA, "fields": [*PROPERTY_SCHEMA["fields"], AVRO_EXTRA]}
    record = {f["name"]: None for f in schema["fields"]}
    record.update(ts=draw(event_time), name=draw(text), kind=draw(st.sampled_from(["a", "b"])))
    for name, values in AVRO_HOSTILE_FIELDS.items():
        if draw(st.booleans()):
            plain = kind in ("plain", "truncated")
            record[name] = draw(AVRO_PLAIN_FIELDS.get(name, values) if plain else values)
    writer_schema = without_logical_types(schema)
    if kind == "evil":
        writer_schema = _strings_as_bytes(writer_schema)
        record["name"] = draw(st.binary(max_size=10))
        if record["id"] is not None:
            record["id"] = draw(st.sampled_from([b"\xff", b"\xed\xa0\x80", b"ok"]))
        record["tags"] = [draw(st.binary(max_size=5))]
        record["attrs"] = {b"\xc3": b"x"} if draw(st.booleans()) else None
        record["ctx"] = None
    buf = io.BytesIO()
    try:
        schemaless_writer(buf, parse_schema(writer_schema), record)
    except (OverflowError, ValueError, struct.error):
        return draw(st.binary(max_size=60))  # a value even fastavro cannot write
    body = buf.getvalue()
    if kind == "truncated":
        return body[: draw(st.integers(0, len(body)))] + draw(st.binary(max_size=3))
    return body


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(avro_message(), st.sampled_from(KAFKA_TIMES)), max_size=25))
def test_hostile_avro_values_never_crash_and_every_message_lands_once(property_rules, messages):
    values = [v for v, _ in messages]
    kafka = [k for _, k in messages]
    # Avro doubles may be infinite; the writer's statistics then hold Infinity.
    check_decoded_and_written(values, kafka, property_rules["avro"], strict_stats=False)


def test_decoding_and_writing_chunk_after_chunk_holds_no_more_memory_as_chunks_go_by(tmp_path):
    # A task decodes and writes chunk after chunk, and reads with the cyclic collector
    # paused: whatever a chunk leaves in a reference cycle stays in memory until that
    # collector runs. The memory held must stay that of the write buffer and one chunk.
    rules_ = rules()
    writer = PartitionedWriter(
        pafs.LocalFileSystem(),
        str(tmp_path),
        rules_.out_schema,
        partition_columns(rules_.partitioning),
        1,
        "t00000",
        64 << 20,
        1 << 30,  # rows are held until the buffer is full
        2 << 20,
    )
    pool = pa.default_memory_pool()
    # Twenty event hours per chunk, and one bad message, which is found by halves.
    stamps = [T0 + i * 7_200 for i in range(10_000)]
    values = [enc(click(i, ts=ts)) for i, ts in enumerate(stamps)]
    values[7] = b"{not json"
    chunk = raw(values, [ts + 500 for ts in stamps])
    held = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(12):
            out = decode_chunk(chunk, rules_)
            assert out.rows.num_rows == 9_999 and out.quarantine.num_rows == 1
            writer.write(out.rows)
            del out
            held.append(pool.bytes_allocated())
    finally:
        gc.enable()
    # A chunk is about 2 MB decoded; while the buffer fills (2 MB) the first chunks count.
    assert max(held[3:]) - min(held[3:]) < 4 << 20, [h >> 20 for h in held]
    assert len(writer.close()) >= 20


def test_a_json_message_that_is_null_is_quarantined_and_never_crashes_the_process():
    # Arrow's JSON reader crashes its process (SIGSEGV) when a block begins with a
    # top-level null. Decoded in a child process, so the old behaviour fails this test
    # instead of ending the test run.
    script = """
import json, sys
from tests.unit.test_decode import click, decode_chunk, enc, raw, rules
values = [b"null", b" null", b"\\xef\\xbb\\xbfnull", b"null {}", b"7", b"[1]", enc(click(7))]
for first in range(len(values)):  # each message first in its block
    order = values[first:] + values[:first]
    out = decode_chunk(raw(order), rules())
    reasons = dict(zip(out.quarantine.column("_offset").to_pylist(),
                       out.quarantine.column("reason").to_pylist()))
    print(json.dumps({"rows": out.rows.column("event_id").to_pylist(),
                      "reasons": [reasons.get(i) for i in range(len(order))],
                      "order": [v.decode("utf-8", "replace") for v in order]}))
"""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    null = "not valid JSON for the schema: the message is null, not an object"
    expected = {
        "null": null,
        " null": null,
        "\ufeffnull": null,
        "null {}": "not valid JSON for the schema: the message begins with null, not an object",
        "7": "not valid JSON for the schema: the message is a number, not an object",
        "[1]": "not valid JSON for the schema: the message is an array, not an object",
    }
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 7
    for line in lines:
        out = json.loads(line)
        assert out["rows"] == ["e7"]
        by_value = dict(zip(out["order"], out["reasons"], strict=True))
        assert by_value == {**expected, enc(click(7)).decode(): None}
