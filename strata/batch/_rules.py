"""What the decoder goes by: the rules derived once from a pipeline's settings.

Also the instants every table can hold, and how much of a producer's value a
quarantine reason quotes; the parts of the decoder (`strata.batch.decode`) share them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from strata.config import (
    Decoding,
    EventTimeConfig,
    PartitioningConfig,
    SchemaRegistryConfig,
    SchemaSpec,
)
from strata.errors import SchemaError
from strata.schema.avro import (
    TopicSchema,
    data_schema,
    load_pipeline_schema,
    without_logical_types,
)
from strata.schema.registry import WriterSchemas

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The instants every reader of the tables can represent (Python, Spark, Trino, Delta
# statistics): 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z, in epoch microseconds.
MIN_US = -62_135_596_800_000_000
MAX_US = 253_402_300_799_000_000
# Quarantine reasons quote values; a hostile value must not make them huge.
_QUOTE_CHARS = 80


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
    @classmethod
    def of(
        cls,
        spec: SchemaSpec,
        event_time: EventTimeConfig,
        schema_id: int | None,
        registry: SchemaRegistryConfig,
        *,
        schema_file: str,
        reads_schema_file: bool = True,
    ) -> DecodeRules:
        """Build the rules for a pipeline.

        Args:
            spec: What the table schemas are made from (`Decoding.schemas`): the
                Avro schema read with, the format, the partitioning.
            event_time: The `event_time` settings.
            schema_id: For `confluent_avro`, the configured `schema_id`: the id under
                which `schema_file` is registered.
            registry: The `schema_registry` settings.
            schema_file: The schema file's name, for reasons.
            reads_schema_file: Whether `spec` holds `schema_file`'s schema as loaded
                (`Decoding.reads_schema_file`); only then are messages written
                with `schema_id` read without asking the registry.

        Returns:
            The decode rules.

        Raises:
            SchemaError: If the schema or the event-time settings cannot be decoded.
        """
        topic = load_pipeline_schema(spec)
        et = event_time
        if et.field not in topic.arrow.names:
            raise SchemaError(
                f"{spec.path}: event_time.field {et.field!r} is not a field of the schema; "
                f"fields are {', '.join(topic.arrow.names)}"
            )
        kind = topic.arrow.field(et.field).type
        numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind)
        if et.unit == "iso8601" and not pa.types.is_string(kind):
            raise SchemaError(
                f"{spec.path}: event_time.unit is iso8601 but field {et.field!r} is {kind}; "
                "use a numeric unit (s, ms, us, ns) or make the field a string"
            )
        if et.unit != "iso8601" and not (numeric or pa.types.is_timestamp(kind)):
            raise SchemaError(
                f"{spec.path}: event_time.unit is {et.unit} but field {et.field!r} is "
                f"{kind}; use unit: iso8601 for strings"
            )
        _check_field_partition(spec, topic)
        min_valid = datetime.fromisoformat(et.min_valid)
        if min_valid.tzinfo is None:
            min_valid = min_valid.replace(tzinfo=UTC)
        fmt = "json" if spec.format == "json" else "avro"
        avro_reader = None
        writer_schemas = None
        if fmt == "avro":
            from fastavro import parse_schema

            avro_reader = parse_schema(without_logical_types(topic.avro))
            if spec.format == "confluent_avro" and registry.url is not None:
                writer_schemas = WriterSchemas(
                    registry,
                    topic.avro,
                    avro_reader,
                    schema_file,
                    # `schema_id` is schema_file's id: a batch read with a schema the
                    # table evolved to (see `strata.schema.evolve`) asks the registry for every id.
                    schema_id if reads_schema_file else None,
                )
        return cls(
            format=spec.format,
            topic=topic,
            event_field=et.field,
            event_unit=et.unit,
            timezone=et.timezone,
            min_valid_us=(min_valid - EPOCH) // timedelta(microseconds=1),
            max_future_skew_ms=et.max_future_skew_ms,
            late_after_ms=et.late_after_ms,
            max_lateness_ms=et.max_lateness_ms,
            max_lateness=et.max_lateness,
            schema_id=schema_id,
            partitioning=spec.partitioning,
            out_schema=data_schema(topic, spec.partitioning),
            wire_schema=pa.schema([pa.field(f.name, _wire_type(f.type, fmt)) for f in topic.arrow]),
            avro_reader=avro_reader,
            schema_file=schema_file,
            writer_schemas=writer_schemas,
        )

    @classmethod
    def of_decoding(cls, decoding: Decoding) -> DecodeRules:
        """The rules for what a pipeline's decoding settings say (see `of`).

        Args:
            decoding: How messages are decoded (`Decoding.decoding`).

        Returns:
            The decode rules.
        """
        return cls.of(
            decoding.schemas,
            decoding.event_time,
            decoding.schema_id,
            decoding.registry,
            schema_file=decoding.schema_file,
            reads_schema_file=decoding.reads_schema_file,
        )


def _check_field_partition(schemas: SchemaSpec, topic: TopicSchema) -> None:
    """Refuse a `partitioning.field` the schema cannot feed: every message must have a
    partition, whatever its value, so the field is a top-level one of a type whose
    values compare as text."""
    spec = schemas.partitioning.field
    if spec is None:
        return
    where = f"{schemas.path}: partitioning.field.name {spec.name!r}"
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


def quote(value: Any) -> str:  # noqa: ANN401 - any value a producer sent
    """A value as a reason quotes it: its text, cut short past `_QUOTE_CHARS` characters."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= _QUOTE_CHARS else text[:_QUOTE_CHARS] + "..."


def quote_reason(reason: str) -> str:
    """A reason that quotes a library's message, cut short past four times `_QUOTE_CHARS`."""
    return reason if len(reason) <= 4 * _QUOTE_CHARS else reason[: 4 * _QUOTE_CHARS] + "..."
