"""Decoding: every message lands once, as a row or as a quarantined row with its reason."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import pyarrow as pa
import pytest
from fastavro import parse_schema, schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from strata.config import EventTimeConfig, PipelineConfig
from strata.decode import DecodeRules, decode_chunk, partition_stats
from strata.schema import RAW_SCHEMA

ROOT = Path(__file__).resolve().parents[1]
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
    return DecodeRules.from_config(cfg)


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
    r = DecodeRules.from_config(cfg)
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
    from strata.schema import SchemaError

    with pytest.raises(SchemaError, match="unit is iso8601 but field 'ts' is int64"):
        rules(unit="iso8601")
