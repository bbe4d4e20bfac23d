"""Partition values: event time in a zone (daylight saving included), back to instants,
and a field partition's bounded values; their load-time checks and the safety rules."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
import yaml
from pydantic import ValidationError

from strata.batch.decode import DecodeRules, decode_chunk
from strata.batch.plan import decode_fingerprint
from strata.config import (
    EventTimeConfig,
    FieldPartitionConfig,
    PartitioningConfig,
    PipelineConfig,
    load_pipeline,
)
from strata.errors import ConfigError, SchemaError
from strata.maintenance.compact import partition_end
from strata.schema.avro import column_signature, data_schema, partition_columns, schema_changes
from strata.schema.partitions import event_partitions, field_partitions, partition_span
from tests.conftest import ROOT, clicks_config
from tests.unit.test_config import GOOD, _project
from tests.unit.test_decode import enc, raw

BERLIN = "Europe/Berlin"


def us(moment: str) -> int:
    return int(datetime.fromisoformat(moment).timestamp()) * 1_000_000


def partitions(moments: list[str], zone: str) -> list[tuple[str, str]]:
    dt, hr = event_partitions(pa.array([us(m) for m in moments], pa.int64()), zone)
    return list(zip(dt.to_pylist(), hr.to_pylist(), strict=True))


def test_spring_forward_lands_in_the_local_hour_and_the_skipped_hour_never_occurs():
    found = partitions(
        ["2026-03-29T00:30Z", "2026-03-29T00:59:59Z", "2026-03-29T01:00Z", "2026-03-28T23:10Z"],
        BERLIN,
    )
    assert found == [
        ("2026-03-29", "01"),
        ("2026-03-29", "01"),
        ("2026-03-29", "03"),
        ("2026-03-29", "00"),
    ]


def test_the_autumn_hour_that_repeats_is_one_partition():
    found = partitions(
        ["2026-10-24T23:30Z", "2026-10-25T00:30Z", "2026-10-25T01:30Z", "2026-10-25T02:00Z"],
        BERLIN,
    )
    assert found == [
        ("2026-10-25", "01"),
        ("2026-10-25", "02"),
        ("2026-10-25", "02"),
        ("2026-10-25", "03"),
    ]


def test_utc_is_unchanged_and_half_hour_zones_split_a_utc_hour():
    moments = [
        "2025-11-22T10:00Z",
        "2025-11-22T10:29:59Z",
        "2025-11-22T10:30Z",
        "2025-11-22T23:45Z",
    ]
    assert partitions(moments, "UTC") == [("2025-11-22", h) for h in ("10", "10", "10", "23")]
    assert partitions(moments, "Asia/Kolkata") == [
        ("2025-11-22", "15"),
        ("2025-11-22", "15"),
        ("2025-11-22", "16"),
        ("2025-11-23", "05"),
    ]


def test_the_ends_of_the_years_land_in_the_first_and_last_hours_without_raising():
    first = -62_135_596_800_000_000
    last = 253_402_300_799_000_000
    dt, hr = event_partitions(pa.array([first, last], pa.int64()), "America/Los_Angeles")
    assert dt.to_pylist()[0] == "0001-01-01" and hr.to_pylist()[0] == "00"
    dt, hr = event_partitions(pa.array([first, last], pa.int64()), "Asia/Tokyo")
    assert (dt.to_pylist()[1], hr.to_pylist()[1]) == ("9999-12-31", "23")


def test_a_partition_span_holds_the_hours_of_both_daylight_saving_days():
    z = UTC
    assert partition_span("2026-10-25", "02", BERLIN) == (
        datetime(2026, 10, 25, 0, tzinfo=z),
        datetime(2026, 10, 25, 2, tzinfo=z),
    )
    assert partition_span("2026-03-29", "01", BERLIN) == (
        datetime(2026, 3, 29, 0, tzinfo=z),
        datetime(2026, 3, 29, 1, tzinfo=z),
    )
    start, end = partition_span("2026-03-29", "02", BERLIN) or (None, None)
    assert start == end  # the skipped hour holds no instant
    assert partition_span("2026-03-29", None, BERLIN) == (
        datetime(2026, 3, 28, 23, tzinfo=z),
        datetime(2026, 3, 29, 22, tzinfo=z),
    )
    assert partition_span("2026-10-25", None, BERLIN) == (
        datetime(2026, 10, 24, 22, tzinfo=z),
        datetime(2026, 10, 25, 23, tzinfo=z),
    )
    for bad in (("2026-13-01", None), ("2026-10-25", "24"), ("26-10-25", "01"), ("x", "1")):
        assert partition_span(*bad, BERLIN) is None


@pytest.mark.parametrize("zone", [BERLIN, "America/New_York", "Asia/Kolkata", "UTC"])
@pytest.mark.parametrize("day", ["2026-03-29", "2026-03-08", "2026-10-25", "2026-11-01"])
def test_every_instant_lies_in_the_span_of_its_own_partition(zone, day):
    start = datetime.fromisoformat(day).replace(tzinfo=UTC) - timedelta(hours=14)
    instants = [start + timedelta(minutes=7 * i) for i in range(8 * 28 * 7)]
    values = pa.array([int(t.timestamp()) * 1_000_000 for t in instants], pa.int64())
    dt, hr = event_partitions(values, zone)
    for t, d, h in zip(instants, dt.to_pylist(), hr.to_pylist(), strict=True):
        for hour in (h, None):
            span = partition_span(d, hour, zone)
            assert span is not None and span[0] <= t < span[1], (t, d, h)


def test_compaction_settles_a_partition_at_its_end_in_the_zone():
    assert partition_end({"dt": "2026-10-25", "hr": "02"}, BERLIN) == datetime(
        2026, 10, 25, 2, tzinfo=UTC
    )
    assert partition_end({"dt": "2026-10-25", "hr": "02", "p_country": "DE"}, BERLIN) == (
        datetime(2026, 10, 25, 2, tzinfo=UTC)
    )
    assert partition_end({"dt": "2026-01-02"}, "Asia/Kolkata") == datetime(
        2026, 1, 2, 18, 30, tzinfo=UTC
    )


COUNTRY = FieldPartitionConfig(name="country", values=("DE", "FR", "US"))


def test_a_field_partition_keeps_listed_values_and_sends_the_rest_to_other():
    found = field_partitions(pa.array(["DE", "IT", None, "US", "", "de"]), COUNTRY)
    assert found.to_pylist() == ["DE", "__other__", "__other__", "US", "__other__", "__other__"]
    numbers = FieldPartitionConfig(name="latency_ms", values=("1", "-3"), other="rest")
    found = field_partitions(pa.chunked_array([pa.array([1, -3, 2, None], pa.int32())]), numbers)
    assert found.to_pylist() == ["1", "-3", "rest", "rest"]


def cfg(**partitioning) -> PipelineConfig:
    return clicks_config(partitioning=PartitioningConfig(**partitioning))


def click(i: int, ts: str, **over) -> dict:
    return {"event_id": f"e{i}", "user_id": i, "page": "/", "device": "mobile", "ts": ts, **over}


def test_decoded_rows_carry_local_partitions_and_the_field_partition_after_them():
    c = cfg(timezone=BERLIN, field=COUNTRY)
    rules = DecodeRules.of_decoding(c.decoding())
    moments = ["2026-03-29T00:30Z", "2026-10-25T00:30Z", "2026-10-25T01:30Z", "2026-10-25T02:30Z"]
    countries = [{"country": "DE"}, {"country": "IT"}, {"country": None}, {}]
    values = [
        enc(click(i, 0, **c) | {"ts": us(m) // 1000})
        for i, (m, c) in enumerate(zip(moments, countries, strict=True))
    ]
    out = decode_chunk(raw(values, [us(m) // 1000 for m in moments]), rules)
    assert out.quarantine.num_rows == 0
    assert out.rows.schema.names[-3:] == ["dt", "hr", "p_country"]
    assert out.rows.select(["dt", "hr", "p_country", "country"]).to_pylist() == [
        {"dt": "2026-03-29", "hr": "01", "p_country": "DE", "country": "DE"},
        {"dt": "2026-10-25", "hr": "02", "p_country": "__other__", "country": "IT"},
        {"dt": "2026-10-25", "hr": "02", "p_country": "__other__", "country": None},
        {"dt": "2026-10-25", "hr": "03", "p_country": "__other__", "country": None},
    ]
    # The row's event time stays the UTC instant.
    assert out.rows.column("_event_time").to_pylist()[0] == datetime(2026, 3, 29, 0, 30, tzinfo=UTC)


def test_an_enum_field_partitions_by_its_symbols():
    device = FieldPartitionConfig(name="device", values=("mobile",), other="else")
    c = cfg(by="dt", field=device)
    rules = DecodeRules.of_decoding(c.decoding())
    at = us("2026-01-01T12:00Z") // 1000
    values = [enc(click(0, at, device="mobile")), enc(click(1, at, device="tablet"))]
    out = decode_chunk(raw(values, [at, at]), rules)
    assert partition_columns(rules.partitioning) == ["dt", "p_device"]
    assert out.rows.column("p_device").to_pylist() == ["mobile", "else"]
    assert out.rows.column("device").to_pylist() == ["mobile", "tablet"]


@pytest.mark.parametrize(
    ("field", "problem"),
    [
        ({"name": "nope", "values": ["a"]}, "partitioning.field.name 'nope' is not a field"),
        ({"name": "referrer", "values": ["a"]}, None),
        ({"name": "session_id", "values": ["a"]}, None),
        ({"name": "user_id", "values": [7, "08"]}, "lists '08', which no integer is written as"),
    ],
)
def test_a_field_the_schema_cannot_partition_by_fails_at_load(field, problem):
    spec = FieldPartitionConfig.model_validate(field)
    c = cfg(field=spec)
    if problem is None:
        DecodeRules.of_decoding(c.decoding())
    else:
        with pytest.raises(SchemaError, match=problem):
            DecodeRules.of_decoding(c.decoding())


def test_a_float_field_or_a_clash_with_a_field_fails_at_load(tmp_path):
    schema = json.loads((ROOT / "schemas" / "clicks.avsc").read_text())
    schema["fields"] += [
        {"name": "score", "type": "double"},
        {"name": "P_Page", "type": ["null", "string"], "default": None},
    ]
    (tmp_path / "s.avsc").write_text(json.dumps(schema))

    def load(name: str) -> DecodeRules:
        c = PipelineConfig(
            name="clicks",
            topics=["clicks"],
            schema_file="s.avsc",
            schemas_dir=str(tmp_path),
            event_time=EventTimeConfig(field="ts"),
            partitioning=PartitioningConfig(field=FieldPartitionConfig(name=name, values=("a",))),
        )
        return DecodeRules.of_decoding(c.decoding())

    with pytest.raises(SchemaError, match=r"'score' is double, but a field partition takes a "):
        load("score")
    with pytest.raises(ValidationError, match=r"field `P_Page` is the partition column `p_page`"):
        load("page")


@pytest.mark.parametrize(
    ("partitioning", "problem"),
    [
        ({"timezone": "Mars/Olympus"}, r"`partitioning.timezone`: .*unknown time zone"),
        ("hourly", r"`partitioning`: .*'hourly' is not a partitioning; use dt, dt_hr"),
        (
            {"field": {"name": "country", "values": ["DE", "../x"]}},
            r"`partitioning.field.values`: .*'../x' cannot name a",
        ),
        (
            {"field": {"name": "country", "values": [".hidden"]}},
            r"`partitioning.field.values`: .*'.hidden' cannot name a",
        ),
        (
            {"field": {"name": "country", "values": ["a/b"]}},
            r"`partitioning.field.values`: .*'a/b' cannot name a",
        ),
        (
            {"field": {"name": "country", "values": ["x" * 65]}},
            r"`partitioning.field.values`: .*cannot name a partition",
        ),
        ({"field": {"name": "country", "values": []}}, r"`partitioning.field.values`"),
        (
            {"field": {"name": "country", "values": ["DE", "DE"]}},
            r"`partitioning.field`: .*a value is listed twice",
        ),
        (
            {"field": {"name": "country", "values": ["DE", "x"], "other": "x"}},
            r"`partitioning.field`: .*`other` 'x' is also one of `values`",
        ),
        (
            {"field": {"name": "country", "values": ["DE"], "other": "a b"}},
            r"`partitioning.field.other`",
        ),
    ],
)
def test_bad_partitioning_fails_at_load_naming_the_file_and_key(tmp_path, partitioning, problem):
    conf = _project(tmp_path, {**GOOD, "partitioning": partitioning})
    with pytest.raises(ConfigError, match=r"clicks\.yaml: key " + problem):
        load_pipeline("clicks", conf)


def test_partitioning_loads_plain_or_as_a_mapping(tmp_path):
    body = {"by": "dt", "timezone": BERLIN, "field": {"name": "user_id", "values": [1, 2]}}
    conf = _project(tmp_path, {**GOOD, "partitioning": body})
    loaded = load_pipeline("clicks", conf).partitioning
    assert loaded.field is not None and loaded.field.values == ("1", "2")
    assert (loaded.by, loaded.timezone, loaded.field.other) == ("dt", BERLIN, "__other__")
    (conf / "pipelines" / "clicks.yaml").write_text(yaml.safe_dump({**GOOD, "partitioning": "dt"}))
    assert load_pipeline("clicks", conf).partitioning == PartitioningConfig(by="dt")


def test_a_changed_zone_or_field_is_refused_on_a_table_with_batches():
    c = cfg()
    topic = DecodeRules.of_decoding(c.decoding()).topic
    plain = column_signature(data_schema(topic, PartitioningConfig()))
    berlin = data_schema(topic, PartitioningConfig(timezone=BERLIN))
    by_country = data_schema(topic, PartitioningConfig(field=COUNTRY))
    assert plain[-2:] == [["dt", "string"], ["hr", "string"]]  # as recorded before zones
    assert schema_changes(plain, data_schema(topic, PartitioningConfig()), ()) == ([], [])
    assert schema_changes(column_signature(berlin), berlin, ()) == ([], [])
    _, problems = schema_changes(plain, berlin, ())
    assert problems == [
        "the partitioning changed (column dt was in UTC, is now in Europe/Berlin; column hr was "
        "in UTC, is now in Europe/Berlin), but a table keeps the partitioning it was created "
        "with; restore `partitioning`, or point the pipeline at new tables"
    ]
    added, problems = schema_changes(plain, by_country, ())
    assert added == [] and problems[0].startswith("the partitioning changed (column p_country)")
    _, problems = schema_changes(
        column_signature(by_country), data_schema(topic, PartitioningConfig()), ()
    )
    assert problems[0].startswith("the partitioning changed (column p_country)")
    more = COUNTRY.model_copy(update={"values": ("DE", "FR", "US", "IT")})
    _, problems = schema_changes(
        column_signature(by_country), data_schema(topic, PartitioningConfig(field=more)), ()
    )
    assert problems[0].startswith(
        "the partitioning changed (column p_country was from field country: DE, FR, US; other "
        "__other__, is now from field country: DE, FR, US, IT; other __other__)"
    )


def test_the_fingerprint_holds_the_zone_and_the_field_and_keeps_plain_plans_as_they_were():
    plain = decode_fingerprint(cfg().decoding())
    assert plain == decode_fingerprint(cfg(by="dt_hr", timezone="UTC").decoding())
    found = {
        plain,
        decode_fingerprint(cfg(timezone=BERLIN).decoding()),
        decode_fingerprint(cfg(field=COUNTRY).decoding()),
        decode_fingerprint(cfg(field=COUNTRY.model_copy(update={"other": "rest"})).decoding()),
        decode_fingerprint(cfg(field=COUNTRY.model_copy(update={"values": ("DE",)})).decoding()),
    }
    assert len(found) == 5
