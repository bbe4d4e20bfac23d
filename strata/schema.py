"""Avro schemas, and the Arrow schemas of the tables Strata writes.

Every topic is described by an Avro schema in `schemas/`. JSON messages are checked
and coerced against the same schema, so both formats land in the same typed columns.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from strata.config import PipelineConfig

# Kafka coordinates carried by every data, raw and quarantine row.
COORDINATES = pa.schema(
    [
        pa.field("_topic", pa.string(), nullable=False),
        pa.field("_partition", pa.int32(), nullable=False),
        pa.field("_offset", pa.int64(), nullable=False),
        pa.field("_kafka_ts", pa.timestamp("ms", tz="UTC")),
        pa.field("_key", pa.binary()),
    ]
)
HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

RAW_SCHEMA = pa.schema(
    list(COORDINATES)
    + [
        pa.field("_value", pa.binary()),
        pa.field("_headers", HEADERS_TYPE),
        pa.field("_batch", pa.int64(), nullable=False),
    ]
)
QUARANTINE_SCHEMA = pa.schema(list(RAW_SCHEMA) + [pa.field("reason", pa.string(), nullable=False)])

_PRIMITIVES: dict[str, pa.DataType] = {
    "null": pa.null(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}


class SchemaError(Exception):
    """An Avro schema cannot be turned into table columns."""


@dataclass(frozen=True)
class TopicSchema:
    """A topic's Avro schema, its Arrow form, and the fields a record must have.

    Attributes:
        avro: The parsed Avro schema (a record).
        arrow: The Arrow schema of the decoded columns.
        required: Fields that are not nullable and have no default.
        defaults: Defaults of non-nullable fields, filled when JSON omits them.
    """

    avro: dict[str, Any]
    arrow: pa.Schema
    required: tuple[str, ...]
    defaults: dict[str, Any]


def load_topic_schema(path: Path) -> TopicSchema:
    """Read an Avro schema file and derive its Arrow schema.

    Args:
        path: An `.avsc` file holding one record schema.

    Returns:
        The topic schema.

    Raises:
        SchemaError: If the file is not a record schema Strata can map to columns.
    """
    try:
        avro = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SchemaError(f"{path}: cannot read the Avro schema ({exc})") from exc
    if not isinstance(avro, dict) or avro.get("type") != "record":
        raise SchemaError(f"{path}: the top-level schema must be an Avro record")
    fields = []
    required = []
    defaults = {}
    for f in avro.get("fields", []):
        name = f["name"]
        if name.startswith("_") or name in ("dt", "hr"):
            raise SchemaError(
                f"{path}: field {name!r} collides with Strata's own columns "
                "(names starting with '_', 'dt', 'hr'); rename it"
            )
        arrow_type, nullable = _arrow_type(f["type"], path)
        fields.append(pa.field(name, arrow_type, nullable=True))
        if not nullable:
            if "default" in f and f["default"] is None:
                raise SchemaError(
                    f"{path}: field {name!r} has default null but its type does not allow "
                    'null; declare it as ["null", ...] or give a default of its type'
                )
            if "default" in f:
                defaults[name] = f["default"]
            else:
                required.append(name)
    return TopicSchema(avro, pa.schema(fields), tuple(required), defaults)


def _arrow_type(avro_type: Any, path: Path) -> tuple[pa.DataType, bool]:  # noqa: ANN401
    """Map an Avro type to (Arrow type, nullable)."""
    if isinstance(avro_type, list):
        branches = [t for t in avro_type if t != "null"]
        if len(branches) != 1:
            raise SchemaError(f"{path}: unions other than [null, T] are not supported: {avro_type}")
        inner, _ = _arrow_type(branches[0], path)
        return inner, True
    if isinstance(avro_type, str):
        if avro_type in _PRIMITIVES:
            return _PRIMITIVES[avro_type], avro_type == "null"
        raise SchemaError(f"{path}: named type references ({avro_type!r}) are not supported")
    kind = avro_type.get("type")
    logical = avro_type.get("logicalType")
    if logical == "timestamp-millis":
        return pa.timestamp("ms", tz="UTC"), False
    if logical == "timestamp-micros":
        return pa.timestamp("us", tz="UTC"), False
    if logical == "date":
        return pa.date32(), False
    if kind == "record":
        children = [
            pa.field(c["name"], _arrow_type(c["type"], path)[0]) for c in avro_type["fields"]
        ]
        return pa.struct(children), False
    if kind == "array":
        return pa.list_(_arrow_type(avro_type["items"], path)[0]), False
    if kind == "map":
        return pa.map_(pa.string(), _arrow_type(avro_type["values"], path)[0]), False
    if kind == "enum":
        return pa.string(), False
    if kind == "fixed":
        return pa.binary(), False
    if isinstance(kind, str) and kind in _PRIMITIVES:
        return _PRIMITIVES[kind], kind == "null"
    raise SchemaError(f"{path}: unsupported Avro type {avro_type!r}")


def data_schema(topic: TopicSchema, partitioning: str) -> pa.Schema:
    """The data table's schema: the record's columns, event time, coordinates, partitions.

    Args:
        topic: The topic schema.
        partitioning: `dt` or `dt_hr`.

    Returns:
        The full schema, partition columns last.
    """
    fields = list(topic.arrow)
    fields.append(pa.field("_event_time", pa.timestamp("us", tz="UTC")))
    fields.extend(COORDINATES)
    fields.append(pa.field("_batch", pa.int64(), nullable=False))
    fields.extend(pa.field(c, pa.string(), nullable=False) for c in partition_columns(partitioning))
    return pa.schema(fields)


# Each table's name is the pipeline's name plus its suffix (in storage and metastore).
TABLE_SUFFIXES = {"table": "", "raw": "_raw", "quarantine": "_quarantine", "ledger": "_ledger"}


def table_layout(cfg: PipelineConfig, which: str) -> tuple[pa.Schema, list[str]]:
    """Schema and partition columns of one of a pipeline's tables.

    Args:
        cfg: The pipeline configuration.
        which: `table`, `raw` or `quarantine`.

    Returns:
        The table's Arrow schema and its partition columns.
    """
    if which == "table":
        topic = load_topic_schema(cfg.schema_path)
        return data_schema(topic, cfg.partitioning), partition_columns(cfg.partitioning)
    return (RAW_SCHEMA if which == "raw" else QUARANTINE_SCHEMA), []


def partition_columns(partitioning: str) -> list[str]:
    """Event-time partition columns for a partitioning setting."""
    return ["dt", "hr"] if partitioning == "dt_hr" else ["dt"]


def column_signature(schema: pa.Schema) -> list[list[str]]:
    """A table's columns as `[name, type]` pairs, as the ledger records them per batch."""
    return [[f.name, str(f.type)] for f in schema]


def schema_changes(
    before: list[list[str]], after: pa.Schema, required: Collection[str]
) -> tuple[list[str], list[str]]:
    """Compare the columns the table was last written with to the current schema's.

    A field added as optional is the one change a table takes without rewriting its
    files: old rows read it as null. Anything else would leave old files unreadable
    or wrong under the new schema.

    Args:
        before: Column signature recorded with the last committed batch.
        after: The data table's schema under the current Avro schema.
        required: Fields the current schema requires (not nullable, no default).

    Returns:
        The names of the added columns, and a sentence per incompatible change.
    """
    old = {name: kind for name, kind in before}
    new = {f.name: str(f.type) for f in after}
    problems = []
    moved = sorted((set(old) ^ set(new)) & {"dt", "hr"})
    if moved:
        problems.append(
            f"the partitioning changed (column {', '.join(moved)}), but a table keeps the "
            "partitioning it was created with; restore `partitioning`, or point the pipeline "
            "at new tables"
        )
        for name in moved:
            old.pop(name, None)
            new.pop(name, None)
    for name, kind in old.items():
        if name not in new:
            problems.append(
                f"field `{name}` ({kind}) was removed, but the table's rows hold it and a table "
                f'never drops a column; keep the field, as ["null", ...] with "default": null'
            )
        elif new[name] != kind:
            problems.append(
                f"field `{name}` changed type from {kind} to {new[name]}, but the table's files "
                "hold the old type; keep the type, or put the new values in a new field"
            )
    added = [name for name in new if name not in old]
    for name in added:
        if name in required:
            problems.append(
                f"new field `{name}` is required, but the rows already in the table have no "
                f'value for it; declare it optional: ["null", ...] with "default": null'
            )
    return added, problems
