"""Avro schemas to columns: logical types, what each table format can hold, SQL types."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from strata.catalog.register import hive_type
from strata.catalog.sql import trino_type
from strata.config import EventTimeConfig, PipelineConfig
from strata.errors import MetastoreError, SchemaError
from strata.schema.avro import load_pipeline_schema, load_topic_schema, schema_changes
from strata.schema.evolve import merged_fields


def schema_file(tmp_path: Path, *fields: dict, name: str = "t.avsc") -> Path:
    path = tmp_path / name
    body = [{"name": "ts", "type": "long"}, *fields]
    path.write_text(json.dumps({"type": "record", "name": "T", "fields": body}))
    return path


def pipeline(path: Path, **over) -> PipelineConfig:
    return PipelineConfig(
        name="t",
        topics=["t"],
        schema_file=path.name,
        schemas_dir=str(path.parent),
        event_time=EventTimeConfig(field="ts"),
        **over,
    )


LOGICAL = [
    (
        {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
        pa.decimal128(10, 2),
    ),
    (
        {"type": "fixed", "name": "F", "size": 16, "logicalType": "decimal", "precision": 38},
        pa.decimal128(38, 0),
    ),
    (
        {"type": "bytes", "logicalType": "decimal", "precision": 39, "scale": 3},
        pa.decimal256(39, 3),
    ),
    ({"type": "int", "logicalType": "date"}, pa.date32()),
    ({"type": "int", "logicalType": "time-millis"}, pa.int32()),
    ({"type": "long", "logicalType": "time-micros"}, pa.int64()),
    ({"type": "long", "logicalType": "timestamp-millis"}, pa.timestamp("ms", tz="UTC")),
    ({"type": "long", "logicalType": "timestamp-micros"}, pa.timestamp("us", tz="UTC")),
    ({"type": "long", "logicalType": "local-timestamp-millis"}, pa.timestamp("ms")),
    ({"type": "long", "logicalType": "local-timestamp-micros"}, pa.timestamp("us")),
    ({"type": "string", "logicalType": "uuid"}, pa.string()),
    # Unknown logical types, and known ones on another underlying type, are read as
    # the underlying type, as the Avro specification says.
    ({"type": "long", "logicalType": "timestamp-nanos"}, pa.int64()),
    ({"type": "fixed", "name": "D", "size": 12, "logicalType": "duration"}, pa.binary()),
    ({"type": "fixed", "name": "U", "size": 16, "logicalType": "uuid"}, pa.binary()),
    ({"type": "string", "logicalType": "timestamp-millis"}, pa.string()),
    ({"type": "int", "logicalType": "no-such-type"}, pa.int32()),
]


@pytest.mark.parametrize(("avro", "arrow"), LOGICAL, ids=[str(a) for a, _ in LOGICAL])
def test_each_logical_type_maps_to_its_column_type(tmp_path, avro, arrow):
    topic = load_topic_schema(schema_file(tmp_path, {"name": "x", "type": avro}))
    assert topic.arrow.field("x").type == arrow
    nested = {
        "type": "array",
        "items": {"type": "record", "name": "R", "fields": [{"name": "y", "type": ["null", avro]}]},
    }
    topic = load_topic_schema(schema_file(tmp_path, {"name": "x", "type": nested}))
    assert topic.arrow.field("x").type == pa.list_(pa.struct([("y", arrow)]))


@pytest.mark.parametrize(
    ("avro", "message"),
    [
        ({"type": "bytes", "logicalType": "decimal"}, "a decimal with no precision"),
        ({"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 5}, "scale 5"),
        ({"type": "bytes", "logicalType": "decimal", "precision": 77}, "from 1 to 76"),
        (
            {"type": "fixed", "name": "F", "size": 4, "logicalType": "decimal", "precision": 10},
            "from 1 to 9",
        ),
    ],
)
def test_an_invalid_decimal_is_refused_naming_file_field_and_fix(tmp_path, avro, message):
    path = schema_file(tmp_path, {"name": "price", "type": ["null", avro]})
    with pytest.raises(SchemaError) as err:
        load_topic_schema(path)
    text = str(err.value)
    assert str(path) in text and "field `price`" in text and message in text
    assert "declare an integer precision" in text


def test_an_array_of_items_that_take_no_bytes_is_refused(tmp_path):
    # Such an array is a memory bomb: a few bytes can claim billions of items.
    path = schema_file(tmp_path, {"name": "xs", "type": {"type": "array", "items": "null"}})
    with pytest.raises(SchemaError, match=r"field `xs`: an array of \"null\" takes no bytes"):
        load_topic_schema(path)
    empty = {"type": "record", "name": "E", "fields": []}
    path = schema_file(tmp_path, {"name": "xs", "type": {"type": "array", "items": empty}})
    with pytest.raises(SchemaError, match="takes no bytes per item"):
        load_topic_schema(path)


def test_defaults_are_checked_and_a_decimal_default_is_read_as_avro_bytes(tmp_path):
    decimal = {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2}
    # Avro writes a bytes default as code points 0-255: "\u0004\u00d2" is 1234.
    topic = load_topic_schema(
        schema_file(tmp_path, {"name": "price", "type": decimal, "default": "\u0004\u00d2"})
    )
    assert topic.defaults == {"price": Decimal("12.34")}
    path = schema_file(tmp_path, {"name": "n", "type": "int", "default": "seven"})
    with pytest.raises(
        SchemaError, match=r"field `n`: default \"seven\" is not a value of its type"
    ):
        load_topic_schema(path)


def test_what_a_table_format_cannot_hold_is_refused_with_the_fix(tmp_path):
    local = {"name": "seen", "type": {"type": "long", "logicalType": "local-timestamp-millis"}}
    wide = {"name": "big", "type": {"type": "bytes", "logicalType": "decimal", "precision": 50}}
    path = schema_file(tmp_path, local, wide)

    with pytest.raises(SchemaError) as err:
        load_pipeline_schema(pipeline(path).schemas())
    text = str(err.value)
    assert text.startswith(f"{path}: ")
    assert "field `seen` is a local timestamp" in text and "timestampNtz" in text
    assert "field `big` is decimal(50, 0), but Delta decimals hold at most 38 digits" in text

    # Plain Parquet files hold both; a metastore cannot declare the wide decimal.
    topic = load_pipeline_schema(pipeline(path, table_format="parquet").schemas())
    assert topic.arrow.field("big").type == pa.decimal256(50, 0)
    registered = pipeline(
        path, table_format="parquet", metastore={"uri": "thrift://127.0.0.1:9083"}
    )
    with pytest.raises(SchemaError, match="but Hive and Trino decimals hold at most 38 digits"):
        load_pipeline_schema(registered.schemas())


def test_a_map_field_is_refused_for_json_but_read_from_avro(tmp_path):
    attrs = {
        "name": "ctx",
        "type": {
            "type": "record",
            "name": "C",
            "fields": [{"name": "attrs", "type": {"type": "map", "values": "string"}}],
        },
    }
    path = schema_file(tmp_path, attrs)
    with pytest.raises(SchemaError, match=r"field `ctx.attrs` is a map, and JSON objects cannot"):
        load_pipeline_schema(pipeline(path).schemas())
    topic = load_pipeline_schema(pipeline(path, format="avro").schemas())
    assert pa.types.is_map(topic.arrow.field("ctx").type.field("attrs").type)


# The Trino types are those of a plain Parquet table's DDL, for Trino's Hive connector,
# which reads every timestamp at milliseconds (its default `hive.timestamp-precision`).
SQL_TYPES = [
    (pa.decimal128(10, 2), "decimal(10,2)", "decimal(10, 2)"),
    (pa.decimal128(38, 0), "decimal(38,0)", "decimal(38, 0)"),
    (pa.date32(), "date", "date"),
    (pa.timestamp("ms", tz="UTC"), "timestamp", "timestamp(3)"),
    (pa.timestamp("us", tz="UTC"), "timestamp", "timestamp(3)"),
    (pa.timestamp("ms"), "timestamp", "timestamp(3)"),
    (pa.timestamp("us"), "timestamp", "timestamp(3)"),
    (pa.int32(), "int", "integer"),  # time-millis
    (pa.int64(), "bigint", "bigint"),  # time-micros
    (pa.string(), "string", "varchar"),  # uuid
    (
        pa.list_(pa.struct([("price", pa.decimal128(6, 2)), ("at", pa.timestamp("ms", tz="UTC"))])),
        "array<struct<price:decimal(6,2),at:timestamp>>",
        'array(row("price" decimal(6, 2), "at" timestamp(3)))',
    ),
    (
        pa.map_(pa.string(), pa.date32()),
        "map<string,date>",
        "map(varchar, date)",
    ),
]


@pytest.mark.parametrize(
    ("arrow", "hive", "in_trino"), SQL_TYPES, ids=[str(t[0]) for t in SQL_TYPES]
)
def test_metastore_and_trino_types_of_every_decoded_column(arrow, hive, in_trino):
    assert hive_type(arrow) == hive
    assert trino_type(arrow) == in_trino


def test_a_decimal_above_38_digits_has_no_hive_or_trino_type():
    with pytest.raises(MetastoreError, match="Hive decimals hold at most 38 digits"):
        hive_type(pa.decimal256(39, 2))
    with pytest.raises(ValueError, match="Trino decimals hold at most 38 digits"):
        trino_type(pa.decimal256(39, 2))


# Schema evolution: the changes a table can take from one batch to the next.

BEFORE = [["page", "string"], ["user_id", "int64"], ["dt", "string"]]


def test_an_added_optional_field_is_the_compatible_change():
    after = pa.schema([("page", pa.string()), ("user_id", pa.int64()), ("dt", pa.string())])
    assert schema_changes(BEFORE, after, ()) == ([], [])
    grown = after.append(pa.field("country", pa.string()))
    assert schema_changes(BEFORE, grown, ()) == (["country"], [])


@pytest.mark.parametrize(
    ("after", "required", "problem"),
    [
        (
            pa.schema([("page", pa.string()), ("dt", pa.string())]),
            (),
            "field `user_id` (int64) was removed",
        ),
        (
            pa.schema([("page", pa.string()), ("user_id", pa.string()), ("dt", pa.string())]),
            (),
            "field `user_id` changed type from int64 to string",
        ),
        (
            pa.schema(
                [("page", pa.string()), ("user_id", pa.int64()), ("dt", pa.string()), ("c", "i8")]
            ),
            ("c",),
            "new field `c` is required, but the rows already in the table have no value",
        ),
        (
            pa.schema(
                [("page", pa.string()), ("user_id", pa.int64()), ("dt", pa.string()), ("hr", "i8")]
            ),
            (),
            "the partitioning changed (column hr)",
        ),
    ],
)
def test_incompatible_changes_are_named_with_their_fix(after, required, problem):
    _, problems = schema_changes(BEFORE, after, required)
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_a_default_null_on_a_field_that_cannot_be_null_fails_at_load(tmp_path):
    path = tmp_path / "bad.avsc"
    path.write_text(
        json.dumps(
            {
                "type": "record",
                "name": "R",
                "fields": [{"name": "country", "type": "string", "default": None}],
            }
        )
    )
    with pytest.raises(SchemaError, match=r"field 'country' has default null but its type"):
        load_topic_schema(path)


# Field names, as Hive, Trino and Delta compare them: without case.


def _optional(name: str, kind: object = "string") -> dict:
    return {"name": name, "type": ["null", kind], "default": None}


def _records_of(name: str, *inner: str) -> dict:
    record = {"type": "record", "name": "R", "fields": [_optional(n) for n in inner]}
    return {"name": name, "type": {"type": "array", "items": record}}


CLASHES = [
    (
        "the event-time partition columns in another case",
        [_optional("DT"), _optional("Hr")],
        [
            "field `DT` is the event-time partition column `dt`",
            "field `Hr` is the event-time partition column `hr`",
            "(Hive, Trino and Delta compare column names without case)",
        ],
    ),
    ("a partition column's own name", [_optional("dt")], ["field `dt` is the event-time"]),
    ("one of Strata's own columns", [_optional("_Key")], ["field `_Key` starts with '_'"]),
    (
        "two fields differing in case only",
        [_optional("user"), _optional("User")],
        ["fields `user` and `User` are one column", "compare column names without case"],
    ),
    (
        "two fields of a nested record",
        [_records_of("items", "Sku", "sku")],
        ["fields `items.Sku` and `items.sku` are one column"],
    ),
]


@pytest.mark.parametrize(
    ("fields", "phrases"), [c[1:] for c in CLASHES], ids=[c[0] for c in CLASHES]
)
def test_a_field_name_the_tables_cannot_hold_is_refused_naming_the_field_and_the_fix(
    tmp_path, fields, phrases
):
    path = schema_file(tmp_path, *fields)
    with pytest.raises(SchemaError) as err:
        load_topic_schema(path)
    text = str(err.value)
    assert text.startswith(f"{path}: field")
    assert all(phrase in text for phrase in phrases), text
    assert text.endswith(
        "rename the field in the schema file (Avro messages are read by field position, and a "
        'writer schema that still uses the old name resolves through the field\'s "aliases": '
        "list the old name there; JSON messages are read by field name, so producers must send "
        "the new one)"
    )


def test_a_schema_read_with_at_run_time_is_held_to_the_same_names(tmp_path):
    # A plan's schema, or one the table evolved to, comes after the configuration loaded.
    cfg = pipeline(
        schema_file(tmp_path, _optional("page")),
        partitioning={"field": {"name": "page", "values": ["home"]}},
    )
    later = json.loads(cfg.schema_text)
    later["fields"] += [_optional("P_Page"), _optional("Hr")]
    with pytest.raises(SchemaError) as err:
        load_pipeline_schema(cfg.with_schema_text(json.dumps(later)).schemas())
    text = str(err.value)
    assert "field `Hr` is the event-time partition column `hr`" in text
    assert "field `P_Page` is the partition column `p_page`" in text


def test_names_near_the_tables_own_columns_are_fields_like_any_other(tmp_path):
    near = [_optional("DT_local"), _optional("hour"), _optional("Date"), _optional("p_page")]
    # Inside a record a name is a struct field's, not a column of the table.
    nested = {
        "name": "ctx",
        "type": {"type": "record", "name": "C", "fields": [_optional("_id"), _optional("dt")]},
    }
    topic = load_topic_schema(schema_file(tmp_path, *near, nested))
    assert topic.arrow.names == ["ts", "DT_local", "hour", "Date", "p_page", "ctx"]
    assert topic.arrow.field("ctx").type == pa.struct([("_id", pa.string()), ("dt", pa.string())])


def test_a_registered_field_named_as_a_column_in_another_case_is_left_out():
    table = {"type": "record", "name": "T", "fields": [{"name": "ts", "type": "long"}]}
    newest = {**table, "fields": [*table["fields"], _optional("DT"), _optional("TS")]}
    newest["fields"].append(_optional("campaign"))
    merged, left_out = merged_fields(table, newest, partition_column="p_page")
    assert [f["name"] for f in merged["fields"]] == ["ts", "campaign"]
    assert [item.field for item in left_out] == ["DT", "TS"]
    assert "Strata keeps for its own columns" in left_out[0].why
    assert "differs only in case from the table's field `ts`" in left_out[1].why
    assert all("rename it in the subject's schema" in item.why for item in left_out)
