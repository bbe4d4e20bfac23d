"""Decode raw Kafka messages into typed rows, and quarantine what cannot be trusted.

Pure functions: Arrow in, Arrow out, no I/O. A message lands either as a row of the
data table or as a row of the quarantine table with its reason and raw bytes, never
neither, whatever its bytes: no value a producer sends may make decoding raise,
because a batch's plan is saved and resumed, and a message that crashes a task
would fail its batch on every re-run. Every check is deterministic for a given
message (the future-skew and lateness checks are against the message's own Kafka
timestamp, not the clock), so a re-run of a batch routes every message exactly as
the first run did.

The clean path stays in Arrow: a chunk is validated and parsed in bulk, and only
when a check fails does Python look at the messages one by one to say why.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from strata.config import PartitioningConfig, PipelineConfig
from strata.durations import human_duration
from strata.errors import SchemaError
from strata.schema.avro import (
    QUARANTINE_SCHEMA,
    TopicSchema,
    data_schema,
    decimal_digits,
    load_pipeline_schema,
    logical_type,
    non_null,
    without_logical_types,
)
from strata.schema.partitions import event_partitions, field_partitions, floor_divide
from strata.schema.registry import WriterSchema, WriterSchemas

_US_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": 0}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The instants every reader of the tables can represent (Python, Spark, Trino, Delta
# statistics): 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z, in epoch microseconds.
_MIN_US = -62_135_596_800_000_000
_MAX_US = 253_402_300_799_000_000
# Kafka timestamps are clamped to this many epoch milliseconds (about year 33,000)
# before any arithmetic, so that a producer-set timestamp cannot overflow int64; an
# event time is within years 1-9999, so no comparison changes.
_KAFKA_CLAMP_MS = 10**15
_JSON_BLOCK = 8 << 20
# Quarantine reasons quote values; a hostile value must not make them huge.
_QUOTE_CHARS = 80

# Range of each logical type's underlying number, and how to say it.
_RANGES: dict[str, tuple[int, int, str]] = {
    "int": (-(2**31), 2**31 - 1, "int (32 bits)"),
    "date": (-719_162, 2_932_896, "date (days from 1970-01-01; 0001-01-01 to 9999-12-31)"),
    "time-millis": (0, 86_399_999, "time-millis (a time of day: 0 to 86399999)"),
    "time-micros": (0, 86_399_999_999, "time-micros (a time of day: 0 to 86399999999)"),
    "timestamp-millis": (
        _MIN_US // 1000,
        _MAX_US // 1000,
        "timestamp-millis (0001-01-01 to 9999-12-31T23:59:59Z)",
    ),
    "timestamp-micros": (_MIN_US, _MAX_US, "timestamp-micros (0001-01-01 to 9999-12-31T23:59:59Z)"),
    "local-timestamp-millis": (
        _MIN_US // 1000,
        _MAX_US // 1000,
        "local-timestamp-millis (0001-01-01 to 9999-12-31T23:59:59)",
    ),
    "local-timestamp-micros": (
        _MIN_US,
        _MAX_US,
        "local-timestamp-micros (0001-01-01 to 9999-12-31T23:59:59)",
    ),
}
_UUID = r"^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$"

# (position in the array checked, reason): what a check found wrong.
Findings = list[tuple[int, str]]


@dataclass(frozen=True)
class DecodeRules:
    """Everything the decoder needs, derived once from the pipeline config.

    Attributes:
        format: `json`, `avro` or `confluent_avro`.
        topic: The topic's schema.
        event_field: Name of the event-time field.
        event_unit: Unit of epoch numbers, or `iso8601`.
        timezone: Zone of ISO strings and local timestamps without an offset.
        min_valid_us: Earliest believable event time, in epoch microseconds.
        max_future_skew_ms: How far an event may lie ahead of its Kafka timestamp.
        late_after_ms: Lateness threshold for the report.
        max_lateness_ms: How far an event may trail its Kafka timestamp before it is
            quarantined; None for no bound.
        max_lateness: `event_time.max_lateness` as configured, for reasons.
        schema_id: For `confluent_avro`, the Schema Registry id messages must carry
            (without a registry), or whose messages need no registry lookup (with one).
        partitioning: The partition columns, their zone and field.
        out_schema: Schema of the decoded rows, partition columns included.
        wire_schema: What the values are read into before logical types and range
            checks apply (see `_wire_type`).
        avro_reader: For the Avro formats, the parsed schema fastavro reads with: the
            topic's schema without its logical types, which this module applies itself.
        schema_file: The schema file's name, for reasons.
        writer_schemas: For `confluent_avro` with a Schema Registry, each schema id's
            writer schema; None without a registry.
    """

    format: str
    topic: TopicSchema
    event_field: str
    event_unit: str
    timezone: str
    min_valid_us: int
    max_future_skew_ms: int
    late_after_ms: int
    max_lateness_ms: int | None
    max_lateness: str | None
    schema_id: int | None
    partitioning: PartitioningConfig
    out_schema: pa.Schema
    wire_schema: pa.Schema
    avro_reader: Any
    schema_file: str = ""
    writer_schemas: WriterSchemas | None = None

    @classmethod
    def from_config(cls, cfg: PipelineConfig) -> DecodeRules:
        """Build the rules for a pipeline.

        Args:
            cfg: The pipeline configuration.

        Returns:
            The decode rules.

        Raises:
            SchemaError: If the schema or the event-time settings cannot be decoded.
        """
        topic = load_pipeline_schema(cfg.schemas())
        et = cfg.event_time
        if et.field not in topic.arrow.names:
            raise SchemaError(
                f"{cfg.schema_path}: event_time.field {et.field!r} is not a field of the schema; "
                f"fields are {', '.join(topic.arrow.names)}"
            )
        kind = topic.arrow.field(et.field).type
        numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind)
        if et.unit == "iso8601" and not pa.types.is_string(kind):
            raise SchemaError(
                f"{cfg.schema_path}: event_time.unit is iso8601 but field {et.field!r} is {kind}; "
                "use a numeric unit (s, ms, us, ns) or make the field a string"
            )
        if et.unit != "iso8601" and not (numeric or pa.types.is_timestamp(kind)):
            raise SchemaError(
                f"{cfg.schema_path}: event_time.unit is {et.unit} but field {et.field!r} is "
                f"{kind}; use unit: iso8601 for strings"
            )
        _check_field_partition(cfg, topic)
        min_valid = datetime.fromisoformat(et.min_valid)
        if min_valid.tzinfo is None:
            min_valid = min_valid.replace(tzinfo=UTC)
        fmt = "json" if cfg.format == "json" else "avro"
        avro_reader = None
        writer_schemas = None
        if fmt == "avro":
            from fastavro import parse_schema

            avro_reader = parse_schema(without_logical_types(topic.avro))
            if cfg.format == "confluent_avro" and cfg.schema_registry.url is not None:
                writer_schemas = WriterSchemas(
                    cfg.schema_registry,
                    topic.avro,
                    avro_reader,
                    cfg.schema_file,
                    # `schema_id` is schema_file's id: a batch read with a schema the
                    # table evolved to (see `strata.schema.evolve`) asks the registry for every id.
                    cfg.schema_id if cfg.reads_schema_file else None,
                )
        return cls(
            format=cfg.format,
            topic=topic,
            event_field=et.field,
            event_unit=et.unit,
            timezone=et.timezone,
            min_valid_us=(min_valid - _EPOCH) // timedelta(microseconds=1),
            max_future_skew_ms=et.max_future_skew_ms,
            late_after_ms=et.late_after_ms,
            max_lateness_ms=et.max_lateness_ms,
            max_lateness=et.max_lateness,
            schema_id=cfg.schema_id,
            partitioning=cfg.partitioning,
            out_schema=data_schema(topic, cfg.partitioning),
            wire_schema=pa.schema([pa.field(f.name, _wire_type(f.type, fmt)) for f in topic.arrow]),
            avro_reader=avro_reader,
            schema_file=cfg.schema_file,
            writer_schemas=writer_schemas,
        )


def _check_field_partition(cfg: PipelineConfig, topic: TopicSchema) -> None:
    """Refuse a `partitioning.field` the schema cannot feed: every message must have a
    partition, whatever its value, so the field is a top-level one of a type whose
    values compare as text."""
    spec = cfg.partitioning.field
    if spec is None:
        return
    where = f"{cfg.schema_path}: partitioning.field.name {spec.name!r}"
    if spec.name not in topic.arrow.names:
        raise SchemaError(
            f"{where} is not a field of the schema; name a top-level field, one of "
            f"{', '.join(topic.arrow.names)}"
        )
    kind = topic.arrow.field(spec.name).type
    if not (pa.types.is_string(kind) or pa.types.is_int32(kind) or pa.types.is_int64(kind)):
        raise SchemaError(
            f"{where} is {kind}, but a field partition takes a string, enum, int or long "
            "field, whose values can be listed exactly; partition by another field"
        )
    if not pa.types.is_string(kind):
        odd = [v for v in spec.values if not re.fullmatch(r"-?(0|[1-9][0-9]*)", v)]
        if odd:
            raise SchemaError(
                f"{where} is an integer field, but partitioning.field.values lists "
                f"{', '.join(map(repr, odd))}, which no integer is written as; list integers "
                "as plain decimals (7, -3), or they never match"
            )
    clash = [n for n in topic.arrow.names if n.lower() == spec.column]
    if clash:
        raise SchemaError(
            f"{where}: its partition column `{spec.column}` has the name of the schema's "
            f"field `{clash[0]}`; rename that field, or partition by another"
        )


@dataclass(frozen=True)
class Decoded:
    """The outcome of decoding one chunk of raw messages.

    Attributes:
        rows: Decoded rows in the data table's schema (partition columns included).
        quarantine: Rejected messages in the quarantine schema, each with its reason.
    """

    rows: pa.Table
    quarantine: pa.Table


# The raw message's fields each row of the table carries.
_COORDINATE_COLUMNS = ["_topic", "_partition", "_offset", "_kafka_ts", "_key", "_batch"]


def decode_chunk(
    raw: pa.Table, rules: DecodeRules, rejected: Mapping[int, str] | None = None
) -> Decoded:
    """Decode a chunk of raw messages.

    Args:
        raw: Messages in the raw table's schema (coordinates, `_value`, `_headers`, `_batch`).
        rules: The pipeline's decode rules.
        rejected: Row indices of `raw` to quarantine with the given reason whatever
            their value, e.g. messages whose headers the Kafka client could not read.

    Returns:
        Rows and quarantined messages; together they hold every input message once.

    Raises:
        IndexError: If `rejected` names a row the chunk does not have.
    """
    values = raw.column("_value").combine_chunks()
    reasons: list[str | None] = [None] * len(values)
    usable = pc.fill_null(pc.greater(pc.binary_length(values), 0), False)
    if rejected:
        for i, why in rejected.items():
            if not 0 <= i < len(values):
                raise IndexError(f"rejected row {i} is not a row of this chunk of {len(values)}")
            reasons[i] = why or "rejected before decoding"
        keep = np.ones(len(values), dtype=bool)
        keep[list(rejected)] = False
        usable = pc.and_(usable, pa.array(keep))
    for i in pc.indices_nonzero(pc.fill_null(pc.equal(pc.binary_length(values), 0), False)):
        reasons[i.as_py()] = reasons[i.as_py()] or "empty value"
    for i in pc.indices_nonzero(pc.is_null(values)):
        reasons[i.as_py()] = reasons[i.as_py()] or "empty value (tombstone)"

    if rules.format == "json":
        usable = _only_utf8(values, usable, reasons)
        usable = _not_null_json(values, usable, reasons)
        wire, parsed_idx = _parse_json(values, pc.indices_nonzero(usable), rules, reasons)
    else:
        wire, parsed_idx = _parse_avro(
            values.to_pylist(), pc.indices_nonzero(usable).to_pylist(), rules, reasons
        )
    parsed, parsed_idx = _conform(wire, parsed_idx, rules, reasons)

    parsed = _fill_defaults(parsed, rules.topic)
    keep_rows = _check_required(parsed, parsed_idx, rules.topic, reasons)
    # Clean chunks, the usual case, keep every row: no filtering copy, no Python pass.
    if not all(keep_rows):
        parsed = parsed.filter(pa.array(keep_rows, pa.bool_()))
        parsed_idx = [i for i, k in zip(parsed_idx, keep_rows, strict=True) if k]

    # Only the coordinates travel on with the rows; the values were parsed. A chunk of
    # clean messages keeps every row, and needs no copy.
    coords = raw.select(_COORDINATE_COLUMNS)
    if len(parsed_idx) != raw.num_rows:
        coords = coords.take(pa.array(parsed_idx, pa.int64()))
    event_us, beyond = _event_time_us(parsed.column(rules.event_field), rules)
    keep_rows = _check_event_time(
        event_us, beyond, parsed.column(rules.event_field), coords, parsed_idx, rules, reasons
    )
    kept_us = event_us
    if not all(keep_rows):
        mask = pa.array(keep_rows, pa.bool_())
        parsed = parsed.filter(mask)
        coords = coords.filter(mask)
        kept_us = pc.filter(event_us, mask)
    event_time = kept_us.cast(pa.timestamp("us", tz="UTC"))

    columns: dict[str, pa.Array | pa.ChunkedArray] = {
        n: parsed.column(n) for n in parsed.column_names
    }
    columns["_event_time"] = event_time
    for name in _COORDINATE_COLUMNS:
        columns[name] = coords.column(name)
    # Only the partition columns of `out_schema` are taken below.
    columns["dt"], columns["hr"] = event_partitions(kept_us, rules.partitioning.timezone)
    spec = rules.partitioning.field
    if spec is not None:
        columns[spec.column] = field_partitions(parsed.column(spec.name), spec)
    rows = pa.table([columns[f.name] for f in rules.out_schema], schema=rules.out_schema)

    bad_idx = (
        []
        if reasons.count(None) == len(reasons)
        else [i for i, r in enumerate(reasons) if r is not None]
    )
    bad = raw.take(pa.array(bad_idx, pa.int64())).select(QUARANTINE_SCHEMA.names[:-1])
    quarantine = bad.append_column(
        pa.field("reason", pa.string(), nullable=False),
        pa.array([reasons[i] for i in bad_idx], pa.string()),
    ).cast(QUARANTINE_SCHEMA)
    return Decoded(rows=rows, quarantine=quarantine)


def _wire_type(kind: pa.DataType, fmt: str) -> pa.DataType:
    """The Arrow type a column's values are read into, before they are checked.

    Timestamps and dates arrive as their Avro numbers (Arrow's JSON reader takes a
    timestamp only as text). JSON floats are read as doubles, so that a number beyond
    a float's range is seen rather than turned into infinity. fastavro reads an Avro
    int as any varint, so it is read wide and its range checked; Avro decimals arrive
    as the two's-complement bytes of their unscaled value.
    """
    if pa.types.is_struct(kind):
        return pa.struct(
            [
                pa.field(kind.field(i).name, _wire_type(kind.field(i).type, fmt))
                for i in range(kind.num_fields)
            ]
        )
    if pa.types.is_map(kind):
        return pa.map_(kind.key_type, _wire_type(kind.item_type, fmt))
    if pa.types.is_list(kind):
        return pa.list_(_wire_type(kind.value_type, fmt))
    if pa.types.is_timestamp(kind):
        return pa.int64()
    if pa.types.is_date32(kind):
        return pa.int32() if fmt == "json" else pa.int64()
    if fmt == "json" and pa.types.is_floating(kind):
        return pa.float64()
    if fmt == "avro" and pa.types.is_int32(kind):
        return pa.int64()
    if fmt == "avro" and pa.types.is_decimal(kind):
        return pa.binary()
    return kind


def _only_utf8(values: pa.Array, usable: pa.Array, reasons: list[str | None]) -> pa.Array:
    """Quarantine the JSON values that are not UTF-8 text; the rest stay usable.

    One cast validates the whole chunk in C++; messages are looked at one by one only
    when it fails. Arrow's JSON reader copies the bytes of a string as they are, so
    a value with invalid UTF-8 inside a string would otherwise reach the writer.
    """
    try:
        values.cast(pa.string())
        return usable
    except pa.ArrowInvalid:
        pass
    keep = np.ones(len(values), dtype=bool)
    for i, value in enumerate(values.to_pylist()):
        if value is None or reasons[i] is not None:
            continue
        try:
            value.decode("utf-8")
        except UnicodeDecodeError as exc:
            reasons[i] = f"not valid JSON: not UTF-8 text (byte {exc.start})"
            keep[i] = False
    return pc.and_(usable, pa.array(keep))


# A message whose first JSON value is `null`: Arrow's JSON reader (26.0) with an
# explicit schema crashes the process (SIGSEGV, or a read that spins for ever) when
# the first value of a block is a top-level null, after a byte-order mark too (which
# its reader skips at the start of a block).
_LEADING_NULL = "^(\ufeff)?[ \t\r\n]*null"


def _not_null_json(values: pa.Array, usable: pa.Array, reasons: list[str | None]) -> pa.Array:
    """Quarantine the messages that begin with a top-level `null`; they never reach Arrow.

    `null` is valid JSON, but not a record: a producer that sends it (a tombstone
    written as JSON, a serializer given None) must get a quarantine row, not a task
    that dies on every re-run of its batch.
    """
    leading = pc.fill_null(pc.match_substring_regex(values, _LEADING_NULL), False)
    found = pc.and_(usable, leading)
    if not pc.any(found).as_py():
        return usable
    for i in pc.indices_nonzero(found).to_pylist():
        rest = values[i].as_py().removeprefix(b"\xef\xbb\xbf").strip()
        reasons[i] = (
            "not valid JSON for the schema: the message is null, not an object"
            if rest == b"null"
            else "not valid JSON for the schema: the message begins with null, not an object"
        )
    return pc.and_(usable, pc.invert(leading))


def _parse_json(
    values: pa.Array, candidates: pa.Array, rules: DecodeRules, reasons: list[str | None]
) -> tuple[pa.Table, list[int]]:
    """Parse JSON values against the schema in bulk; isolate bad ones by bisection.

    Values are joined one per line, in Arrow, without a pass in Python. A raw newline
    byte can only be insignificant whitespace in valid JSON (inside a string it must
    be escaped), so it is replaced by a space first. A block that fails to parse is
    halved until each bad message stands alone, which costs O(bad x log n) parses and
    keeps the clean path at Arrow's speed.
    """
    options = pajson.ParseOptions(
        explicit_schema=rules.wire_schema,
        unexpected_field_behavior="ignore",
        newlines_in_values=False,
    )
    longest = pc.max(pc.binary_length(values)).as_py() or 0
    # A block must hold the longest message; Arrow's block size is an int32, so a value
    # past a GiB gets the largest block, fails to parse alone and is quarantined.
    read = pajson.ReadOptions(block_size=min(max(_JSON_BLOCK, longest * 2 + 1), 2**31 - 1))
    # A scan of the raw bytes (memchr speed) decides whether the replacement is needed.
    data = values.buffers()[2]
    content = data.to_pybytes() if data is not None else b""
    for newline in (b"\n", b"\r"):
        if newline in content:
            values = pc.replace_substring(values, newline, b" ")
    tables: list[pa.Table] = []
    good: list[pa.Array] = []
    # Blocks still to parse, the next on top. A loop rather than a recursive closure:
    # a function that calls itself by its closure is a reference cycle, and kept the
    # chunk's values and parsed tables alive until the cyclic collector ran.
    todo = [candidates] if len(candidates) else []
    while todo:
        idx = todo.pop()
        # All of a clean chunk's values are parsed at once, as they lie.
        body = values if len(idx) == len(values) else values.take(idx)
        lines = pa.ListArray.from_arrays(pa.array([0, len(body)], pa.int32()), body)
        joined = pa.BufferReader(pc.binary_join(lines, b"\n")[0].as_buffer())
        error = ""
        try:
            table = pajson.read_json(joined, read_options=read, parse_options=options)
            if table.num_rows == len(idx):
                tables.append(table)
                good.append(idx)
                continue
            error = "not one JSON object per message"
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            error = str(exc).splitlines()[0]
        if len(idx) == 1:
            reasons[idx[0].as_py()] = _json_reason(body[0].as_py(), error, rules.topic)
            continue
        # The first half on top: blocks are parsed, and rows kept, in offset order.
        mid = len(idx) // 2
        todo += [idx.slice(mid), idx.slice(0, mid)]
    if not tables:
        return rules.wire_schema.empty_table(), []
    parsed = pa.concat_tables([t.cast(rules.wire_schema) for t in tables])
    return parsed, pa.concat_arrays(good).to_pylist()


class _Number(str):
    """A JSON number kept as its text, to find the field that Arrow's error quotes."""


def _json_paths(value: bytes, fields: list[str] | None) -> list[tuple[str, Any]]:
    """Every (dotted path, value) in a JSON message, numbers kept as their text.

    Only the top-level keys in `fields` are followed, when given. Used on a rejected
    message only, to name the field an error is about.
    """
    try:
        doc = json.loads(
            value, parse_int=_Number, parse_float=_Number, parse_constant=_Number, strict=False
        )
    except (ValueError, RecursionError):
        return []
    out: list[tuple[str, Any]] = []

    def walk(node: Any, path: str) -> None:  # noqa: ANN401 - any JSON value
        out.append((path, node))
        if isinstance(node, dict):
            for key, child in node.items():
                out.append((f"{path}.{key}" if path else key, key))
                walk(child, f"{path}.{key}" if path else key)
        elif isinstance(node, list):
            for child in node:
                walk(child, f"{path}[]")

    if isinstance(doc, dict):
        for key, child in doc.items():
            if fields is None or key in fields:
                walk(child, key)
    return out


def _json_field(
    value: bytes, fields: list[str] | None, match: Callable[[Any], bool]
) -> tuple[str, Any]:
    """`("field `x`: ", value)` for the first value the predicate matches, or `("", None)`."""
    for path, node in _json_paths(value, fields):
        if match(node):
            return f"field `{path}`: ", node
    return "", None


def _quote(value: Any) -> str:  # noqa: ANN401 - any value a producer sent
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= _QUOTE_CHARS else text[:_QUOTE_CHARS] + "..."


def _json_reason(value: bytes, error: str, topic: TopicSchema) -> str:
    """Why one message is not JSON for the schema, in plain words."""
    if not value.strip():
        return "empty value"
    nul = value.find(b"\x00")
    if nul >= 0:
        return f"not valid JSON: a NUL byte at position {nul}"
    fields = topic.arrow.names
    token = re.search(r"couldn't parse:(.*)$", error)
    if token and token.group(1) in ("NaN", "Infinity", "-Infinity"):
        where, _ = _json_field(value, fields, lambda n: n == token.group(1))
        subject = where.replace(": ", " ") if where else "a value "
        return f"not valid JSON: {subject}is {token.group(1)}, which is not a JSON number"
    integer = re.search(r"Failed to convert JSON to int(32|64), couldn't parse:(.*)$", error)
    if integer:
        bits, text = integer.groups()
        where, _ = _json_field(value, fields, lambda n: isinstance(n, _Number) and n == text)
        kind = "int (32 bits)" if bits == "32" else "long (64 bits)"
        if re.fullmatch(r"-?\d+", text):
            return (
                f"not valid JSON for the schema: {where}{_quote(text)} is out of range for {kind}"
            )
        return f"not valid JSON for the schema: {where}{_quote(text)} is not written as an integer"
    if "Number too big to be stored in double" in error:
        where, number = _json_field(value, fields, _beyond_double)
        return (
            f"not valid JSON for the schema: {where}{_quote(number or 'a number')} is beyond "
            "the range of double"
        )
    if "surrogate pair in string is invalid" in error:
        where, _ = _json_field(value, None, _has_surrogate)
        subject = where.replace(": ", " ") if where else "a string "
        return (
            f"not valid JSON: {subject}holds a \\u escape of a lone surrogate (U+D800 to "
            "U+DFFF), which is not a Unicode character"
        )
    if "Invalid encoding in string" in error:
        # The bytes are UTF-8 (checked before parsing): the string holds a raw control
        # character, which JSON requires to be escaped.
        where, _ = _json_field(value, None, _has_control)
        subject = where.replace(": ", " ") if where else "a string "
        return (
            f"not valid JSON: {subject}holds a raw control character (U+0000 to U+001F), "
            "which JSON requires to be escaped"
        )
    decimal = re.search(r"to (decimal\d+\(\d+, \d+\)): (\S+) requires (scale|precision)", error)
    if decimal:
        kind, text, what = decimal.groups()
        where, _ = _json_field(value, fields, lambda n: isinstance(n, str) and n == text)
        much = "decimal places" if what == "scale" else "digits"
        return (
            f"not valid JSON for the schema: {where}{_quote(text)} has more {much} than "
            f"{kind} holds"
        )
    not_decimal = re.search(r"The string '(.*)' is not a valid (decimal\d+) number", error)
    if not_decimal:
        text, kind = not_decimal.groups()
        where, _ = _json_field(value, fields, lambda n: n == text)
        return f"not valid JSON for the schema: {where}{_quote(repr(text))} is not a {kind} number"
    changed = re.search(r"Column\((.*)\) changed from (\w+) to (\w+)", error)
    if changed and not changed.group(1):
        return (
            f"not valid JSON for the schema: the message is {_article(changed.group(3))}, "
            "not an object"
        )
    if changed:
        column, want, got = changed.groups()
        return (
            f"not valid JSON for the schema: field `{_json_column(column)}` should be "
            f"{_article(want)}, not {_article(got)}"
        )
    twice = re.search(r"Column\((.*)\) was specified twice", error)
    if twice:
        return (
            f"not valid JSON for the schema: field `{_json_column(twice.group(1))}` appears twice"
        )
    # Arrow appends "in row 0" for the single-line parse; the row is always this message.
    detail = error.replace(" in row 0", "").strip() or "unparseable"
    return f"not valid JSON for the schema: {detail}"


def _beyond_double(node: Any) -> bool:  # noqa: ANN401 - any JSON value
    return isinstance(node, _Number) and float(node) in (float("inf"), float("-inf"))


def _has_surrogate(node: Any) -> bool:  # noqa: ANN401 - any JSON value
    return isinstance(node, str) and re.search("[\ud800-\udfff]", node) is not None


def _has_control(node: Any) -> bool:  # noqa: ANN401 - any JSON value
    return isinstance(node, str) and re.search("[\x00-\x1f]", node) is not None


def _json_column(column: str) -> str:
    """Arrow's column path (`/ctx/ip`, `/tags/[]`) as a field path (`ctx.ip`, `tags[]`)."""
    return ".".join(column.strip("/").split("/")).replace(".[]", "[]")


def _article(kind: str) -> str:
    return f"an {kind}" if kind[:1] in "aeiou" else f"a {kind}"


def _parse_avro(
    values: list[Any], candidates: list[int], rules: DecodeRules, reasons: list[str | None]
) -> tuple[pa.Table, list[int]]:
    from fastavro import schemaless_reader
    from fastavro.read import SchemaResolutionError

    records: list[dict[str, Any]] = []
    good: list[int] = []
    confluent = rules.format == "confluent_avro"
    # With a registry, what each schema id of the chunk reads with is settled before
    # the loop, one lookup per id: a registry that cannot be reached fails the chunk
    # before any message is decided, and the loop does no more than a dict lookup.
    by_id: dict[int, WriterSchema | str] = {}
    if confluent and rules.writer_schemas is not None:
        for written in sorted(_schema_ids(values, candidates)):
            by_id[written] = rules.writer_schemas.lookup(written)
    for i in candidates:
        payload = values[i]
        writer, reader = rules.avro_reader, None
        written = -1
        if confluent:
            if len(payload) < 5 or payload[0] != 0:
                reasons[i] = "not in Confluent wire format (expected magic byte 0 and a schema id)"
                continue
            written = int.from_bytes(payload[1:5], "big")
            if rules.writer_schemas is not None:
                how = by_id[written]
                if isinstance(how, str):
                    reasons[i] = how
                    continue
                writer, reader = how.writer, how.reader
            elif written != rules.schema_id:
                reasons[i] = (
                    f"written with schema id {written}, not the configured schema_id "
                    f"{rules.schema_id}; decoding it with another schema would misread its "
                    "fields (if the topic's schema changed, update schema_file and schema_id, "
                    "then replay)"
                )
                continue
            payload = payload[5:]
        try:
            buf = io.BytesIO(payload)
            record = schemaless_reader(buf, writer, reader)
            if buf.tell() != len(payload):
                raise ValueError(f"{len(payload) - buf.tell()} trailing bytes after the record")
        except UnicodeDecodeError as exc:
            reasons[i] = (
                f"not valid Avro for the schema: a string is not UTF-8 text (byte {exc.start} "
                "of the string)"
            )
            continue
        except SchemaResolutionError as exc:
            # Only a writer schema from the registry is resolved into the table's.
            reasons[i] = _quote_reason(
                f"written with schema id {written}, which cannot be read as "
                f"{rules.schema_file}: {exc}"
            )
            continue
        except Exception as exc:  # noqa: BLE001 - any decoder failure is the message's fault
            reasons[i] = _quote_reason(
                f"not valid Avro for the schema: {type(exc).__name__}: {exc}"
            )
            continue
        if not isinstance(record, dict):
            reasons[i] = "not valid Avro for the schema: not a record"
            continue
        records.append(record)
        good.append(i)
    return _records_table(records, good, rules.wire_schema, reasons)


def _schema_ids(values: list[Any], candidates: list[int]) -> set[int]:
    """The schema ids in the Confluent headers of the candidate messages."""
    return {
        int.from_bytes(values[i][1:5], "big")
        for i in candidates
        if len(values[i]) >= 5 and values[i][0] == 0
    }


def _quote_reason(reason: str) -> str:
    return reason if len(reason) <= 4 * _QUOTE_CHARS else reason[: 4 * _QUOTE_CHARS] + "..."


def _records_table(
    records: list[dict[str, Any]], idx: list[int], schema: pa.Schema, reasons: list[str | None]
) -> tuple[pa.Table, list[int]]:
    """Decoded records as a table; a record Arrow refuses is isolated by bisection."""
    if not records:
        return schema.empty_table(), []
    try:
        return pa.Table.from_pylist(records, schema=schema), idx
    except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
        if len(records) == 1:
            reasons[idx[0]] = _quote_reason(f"not valid Avro for the schema: {exc}")
            return schema.empty_table(), []
    mid = len(records) // 2
    first, first_idx = _records_table(records[:mid], idx[:mid], schema, reasons)
    second, second_idx = _records_table(records[mid:], idx[mid:], schema, reasons)
    return pa.concat_tables([first, second]), first_idx + second_idx


def _conform(
    wire: pa.Table, idx: list[int], rules: DecodeRules, reasons: list[str | None]
) -> tuple[pa.Table, list[int]]:
    """Check every value against its Avro type and bring the rows to the table's types.

    Values the columns could not hold faithfully (an Avro int beyond 32 bits, a date
    beyond year 9999, a decimal with too many digits, a JSON NaN...) send their
    message to quarantine with the field named. Last, the rows are validated in C++
    (UTF-8 of every string, nested ones included, and decimal precision): no invalid
    value may reach the writer, whose statistics would fail on it.
    """
    fmt = "json" if rules.format == "json" else "avro"
    table = wire
    found: dict[int, str] = {}
    for i, f in enumerate(rules.topic.avro["fields"]):
        if not _checked(f["type"], fmt):
            continue
        column, findings = _conform_values(
            wire.column(i).combine_chunks(), f["type"], f["name"], fmt
        )
        table = table.set_column(i, f["name"], column)
        for pos, why in findings:
            found.setdefault(pos, why)
    table, idx = _drop(table, idx, found, reasons)
    table = table.cast(rules.topic.arrow)
    try:
        table.validate(full=True)
    except pa.ArrowInvalid:
        invalid = {pos: _invalid_reason(table.slice(pos, 1)) for pos in _invalid_rows(table)}
        table, idx = _drop(table, idx, invalid, reasons)
    return table, idx


def _drop(
    table: pa.Table, idx: list[int], found: dict[int, str], reasons: list[str | None]
) -> tuple[pa.Table, list[int]]:
    """Quarantine the rows at the positions found, with their reasons."""
    if not found:
        return table, idx
    keep = np.ones(table.num_rows, dtype=bool)
    for pos, why in found.items():
        keep[pos] = False
        reasons[idx[pos]] = why
    return table.filter(pa.array(keep)), [i for i, k in zip(idx, keep, strict=True) if k]


def _invalid_rows(table: pa.Table, start: int = 0, length: int | None = None) -> list[int]:
    """Positions of the rows that fail full validation, found by bisection."""
    length = table.num_rows if length is None else length
    try:
        table.slice(start, length).validate(full=True)
        return []
    except pa.ArrowInvalid:
        if length == 1:
            return [start]
    half = length // 2
    return _invalid_rows(table, start, half) + _invalid_rows(table, start + half, length - half)


def _invalid_reason(row: pa.Table) -> str:
    for name in row.column_names:
        try:
            row.column(name).validate(full=True)
        except pa.ArrowInvalid as exc:
            detail = str(exc).splitlines()[0]
            return _quote_reason(f"field `{name}` holds a value its column cannot: {detail}")
    return "a value its column cannot hold"


def _checked(avro_type: Any, fmt: str) -> bool:  # noqa: ANN401 - Avro schemas are JSON
    """Whether `_conform_values` checks or converts anything in values of this type."""
    avro_type = non_null(avro_type)
    kind = avro_type if isinstance(avro_type, str) else avro_type.get("type")
    if kind == "record":
        return any(_checked(f["type"], fmt) for f in avro_type["fields"])
    if kind in ("array", "map"):
        return _checked(avro_type["items" if kind == "array" else "values"], fmt)
    if logical_type(avro_type) is not None:
        return True
    if fmt == "json":
        return kind in ("enum", "float", "double")
    return kind == "int"


def _conform_values(
    arr: pa.Array,
    avro_type: Any,  # noqa: ANN401 - Avro schemas are JSON
    path: str,
    fmt: str,
) -> tuple[pa.Array, Findings]:
    """Check values of one Avro type (nested ones included); convert what Arrow cannot cast.

    Returns:
        The values, ready to be cast to the column's type, and what was found wrong,
        by position in `arr`.
    """
    avro_type = non_null(avro_type)
    kind = avro_type if isinstance(avro_type, str) else avro_type.get("type")
    logical = logical_type(avro_type)
    if kind == "record":
        children = arr.flatten()
        found: Findings = []
        converted = []
        for child, f in zip(children, avro_type["fields"], strict=True):
            out, more = _conform_values(child, f["type"], f"{path}.{f['name']}", fmt)
            converted.append(out)
            found.extend(more)
        if all(a is b for a, b in zip(converted, children, strict=True)):
            return arr, found
        names = [f["name"] for f in avro_type["fields"]]
        return pa.StructArray.from_arrays(converted, names=names, mask=arr.is_null()), found
    if kind == "array":
        items = arr.flatten()
        out, more = _conform_values(items, avro_type["items"], f"{path}[]", fmt)
        found = _at_parents(arr, more)
        if out is items:
            return arr, found
        return pa.ListArray.from_arrays(_offsets(arr), out, mask=arr.is_null()), found
    if kind == "map":
        # Kernels on map arrays are not all safe; a list of entries is the same data.
        entries = pa.ListArray.from_arrays(
            arr.offsets,
            pa.StructArray.from_arrays([arr.keys, arr.items], names=["key", "value"]),
            mask=arr.is_null(),
        )
        flat = entries.flatten()
        items = flat.field("value")
        out, more = _conform_values(items, avro_type["values"], f"{path}{{}}", fmt)
        found = _at_parents(entries, more)
        if out is items:
            return arr, found
        return pa.MapArray.from_arrays(
            _offsets(entries), flat.field("key"), out, mask=arr.is_null()
        ), found
    if logical == "decimal":
        return _decimals(arr, avro_type, path, fmt)
    if logical in _RANGES or (fmt == "avro" and kind == "int"):
        low, high, what = _RANGES[logical or "int"]
        found = _outside(
            arr, low, high, lambda v: f"field `{path}`: {v} is out of range for {what}"
        )
        if fmt == "avro" and kind == "int":
            arr = pc.cast(arr, pa.int32(), safe=False)  # rows out of range are dropped
        return arr, found
    if logical == "uuid":
        bad = pc.fill_null(pc.invert(pc.match_substring_regex(arr, _UUID)), False)
        return arr, _where(arr, bad, lambda v: f"field `{path}`: {_quote(repr(v))} is not a UUID")
    if kind == "enum" and fmt == "json":
        symbols = avro_type.get("symbols", [])
        bad = pc.and_(
            pc.is_valid(arr), pc.invert(pc.is_in(arr, value_set=pa.array(symbols, pa.string())))
        )
        listed = _quote(", ".join(symbols))
        return arr, _where(
            arr,
            bad,
            lambda v: f"field `{path}`: {_quote(repr(v))} is not a symbol of the enum ({listed})",
        )
    if kind in ("float", "double") and fmt == "json":
        return arr, _json_floats(arr, kind, path)
    return arr, []


def _offsets(lists: pa.Array) -> pa.Array:
    """Offsets of a list array's values as `flatten()` returns them."""
    lengths = pc.fill_null(pc.list_value_length(lists), 0).cast(pa.int32())
    return pa.concat_arrays([pa.array([0], pa.int32()), pc.cumulative_sum(lengths)])


def _at_parents(lists: pa.Array, found: Findings) -> Findings:
    """Findings about list items, as findings about the rows holding them."""
    if not found:
        return []
    parents = pc.list_parent_indices(lists).to_pylist()
    return [(parents[pos], why) for pos, why in found]


def _where(arr: pa.Array, bad: pa.Array, reason: Callable[[Any], str]) -> Findings:
    """Findings at the positions where `bad` is true, each with the value's reason."""
    if not pc.any(bad).as_py():
        return []
    positions = pc.indices_nonzero(bad).to_pylist()
    return [(p, reason(v)) for p, v in zip(positions, pc.filter(arr, bad).to_pylist(), strict=True)]


def _outside(arr: pa.Array, low: int, high: int, reason: Callable[[Any], str]) -> Findings:
    bad = pc.fill_null(pc.or_(pc.less(arr, low), pc.greater(arr, high)), False)
    return _where(arr, bad, reason)


def _json_floats(arr: pa.Array, kind: str, path: str) -> Findings:
    """JSON has no NaN or Infinity (RFC 8259), and a float has a narrower range than a double."""
    finite = pc.is_finite(arr)
    bad = pc.fill_null(pc.invert(finite), False)
    if kind == "float":
        narrowed = pc.is_finite(pc.cast(arr, pa.float32(), safe=False))
        bad = pc.or_(bad, pc.fill_null(pc.and_(finite, pc.invert(narrowed)), False))

    def reason(v: float) -> str:
        if v != v:
            return f"not valid JSON: field `{path}` is NaN, which is not a JSON number"
        if v in (float("inf"), float("-inf")):
            token = "Infinity" if v > 0 else "-Infinity"
            return f"not valid JSON: field `{path}` is {token}, which is not a JSON number"
        return f"field `{path}`: {v!r} is beyond the range of float (32 bits)"

    return _where(arr, bad, reason)


def _decimals(
    arr: pa.Array, avro_type: dict[str, Any], path: str, fmt: str
) -> tuple[pa.Array, Findings]:
    """Decimals: parsed by Arrow from JSON text; from Avro's bytes, converted exactly here."""
    precision, scale = decimal_digits(avro_type)
    kind = pa.decimal256(precision, scale) if precision > 38 else pa.decimal128(precision, scale)
    what = f"decimal({precision}, {scale})"
    if fmt == "json":
        # Arrow's reader refuses extra decimal places, but not extra digits.
        largest = pa.scalar(Decimal(f"{10**precision - 1}E-{scale}"), kind)
        bad = pc.fill_null(pc.greater(pc.abs(arr), largest), False)
        return arr, _where(
            arr, bad, lambda v: f"field `{path}`: {v} has more digits than {what} holds"
        )
    limit = 10**precision
    out: list[Decimal | None] = []
    found: Findings = []
    for pos, raw in enumerate(arr.to_pylist()):
        if raw is None:
            out.append(None)
            continue
        # 32 bytes hold any decimal256; more cannot fit and would be slow to print.
        unscaled = int.from_bytes(raw, "big", signed=True) if len(raw) <= 32 else limit
        if -limit < unscaled < limit:
            out.append(Decimal(f"{unscaled}E-{scale}"))
            continue
        out.append(None)
        shown = Decimal(f"{unscaled}E-{scale}") if len(raw) <= 32 else f"a {len(raw)}-byte value"
        found.append((pos, f"field `{path}`: {shown} has more digits than {what} holds"))
    return pa.array(out, kind), found


def _fill_defaults(parsed: pa.Table, topic: TopicSchema) -> pa.Table:
    for name, default in topic.defaults.items():
        col = parsed.column(name)
        if col.null_count:
            fill = pa.scalar(default, type=col.type)
            parsed = parsed.set_column(
                parsed.schema.get_field_index(name), name, pc.fill_null(col, fill)
            )
    return parsed


def _check_required(
    parsed: pa.Table, idx: list[int], topic: TopicSchema, reasons: list[str | None]
) -> list[bool]:
    keep = [True] * len(idx)
    for name in topic.required:
        col = parsed.column(name)
        if not col.null_count:
            continue
        for pos in pc.indices_nonzero(pc.is_null(col)).to_pylist():
            if keep[pos]:
                keep[pos] = False
                reasons[idx[pos]] = f"missing required field `{name}`"
    return keep


def _event_time_us(col: pa.ChunkedArray, rules: DecodeRules) -> tuple[pa.Array, pa.Array]:
    """Event times as epoch microseconds (int64), and which ones lie beyond years 1-9999.

    Returns:
        The times, null where absent, unreadable or out of range; and a mask of the
        values that were read but lie outside 0001-01-01 to 9999-12-31T23:59:59Z.
    """
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_timestamp(col.type):
        if col.type.tz is None:
            # A local timestamp is a wall-clock time, in the zone of ISO strings without one.
            col = pc.assume_timezone(
                col, rules.timezone, ambiguous="earliest", nonexistent="earliest"
            )
        us = col.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    elif rules.event_unit == "iso8601":
        zone = ZoneInfo(rules.timezone)
        us = pa.array([_parse_iso_us(text, zone) for text in col.to_pylist()], pa.int64())
    elif pa.types.is_integer(col.type):
        whole = col.cast(pa.int64())
        per = _US_PER_UNIT[rules.event_unit]
        if per == 0:
            us = floor_divide(whole, 1000)
        else:
            # Out-of-range values wrap here, and are told apart by the bounds below.
            inside = pc.and_(
                pc.greater_equal(whole, -(-_MIN_US // per)), pc.less_equal(whole, _MAX_US // per)
            )
            us = pc.if_else(inside, pc.multiply(whole, per), pa.scalar(_MAX_US + 1, pa.int64()))
    else:
        as_float = pc.cast(col, pa.float64())
        per = _US_PER_UNIT[rules.event_unit]
        scaled = pc.divide(as_float, 1000.0) if per == 0 else pc.multiply(as_float, float(per))
        finite = pc.is_finite(scaled)
        inside = pc.and_(
            finite,
            pc.and_(
                pc.greater_equal(scaled, float(_MIN_US)), pc.less_equal(scaled, float(_MAX_US))
            ),
        )
        us = pc.if_else(
            inside,
            pc.cast(pc.floor(scaled), pa.int64()),
            pc.if_else(finite, pa.scalar(_MAX_US + 1, pa.int64()), pa.scalar(None, pa.int64())),
        )
    beyond = pc.fill_null(pc.or_(pc.less(us, _MIN_US), pc.greater(us, _MAX_US)), False)
    return pc.if_else(beyond, pa.scalar(None, pa.int64()), us), beyond


def _parse_iso_us(text: str | None, zone: ZoneInfo) -> int | None:
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=zone)
        return (moment - _EPOCH) // timedelta(microseconds=1)
    except (ValueError, OverflowError):
        return None


def _check_event_time(
    event_us: pa.Array,
    beyond: pa.Array,
    event_col: pa.ChunkedArray,
    coords: pa.Table,
    idx: list[int],
    rules: DecodeRules,
    reasons: list[str | None],
) -> list[bool]:
    """Keep the rows whose event time is present and believable; quarantine the rest.

    The bounds on how far an event may lie ahead of, or trail, its Kafka timestamp
    are checked against the message's own timestamp, so a re-run decides the same;
    a message without a Kafka timestamp has nothing to be compared with, and skips
    both.
    """
    kafka_ms = coords.column("_kafka_ts").combine_chunks().cast(pa.int64())
    kafka_ms = pc.min_element_wise(
        pc.max_element_wise(kafka_ms, -_KAFKA_CLAMP_MS, skip_nulls=False),
        _KAFKA_CLAMP_MS,
        skip_nulls=False,
    )
    kafka_us = pc.multiply(kafka_ms, 1000)
    missing = pc.is_null(event_us)
    too_early = pc.fill_null(pc.less(event_us, rules.min_valid_us), False)
    limit = pc.add(kafka_us, rules.max_future_skew_ms * 1000)
    too_far = pc.fill_null(pc.greater(event_us, limit), False)
    bad = pc.or_(pc.or_(missing, too_early), too_far)
    too_late = pa.repeat(pa.scalar(False), len(event_us))
    if rules.max_lateness_ms is not None:
        lateness = pc.subtract(kafka_us, event_us)
        too_late = pc.fill_null(pc.greater(lateness, rules.max_lateness_ms * 1000), False)
        bad = pc.or_(bad, too_late)
    keep = [True] * len(idx)
    if not pc.any(bad).as_py():
        return keep
    events = event_us.to_pylist()
    kafka = kafka_us.to_pylist()
    beyond_l, early_l, far_l = beyond.to_pylist(), too_early.to_pylist(), too_far.to_pylist()
    field = rules.event_field
    for pos in pc.indices_nonzero(bad).to_pylist():
        keep[pos] = False
        if beyond_l[pos]:
            unit = "" if rules.event_unit == "iso8601" else f" ({rules.event_unit})"
            reasons[idx[pos]] = (
                f"event time `{field}` {_quote(str(event_col[pos].as_py()))}{unit} lies outside "
                "0001-01-01 to 9999-12-31T23:59:59Z"
            )
        elif events[pos] is None:
            reasons[idx[pos]] = f"missing or unreadable event time `{field}`"
        elif early_l[pos]:
            reasons[idx[pos]] = (
                f"event time {_iso(events[pos])} is before "
                f"{_iso(rules.min_valid_us)} (epoch zero or an unset clock)"
            )
        elif far_l[pos]:
            ahead = (events[pos] - kafka[pos]) // 1000
            reasons[idx[pos]] = (
                f"event time {_iso(events[pos])} is {human_duration(ahead)} ahead of its Kafka "
                f"timestamp {_iso(kafka[pos])} "
                f"(allowed skew {human_duration(rules.max_future_skew_ms)})"
            )
        else:
            late = (kafka[pos] - events[pos]) // 1000
            reasons[idx[pos]] = (
                f"event time {_iso(events[pos])} is {human_duration(late)} before its Kafka "
                f"timestamp {_iso(kafka[pos])}, beyond event_time.max_lateness "
                f"{rules.max_lateness}"
            )
    return keep


def _iso(us: int) -> str:
    try:
        moment = _EPOCH + timedelta(microseconds=us)
    except OverflowError:
        return f"{us // 1000} ms after 1970-01-01"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def partition_stats(rows: pa.Table, late_after_ms: int) -> dict[tuple[str, int], dict[str, int]]:
    """Per-partition row counts, event-time bounds and lateness of decoded rows.

    Args:
        rows: Decoded rows.
        late_after_ms: Lateness threshold.

    Returns:
        For each (topic, partition): rows, late rows, max lateness (ms), min and max
        event time (epoch us).
    """
    if rows.num_rows == 0:
        return {}
    event_ms = pc.divide(rows.column("_event_time").cast(pa.int64()), 1000)
    lateness = pc.subtract(rows.column("_kafka_ts").cast(pa.int64()), event_ms)
    is_late = pc.greater(lateness, late_after_ms)
    table = pa.table(
        {
            "t": rows.column("_topic"),
            "p": rows.column("_partition"),
            "ev": rows.column("_event_time").cast(pa.int64()),
            "lateness": lateness,
            "late": pc.cast(is_late, pa.int64()),
        }
    )
    grouped = table.group_by(["t", "p"]).aggregate(
        [
            ("ev", "count"),
            ("ev", "min"),
            ("ev", "max"),
            ("late", "sum"),
            ("lateness", "max"),
        ]
    )
    out: dict[tuple[str, int], dict[str, int]] = {}
    for rec in grouped.to_pylist():
        out[(rec["t"], rec["p"])] = {
            "rows": rec["ev_count"],
            "min_event_us": rec["ev_min"],
            "max_event_us": rec["ev_max"],
            "late_rows": rec["late_sum"] or 0,
            "max_lateness_ms": max(rec["lateness_max"] or 0, 0),
        }
    return out
