"""Avro schemas, and the Arrow schemas of the tables Strata writes.

Every topic is described by an Avro schema in `schemas/`. JSON messages are checked
and coerced against the same schema, so both formats land in the same typed columns.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from strata.errors import SchemaError
from strata.schema.names import TIME_COLUMNS, name_clashes
from strata.store.places import NAME_SUFFIXES

if TYPE_CHECKING:
    from strata.config import MetastoreTable, PartitioningConfig, SchemaSpec, TableName

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
        # Why the Kafka client could not read the message whole (its headers), if it
        # could not: kept so a replay or a resume from the raw copy decides as the
        # read did.
        pa.field("_read_error", pa.string()),
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

# Logical types that get a column type of their own, by (underlying type, logicalType).
# Any other pair (an unknown logical type, or a known one on the wrong underlying
# type) is read as its underlying type, as the Avro specification says. Times of day
# stay integers (milliseconds or microseconds since midnight), as Spark's Avro reader
# lands them: neither Delta, Hive nor Spark has a column type for a time of day.
_LOGICAL: dict[tuple[str, str], pa.DataType] = {
    ("int", "date"): pa.date32(),
    ("int", "time-millis"): pa.int32(),
    ("long", "time-micros"): pa.int64(),
    ("long", "timestamp-millis"): pa.timestamp("ms", tz="UTC"),
    ("long", "timestamp-micros"): pa.timestamp("us", tz="UTC"),
    ("long", "local-timestamp-millis"): pa.timestamp("ms"),
    ("long", "local-timestamp-micros"): pa.timestamp("us"),
    ("string", "uuid"): pa.string(),
}
# Decimals are decimal128 or decimal256, by their precision.
_DECIMALS = {("bytes", "decimal"), ("fixed", "decimal")}
# Arrow's decimal256 holds 76 digits; Delta, Hive, Trino and Spark hold 38.
_MAX_DECIMAL_DIGITS = 76
_MAX_SQL_DECIMAL_DIGITS = 38


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


def load_topic_schema(
    path: Path, text: str | None = None, partition_columns: Collection[str] = ()
) -> TopicSchema:
    """Read an Avro schema file and derive its Arrow schema.

    Args:
        path: An `.avsc` file holding one record schema (named in errors).
        text: The file's content, when already read; the file is read otherwise.
        partition_columns: The data table's partition columns, which no field may be
            named in any case (`name_clashes`); `dt` and `hr` are refused anyway.

    Returns:
        The topic schema.

    Raises:
        SchemaError: If the file is not a record schema Strata can map to columns, or a
            field's name is one the tables cannot hold (`name_clashes`).
    """
    try:
        avro = json.loads(path.read_text() if text is None else text)
    except (OSError, json.JSONDecodeError) as exc:
        raise SchemaError(f"{path}: cannot read the Avro schema ({exc})") from exc
    if not isinstance(avro, dict) or avro.get("type") != "record":
        raise SchemaError(f"{path}: the top-level schema must be an Avro record")
    clashes = name_clashes(avro, partition_columns)
    if clashes:
        raise SchemaError(f"{path}: {clashes}")
    fields = []
    required = []
    defaults = {}
    for f in avro.get("fields", []):
        name = f["name"]
        arrow_type, nullable = _arrow_type(f["type"], path, name)
        fields.append(pa.field(name, arrow_type, nullable=True))
        if not nullable:
            if "default" in f and f["default"] is None:
                raise SchemaError(
                    f"{path}: field {name!r} has default null but its type does not allow "
                    'null; declare it as ["null", ...] or give a default of its type'
                )
            if "default" in f:
                defaults[name] = _default_value(f, arrow_type, path)
            else:
                required.append(name)
    return TopicSchema(avro, pa.schema(fields), tuple(required), defaults)


def _default_value(f: dict[str, Any], arrow_type: pa.DataType, path: Path) -> Any:  # noqa: ANN401
    """A field's default as a value of its column, checked now rather than in every task."""
    value = f["default"]
    avro_type = non_null(f["type"])
    if logical_type(avro_type) == "decimal" and isinstance(value, str):
        # Avro writes a bytes default as a string of code points 0-255.
        _, scale = decimal_digits(avro_type)
        unscaled = int.from_bytes(value.encode("latin-1", "replace"), "big", signed=True)
        value = Decimal(f"{unscaled}E-{scale}")
    try:
        pa.scalar(value, type=arrow_type)
    except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
        raise SchemaError(
            f"{path}: field `{f['name']}`: default {json.dumps(f['default'])} is not a value "
            f"of its type ({exc}); give a default of the field's type"
        ) from exc
    return value


def non_null(avro_type: Any) -> Any:  # noqa: ANN401 - Avro schemas are JSON
    """The branch of a `["null", T]` union that is not null; any other type as it is."""
    if isinstance(avro_type, list):
        branches = [t for t in avro_type if t != "null"]
        if len(branches) == 1:
            return branches[0]
    return avro_type


def logical_type(avro_type: Any) -> str | None:  # noqa: ANN401 - Avro schemas are JSON
    """The logical type of an Avro type, if Strata gives it a column type of its own.

    Args:
        avro_type: An Avro type (not a union).

    Returns:
        The logical type's name (`decimal`, `date`, `timestamp-millis`, ...), or None
        when the type is read as its underlying type.
    """
    if not isinstance(avro_type, dict):
        return None
    logical = avro_type.get("logicalType")
    key = (avro_type.get("type"), logical)
    return logical if key in _LOGICAL or key in _DECIMALS else None


def decimal_digits(avro_type: dict[str, Any]) -> tuple[int, int]:
    """Precision and scale of a decimal logical type, as declared."""
    return avro_type.get("precision", 0), avro_type.get("scale", 0)


def _arrow_type(avro_type: Any, path: Path, name: str) -> tuple[pa.DataType, bool]:  # noqa: ANN401
    """Map an Avro type to (Arrow type, nullable); `name` is the field's dotted path."""
    if isinstance(avro_type, list):
        branches = [t for t in avro_type if t != "null"]
        if len(branches) != 1:
            raise SchemaError(
                f"{path}: field `{name}`: unions other than [null, T] are not supported: "
                f"{avro_type}; split the alternatives into separate optional fields"
            )
        inner, _ = _arrow_type(branches[0], path, name)
        return inner, True
    if isinstance(avro_type, str):
        if avro_type in _PRIMITIVES:
            return _PRIMITIVES[avro_type], avro_type == "null"
        raise SchemaError(
            f"{path}: field `{name}`: named type references ({avro_type!r}) are not "
            "supported; write the type out where it is used"
        )
    if not isinstance(avro_type, dict):
        raise SchemaError(f"{path}: field `{name}`: unsupported Avro type {avro_type!r}")
    kind = avro_type.get("type")
    logical = logical_type(avro_type)
    if logical == "decimal":
        return _decimal_type(avro_type, path, name), False
    if logical is not None:
        return _LOGICAL[(str(kind), logical)], False
    if kind == "record":
        children = [
            pa.field(c["name"], _arrow_type(c["type"], path, f"{name}.{c['name']}")[0])
            for c in avro_type["fields"]
        ]
        return pa.struct(children), False
    if kind == "array":
        items = avro_type["items"]
        if _encodes_in_no_bytes(items):
            raise SchemaError(
                f"{path}: field `{name}`: an array of {json.dumps(items)} takes no bytes per "
                "item, so a message of a few bytes can claim billions of items; give the "
                "items a type that carries a value"
            )
        return pa.list_(_arrow_type(items, path, f"{name}[]")[0]), False
    if kind == "map":
        return pa.map_(pa.string(), _arrow_type(avro_type["values"], path, f"{name}{{}}")[0]), False
    if kind == "enum":
        return pa.string(), False
    if kind == "fixed":
        return pa.binary(), False
    if isinstance(kind, str) and kind in _PRIMITIVES:
        return _PRIMITIVES[kind], kind == "null"
    raise SchemaError(f"{path}: field `{name}`: unsupported Avro type {avro_type!r}")


def _decimal_type(avro_type: dict[str, Any], path: Path, name: str) -> pa.DataType:
    precision, scale = decimal_digits(avro_type)
    # The largest precision a fixed of `size` bytes holds in two's complement.
    room = _MAX_DECIMAL_DIGITS
    if avro_type.get("type") == "fixed" and isinstance(avro_type.get("size"), int):
        room = min(room, len(str(2 ** (8 * avro_type["size"] - 1) - 1)) - 1)
    valid = (
        isinstance(precision, int)
        and isinstance(scale, int)
        and 1 <= precision <= room
        and 0 <= scale <= precision
    )
    if not valid:
        declared = (
            f"precision {precision!r} and scale {scale!r}"
            if "precision" in avro_type
            else "no precision"
        )
        raise SchemaError(
            f"{path}: field `{name}`: a decimal with {declared} is not valid here; declare "
            f"an integer precision from 1 to {room} (what the type can hold) and a scale "
            "from 0 to the precision"
        )
    if precision > _MAX_SQL_DECIMAL_DIGITS:
        return pa.decimal256(precision, scale)
    return pa.decimal128(precision, scale)


def _encodes_in_no_bytes(avro_type: Any) -> bool:  # noqa: ANN401 - Avro schemas are JSON
    """Whether a value of the type is written as zero bytes (Avro `null`, empty `fixed`...)."""
    if avro_type == "null":
        return True
    if not isinstance(avro_type, dict):
        return False
    kind = avro_type.get("type")
    if kind == "null":
        return True
    if kind == "fixed":
        return avro_type.get("size") == 0
    if kind == "record":
        return all(_encodes_in_no_bytes(f.get("type")) for f in avro_type.get("fields", []))
    return False


def load_pipeline_schema(spec: SchemaSpec) -> TopicSchema:
    """A pipeline's topic schema, refused if its formats cannot hold one of its fields.

    On top of `load_topic_schema`, this checks what depends on the pipeline: no field
    may be named as one of its partition columns, in any case; Arrow's JSON reader
    cannot read an object into a map column; Delta tables have no column
    for a timestamp without time zone (short of a table feature Strata's plain tables
    leave off) nor for decimals above 38 digits; Hive's decimals stop at 38 digits.

    Args:
        spec: The schema and what it is held in (`PipelineConfig.schemas`).

    Returns:
        The topic schema.

    Raises:
        SchemaError: Naming the file, each field that cannot be held, and the fix.
    """
    topic = load_topic_schema(spec.path, spec.text, partition_columns(spec.partitioning))
    problems: list[str] = []
    for f in topic.arrow:
        problems.extend(_format_problems(f.type, f.name, spec))
    if problems:
        raise SchemaError(f"{spec.path}: " + "; ".join(problems))
    return topic


def _format_problems(kind: pa.DataType, name: str, spec: SchemaSpec) -> list[str]:
    if pa.types.is_struct(kind):
        return [
            p
            for i in range(kind.num_fields)
            for p in _format_problems(kind.field(i).type, f"{name}.{kind.field(i).name}", spec)
        ]
    if pa.types.is_map(kind):
        inner = _format_problems(kind.item_type, f"{name}{{}}", spec)
        if spec.format == "json":
            inner.insert(
                0,
                f"field `{name}` is a map, and JSON objects cannot be read into a map column; "
                "declare it as a record with the keys producers send, or use format avro",
            )
        return inner
    if pa.types.is_list(kind):
        return _format_problems(kind.value_type, f"{name}[]", spec)
    if spec.table_format == "delta" and pa.types.is_timestamp(kind) and kind.tz is None:
        return [
            f"field `{name}` is a local timestamp (no time zone), which a Delta table holds "
            "only with the timestampNtz table feature that Strata's plain Delta tables leave "
            "off; use timestamp-millis or timestamp-micros (UTC instants), or "
            "table_format: parquet"
        ]
    if pa.types.is_decimal(kind) and kind.precision > _MAX_SQL_DECIMAL_DIGITS:
        if spec.table_format == "delta":
            return [
                f"field `{name}` is decimal({kind.precision}, {kind.scale}), but Delta "
                f"decimals hold at most {_MAX_SQL_DECIMAL_DIGITS} digits; lower the precision, "
                "or use table_format: parquet"
            ]
        if spec.registered:
            return [
                f"field `{name}` is decimal({kind.precision}, {kind.scale}), but Hive and "
                f"Trino decimals hold at most {_MAX_SQL_DECIMAL_DIGITS} digits; lower the "
                "precision, or land the table without metastore.uri"
            ]
    return []


def data_schema(topic: TopicSchema, partitioning: PartitioningConfig) -> pa.Schema:
    """The data table's schema: the record's columns, event time, coordinates, partitions.

    What a partition column means beyond its name (the zone of `dt` and `hr`, the field
    and values of a field partition) rides in the schema's metadata, so the column
    signature the ledger records tells a change of it apart (see `schema_changes`).

    Args:
        topic: The topic schema.
        partitioning: The pipeline's partitioning.

    Returns:
        The full schema, partition columns last.
    """
    fields = list(topic.arrow)
    fields.append(pa.field("_event_time", pa.timestamp("us", tz="UTC")))
    fields.extend(COORDINATES)
    fields.append(pa.field("_batch", pa.int64(), nullable=False))
    columns = partition_columns(partitioning)
    fields.extend(pa.field(c, pa.string(), nullable=False) for c in columns)
    notes = {}
    if partitioning.timezone != "UTC":
        notes = {c: f"in {partitioning.timezone}" for c in columns if c in TIME_COLUMNS}
    if partitioning.field is not None:
        spec = partitioning.field
        notes[spec.column] = f"from field {spec.name}: {', '.join(spec.values)}; other {spec.other}"
    metadata = {_PARTITION_NOTES: json.dumps(notes, sort_keys=True)} if notes else None
    return pa.schema(fields, metadata=metadata)


# Each table's name is the pipeline's name plus its suffix (in storage and metastore).
TABLE_SUFFIXES: dict[MetastoreTable, str] = {
    which: NAME_SUFFIXES[which] for which in ("table", "raw", "quarantine", "ledger")
}


def table_layout(spec: SchemaSpec, which: TableName) -> tuple[pa.Schema, list[str]]:
    """Schema and partition columns of one of a pipeline's tables.

    Args:
        spec: The schema and what it is held in (`PipelineConfig.schemas`).
        which: `table`, `raw` or `quarantine`.

    Returns:
        The table's Arrow schema and its partition columns.
    """
    if which == "table":
        topic = load_pipeline_schema(spec)
        return data_schema(topic, spec.partitioning), partition_columns(spec.partitioning)
    return (RAW_SCHEMA if which == "raw" else QUARANTINE_SCHEMA), []


def partition_columns(partitioning: PartitioningConfig) -> list[str]:
    """The data table's partition columns: `dt`, `hr` if hourly, a field partition's."""
    columns = ["dt", "hr"] if partitioning.by == "dt_hr" else ["dt"]
    if partitioning.field is not None:
        columns.append(partitioning.field.column)
    return columns


# Schema metadata: per partition column, what it means beyond its name (JSON).
_PARTITION_NOTES = "strata.partitions"


def _partition_notes(schema: pa.Schema) -> dict[str, str]:
    raw = (schema.metadata or {}).get(_PARTITION_NOTES.encode())
    return {} if raw is None else dict(json.loads(raw))


def column_signature(schema: pa.Schema) -> list[list[str]]:
    """A table's columns as `[name, type]` pairs, as the ledger records them per batch.

    A partition column whose values mean more than UTC event time carries a third
    item saying what (`in Europe/Berlin`, `from field country: DE, FR; other __other__`);
    plain UTC `dt` and `hr` have none, as before zones and fields.
    """
    notes = _partition_notes(schema)
    return [[f.name, str(f.type), *([notes[f.name]] if f.name in notes else [])] for f in schema]


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
    old = {entry[0]: entry[1] for entry in before}
    new = {f.name: str(f.type) for f in after}
    old_notes = {entry[0]: entry[2] for entry in before if len(entry) > 2}
    new_notes = _partition_notes(after)
    partitions = set(TIME_COLUMNS) | set(old_notes) | set(new_notes)
    problems = []
    moved = []
    for name in sorted((set(old) | set(new)) & partitions):
        if (name in old) != (name in new):
            moved.append(f"column {name}")
        elif old_notes.get(name) != new_notes.get(name):
            # Only `dt` and `hr` go without a note: UTC, as before zones.
            was, now = old_notes.get(name, "in UTC"), new_notes.get(name, "in UTC")
            moved.append(f"column {name} was {was}, is now {now}")
        else:
            continue
        old.pop(name, None)
        new.pop(name, None)
    if moved:
        problems.append(
            f"the partitioning changed ({'; '.join(moved)}), but a table keeps the "
            "partitioning it was created with; restore `partitioning`, or point the pipeline "
            "at new tables"
        )
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


def without_logical_types(avro_type: Any) -> Any:  # noqa: ANN401 - Avro schemas are JSON
    """The schema with every logicalType removed, so fastavro returns the raw values.

    fastavro's own conversions are not used: its decimal reader rounds an unscaled
    value with more digits than the precision instead of refusing it.
    """
    if isinstance(avro_type, list):
        return [without_logical_types(t) for t in avro_type]
    if isinstance(avro_type, dict):
        return {
            k: without_logical_types(v) if k in ("type", "items", "values", "fields") else v
            for k, v in avro_type.items()
            if k != "logicalType"
        }
    return avro_type
