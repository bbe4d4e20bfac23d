"""Which fields a table following its registry subject takes on: decided on literal schemas."""

from __future__ import annotations

import copy
import json

import pytest

from strata.config import EventTimeConfig, PipelineConfig, SchemaRegistryConfig
from strata.evolve import merged_fields
from tests.conftest import ROOT

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
    merged, refused = merged_fields(TABLE, _with(OPTIONAL, field))
    assert refused == ["score"]
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
