"""Which fields a table following its registry subject takes on: decided on literal schemas."""

from __future__ import annotations

import copy
import json
import logging
import uuid

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from strata.config import EventTimeConfig, PipelineConfig, SchemaRegistryConfig
from strata.errors import SchemaRegistryUnavailable
from strata.schema.evolve import evolved, merged_fields
from tests.conftest import REGISTRY_PASSWORD, REGISTRY_USER, ROOT
from tests.registry_stub import StubRegistry

TABLE = json.loads((ROOT / "schemas" / "clicks.avsc").read_text())
OPTIONAL = {"name": "campaign", "type": ["null", "string"], "default": None}


def _with(*fields: dict) -> dict:
    schema = copy.deepcopy(TABLE)
    schema["fields"] += list(fields)
    return schema


def test_optional_fields_are_appended_in_order_and_nothing_else_changes():
    later = {"name": "source", "type": ["null", "long"], "default": None}
    # The registered schema names the fields in its own order, retypes one and drops one:
    # only the added optional ones count, after the table's own.
    other = _with(later, OPTIONAL)
    other["fields"] = [f for f in other["fields"] if f["name"] != "referrer"]
    other["fields"][1] = {**other["fields"][1], "type": "string"}
    merged, refused = merged_fields(TABLE, other)
    assert [f["name"] for f in merged["fields"]] == [
        *(f["name"] for f in TABLE["fields"]),
        "source",
        "campaign",
    ]
    assert merged["fields"][: len(TABLE["fields"])] == TABLE["fields"] and refused == []
    assert merged_fields(merged, TABLE) == (merged, [])  # a column is never dropped


@pytest.mark.parametrize(
    "field",
    [
        {"name": "score", "type": "int"},  # required
        {"name": "score", "type": ["null", "int"]},  # no default
        {"name": "score", "type": ["int", "null"], "default": 0},  # null not first
        {"name": "score", "type": ["null", "Rating"], "default": None},  # a type named elsewhere
    ],
)
def test_a_field_old_rows_cannot_read_as_null_is_left_out(field):
    merged, left_out = merged_fields(TABLE, _with(OPTIONAL, field))
    assert [item.field for item in left_out] == ["score"]
    assert [f["name"] for f in merged["fields"]][-1] == "campaign"


def test_evolve_needs_a_registry_and_confluent_avro():
    with pytest.raises(ValueError, match="evolve follows the registry's schemas but no url"):
        SchemaRegistryConfig(evolve=True)
    with pytest.raises(ValueError, match="applies to format confluent_avro only"):
        PipelineConfig(
            name="clicks",
            topics=["clicks"],
            schema_file="clicks.avsc",
            schemas_dir=str(ROOT / "schemas"),
            event_time=EventTimeConfig(field="ts"),
            schema_registry=SchemaRegistryConfig(url="http://registry:8081", evolve=True),
        )


# A schema from the registry (or the ledger) is data: whatever it holds, a plan goes on.

MALFORMED = [
    ("not an object", ["a", "list"], "is not an Avro record but a JSON array"),
    (
        "not a record",
        {"type": "enum", "name": "E", "symbols": ["A"]},
        "is not an Avro record (its type is 'enum')",
    ),
    ("no fields", {"type": "record", "name": "Click"}, "has no list of fields"),
    (
        "fields an object",
        {"type": "record", "name": "Click", "fields": {"name": "x"}},
        "has no list of fields",
    ),
    (
        "a field entry a number",
        {"type": "record", "name": "Click", "fields": [OPTIONAL, 5]},
        "has a field entry that is not an object (fields[1])",
    ),
    (
        "a field without a name",
        {"type": "record", "name": "Click", "fields": [OPTIONAL, {"type": "int"}]},
        "has a field entry without a string name (fields[1])",
    ),
    (
        "a field named by a number",
        {"type": "record", "name": "Click", "fields": [{**OPTIONAL, "name": 3}]},
        "has a field entry without a string name (fields[0])",
    ),
]


@pytest.mark.parametrize(
    ("other", "why"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_a_malformed_schema_adds_nothing_and_says_why(other, why):
    merged, left_out = merged_fields(TABLE, other)
    assert merged == TABLE
    assert len(left_out) == 1 and left_out[0].field is None and why in left_out[0].why


def test_names_of_strata_own_columns_are_left_out():
    others = [
        {"name": n, "type": ["null", "string"], "default": None}
        for n in ("dt", "hr", "_ingested", "P_Country", "p_device")
    ]
    merged, left_out = merged_fields(TABLE, _with(*others, OPTIONAL), partition_column="p_country")
    # `p_device` is no column of this pipeline's: only its field partition's is kept.
    assert [f["name"] for f in merged["fields"]][-2:] == ["p_device", "campaign"]
    assert [item.field for item in left_out] == ["dt", "hr", "_ingested", "P_Country"]
    assert all("Strata keeps for its own columns" in item.why for item in left_out)


def evolving(url: str, topic: str = "clicks", **settings) -> PipelineConfig:
    return PipelineConfig(
        name="clicks",
        topics=[topic],
        format="confluent_avro",
        schema_file="clicks.avsc",
        schemas_dir=str(ROOT / "schemas"),
        event_time=EventTimeConfig(field="ts"),
        schema_registry=SchemaRegistryConfig(
            url=url,
            username=REGISTRY_USER,
            password=REGISTRY_PASSWORD,
            allow_http_on_loopback=True,
            evolve=True,
            timeout_s=2,
        ),
        **settings,
    )


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def warnings():
    """The warnings `strata.schema.evolve` logs, whatever handlers the `strata` logger has."""
    logger, kept = logging.getLogger("strata.schema.evolve"), _Kept()
    logger.addHandler(kept)
    yield lambda: kept.lines
    logger.removeHandler(kept)


NEWEST = [
    ("not JSON", "{not json", "its newest schema is not JSON (JSONDecodeError: "),
    (
        "JSON text",
        json.dumps("just text"),
        "its newest schema is not an Avro record but a JSON string",
    ),
    *((case, json.dumps(other), f"its newest schema {why}") for case, other, why in MALFORMED[1:]),
]


@pytest.mark.parametrize(("text", "warned"), [n[1:] for n in NEWEST], ids=[n[0] for n in NEWEST])
def test_a_malformed_newest_schema_is_warned_of_and_the_plan_goes_on(text, warned, warnings):
    # A registry that checks what it registers holds none of these; one that does not
    # (or validation turned off) can, so a registry stand-in serves them.
    answers = {
        "/subjects/clicks-value/versions": (200, [1, 3]),
        "/subjects/clicks-value/versions/3": (
            200,
            {"subject": "clicks-value", "version": 3, "id": 9, "schema": text},
        ),
    }
    with StubRegistry(answers) as stub:
        cfg = evolving(stub.url)
        out = evolved(cfg.decoding(), ["clicks"])
    assert out == cfg.schema_text
    [line] = warnings()
    assert line.startswith("subject 'clicks-value': ") and warned in line
    assert line.endswith("; the table takes none of its new fields this time")


def test_fields_the_table_cannot_take_are_left_out_and_the_rest_is_a_schema_it_can(
    schema_registry, warnings
):
    from strata.batch.decode import DecodeRules

    topic = f"t-{uuid.uuid4().hex[:8]}"
    local_ts = {
        "name": "seen",
        "type": ["null", {"type": "long", "logicalType": "local-timestamp-millis"}],
        "default": None,
    }
    reserved = [
        {"name": n, "type": ["null", "string"], "default": None}
        for n in ("dt", "_ingested", "p_country")
    ]
    newest = _with(*reserved, local_ts, OPTIONAL)
    client = SchemaRegistryClient(
        {"url": schema_registry.url, "basic.auth.user.info": f"{REGISTRY_USER}:{REGISTRY_PASSWORD}"}
    )
    client.register_schema(f"{topic}-value", Schema(json.dumps(newest), "AVRO"))
    partitioned = {"field": {"name": "country", "values": ["DE"]}}
    cfg = evolving(schema_registry.url, topic, partitioning=partitioned)

    out = cfg.with_schema_text(evolved(cfg.decoding(), [topic]))

    fields = json.loads(out.schema_text)["fields"]
    assert [f["name"] for f in fields] == [*(f["name"] for f in TABLE["fields"]), "campaign"]
    rules = DecodeRules.of_decoding(out.decoding())
    assert rules.topic.arrow.names[-1] == "campaign"  # the plan's check
    lines = warnings()
    assert [line.split(",")[0] for line in lines] == [
        f"subject '{topic}-value' adds field '{name}'"
        for name in ("dt", "_ingested", "p_country", "seen")
    ]
    assert "local timestamp" in lines[-1] and "which the table cannot hold" in lines[-1]
    assert all(line.endswith("; the table does not take it") for line in lines)


def test_a_subject_the_registry_does_not_know_adds_nothing_and_an_outage_fails_the_plan(
    schema_registry, warnings
):
    cfg = evolving(schema_registry.url)
    assert evolved(cfg.decoding(), [f"t-{uuid.uuid4().hex[:8]}"]) == cfg.schema_text
    assert "holds no Avro schema" in warnings()[0]

    answers = {"/subjects/clicks-value/versions": (500, {"error_code": 50001, "message": "down"})}
    with StubRegistry(answers) as stub, pytest.raises(SchemaRegistryUnavailable) as err:
        evolved(evolving(stub.url).decoding(), ["clicks"])
    assert "gave no answer about subject 'clicks-value'" in str(err.value)
    assert REGISTRY_PASSWORD not in str(err.value)
