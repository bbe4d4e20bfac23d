"""Decode raw Kafka messages into typed rows, and quarantine what cannot be trusted.

Pure functions: Arrow in, Arrow out, no I/O. A message lands either as a row of the
data table or as a row of the quarantine table with its reason and raw bytes, never
neither. Every check is deterministic for a given message (the future-skew check is
against the message's own Kafka timestamp, not the clock), so a re-run of a batch
routes every message exactly as the first run did.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from strata.config import PipelineConfig
from strata.schema import (
    QUARANTINE_SCHEMA,
    SchemaError,
    TopicSchema,
    data_schema,
    load_topic_schema,
    partition_columns,
)

_US_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": 0}
# Epoch values beyond this many microseconds (about year 9999) cannot be timestamps.
_MAX_US = 253_402_300_799_000_000
_JSON_BLOCK = 8 << 20


@dataclass(frozen=True)
class DecodeRules:
    """Everything the decoder needs, derived once from the pipeline config.

    Attributes:
        format: `json`, `avro` or `confluent_avro`.
        topic: The topic's schema.
        event_field: Name of the event-time field.
        event_unit: Unit of epoch numbers, or `iso8601`.
        timezone: Zone of ISO strings without an offset.
        min_valid_us: Earliest believable event time, in epoch microseconds.
        max_future_skew_ms: How far an event may lie ahead of its Kafka timestamp.
        late_after_ms: Lateness threshold for the report.
        partitioning: `dt` or `dt_hr`.
        out_schema: Schema of the decoded rows, partition columns included.
    """

    format: str
    topic: TopicSchema
    event_field: str
    event_unit: str
    timezone: str
    min_valid_us: int
    max_future_skew_ms: int
    late_after_ms: int
    partitioning: str
    out_schema: pa.Schema

    @classmethod
    def from_config(cls, cfg: PipelineConfig) -> DecodeRules:
        """Build the rules for a pipeline.

        Args:
            cfg: The pipeline configuration.

        Returns:
            The decode rules.
        """
        topic = load_topic_schema(cfg.schema_path)
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
        min_valid = datetime.fromisoformat(et.min_valid)
        if min_valid.tzinfo is None:
            min_valid = min_valid.replace(tzinfo=UTC)
        return cls(
            format=cfg.format,
            topic=topic,
            event_field=et.field,
            event_unit=et.unit,
            timezone=et.timezone,
            min_valid_us=int(min_valid.timestamp() * 1_000_000),
            max_future_skew_ms=et.max_future_skew_ms,
            late_after_ms=et.late_after_ms,
            partitioning=cfg.partitioning,
            out_schema=data_schema(topic, cfg.partitioning),
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


def decode_chunk(raw: pa.Table, rules: DecodeRules) -> Decoded:
    """Decode a chunk of raw messages.

    Args:
        raw: Messages in the raw table's schema (coordinates, `_value`, `_headers`, `_batch`).
        rules: The pipeline's decode rules.

    Returns:
        Rows and quarantined messages; together they hold every input message once.
    """
    values = raw.column("_value").combine_chunks()
    reasons: list[str | None] = [None] * len(values)
    lengths = pc.binary_length(values)
    for i in pc.indices_nonzero(pc.fill_null(pc.equal(lengths, 0), False)).to_pylist():
        reasons[i] = "empty value"
    for i in pc.indices_nonzero(pc.is_null(values)).to_pylist():
        reasons[i] = "empty value (tombstone)"
    candidates = pc.indices_nonzero(pc.fill_null(pc.greater(lengths, 0), False))

    if rules.format == "json":
        parsed, parsed_idx = _parse_json(values, candidates, rules.topic, reasons)
    else:
        parsed, parsed_idx = _parse_avro(values.to_pylist(), candidates.to_pylist(), rules, reasons)

    parsed = _fill_defaults(parsed, rules.topic)
    keep = _check_required(parsed, parsed_idx, rules.topic, reasons)
    parsed = parsed.filter(pa.array(keep, pa.bool_()))
    parsed_idx = [i for i, k in zip(parsed_idx, keep, strict=True) if k]

    coords = raw.take(pa.array(parsed_idx, pa.int64()))
    event_us = _event_time_us(parsed.column(rules.event_field), rules)
    keep = _check_event_time(event_us, coords.column("_kafka_ts"), parsed_idx, rules, reasons)
    mask = pa.array(keep, pa.bool_())
    parsed = parsed.filter(mask)
    coords = coords.filter(mask)
    kept_us = pc.filter(event_us, mask)
    event_time = kept_us.cast(pa.timestamp("us", tz="UTC"))

    columns: dict[str, pa.Array | pa.ChunkedArray] = {
        n: parsed.column(n) for n in parsed.column_names
    }
    columns["_event_time"] = event_time
    for name in ("_topic", "_partition", "_offset", "_kafka_ts", "_key", "_batch"):
        columns[name] = coords.column(name)
    dt, hr = event_partitions(kept_us)
    columns["dt"] = dt
    if "hr" in partition_columns(rules.partitioning):
        columns["hr"] = hr
    rows = pa.table([columns[f.name] for f in rules.out_schema], schema=rules.out_schema)

    bad_idx = [i for i, r in enumerate(reasons) if r is not None]
    bad = raw.take(pa.array(bad_idx, pa.int64())).select(QUARANTINE_SCHEMA.names[:-1])
    quarantine = bad.append_column(
        pa.field("reason", pa.string(), nullable=False),
        pa.array([reasons[i] for i in bad_idx], pa.string()),
    ).cast(QUARANTINE_SCHEMA)
    return Decoded(rows=rows, quarantine=quarantine)


def event_partitions(event_us: pa.Array) -> tuple[pa.Array, pa.Array]:
    """UTC `dt` (YYYY-MM-DD) and `hr` (HH) strings of epoch-microsecond event times.

    A batch touches few distinct hours, so each is formatted once and the column is
    built by index: far cheaper than formatting every row.
    """
    hours = pc.divide(event_us, 3_600_000_000)  # integer division; event times are > 0
    distinct = pc.unique(hours)
    moments = [datetime.fromtimestamp(h * 3600, tz=UTC) for h in distinct.to_pylist()]
    where = pc.index_in(hours, value_set=distinct)
    dt = pa.array([m.strftime("%Y-%m-%d") for m in moments], pa.string())
    hr = pa.array([m.strftime("%H") for m in moments], pa.string())
    return pc.take(dt, where), pc.take(hr, where)


def _parse_json(
    values: pa.Array, candidates: pa.Array, topic: TopicSchema, reasons: list[str | None]
) -> tuple[pa.Table, list[int]]:
    """Parse JSON values against the schema in bulk; isolate bad ones by bisection.

    Values are joined one per line, in Arrow, without a pass in Python. A raw newline
    byte can only be insignificant whitespace in valid JSON (inside a string it must
    be escaped), so it is replaced by a space first. A block that fails to parse is
    halved until each bad message stands alone, which costs O(bad x log n) parses and
    keeps the clean path at Arrow's speed.
    """
    options = pajson.ParseOptions(
        explicit_schema=topic.arrow, unexpected_field_behavior="ignore", newlines_in_values=False
    )
    longest = pc.max(pc.binary_length(values)).as_py() or 0
    read = pajson.ReadOptions(block_size=max(_JSON_BLOCK, longest * 2 + 1))
    # A scan of the raw bytes (memchr speed) decides whether the replacement is needed.
    data = values.buffers()[2]
    content = data.to_pybytes() if data is not None else b""
    for newline in (b"\n", b"\r"):
        if newline in content:
            values = pc.replace_substring(values, newline, b" ")
    tables: list[pa.Table] = []
    good: list[pa.Array] = []

    def parse(idx: pa.Array) -> None:
        body = values.take(idx)
        lines = pa.ListArray.from_arrays(pa.array([0, len(body)], pa.int32()), body)
        joined = pa.BufferReader(pc.binary_join(lines, b"\n")[0].as_buffer())
        error = ""
        try:
            table = pajson.read_json(joined, read_options=read, parse_options=options)
            if table.num_rows == len(idx):
                tables.append(table)
                good.append(idx)
                return
            error = "not one JSON object per message"
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            error = str(exc).splitlines()[0]
        if len(idx) == 1:
            reasons[idx[0].as_py()] = _json_reason(body[0].as_py(), error)
            return
        mid = len(idx) // 2
        parse(idx.slice(0, mid))
        parse(idx.slice(mid))

    if len(candidates):
        parse(candidates)
    if not tables:
        return topic.arrow.empty_table(), []
    parsed = pa.concat_tables([t.cast(topic.arrow) for t in tables])
    return parsed, pa.concat_arrays(good).to_pylist()


def _json_reason(value: bytes, error: str) -> str:
    """Why one message is not JSON for the schema, in plain words."""
    if not value.strip():
        return "empty value"
    try:
        value.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not valid JSON: not UTF-8 text (byte {exc.start})"
    nul = value.find(b"\x00")
    if nul >= 0:
        return f"not valid JSON: a NUL byte at position {nul}"
    # Arrow appends "in row 0" for the single-line parse; the row is always this message.
    detail = error.replace(" in row 0", "").strip() or "unparseable"
    return f"not valid JSON for the schema: {detail}"


def _parse_avro(
    values: list[Any], candidates: list[int], rules: DecodeRules, reasons: list[str | None]
) -> tuple[pa.Table, list[int]]:
    from fastavro import parse_schema, schemaless_reader

    parsed_schema = parse_schema(rules.topic.avro)
    records: list[dict[str, Any]] = []
    good: list[int] = []
    confluent = rules.format == "confluent_avro"
    for i in candidates:
        payload = values[i]
        if confluent:
            if len(payload) < 5 or payload[0] != 0:
                reasons[i] = "not in Confluent wire format (expected magic byte 0 and a schema id)"
                continue
            payload = payload[5:]
        try:
            buf = io.BytesIO(payload)
            record = schemaless_reader(buf, parsed_schema, None)
            if buf.tell() != len(payload):
                raise ValueError(f"{len(payload) - buf.tell()} trailing bytes after the record")
        except Exception as exc:  # noqa: BLE001 - any decoder failure is the message's fault
            reasons[i] = f"not valid Avro for the schema: {type(exc).__name__}: {exc}"
            continue
        if not isinstance(record, dict):
            reasons[i] = "not valid Avro for the schema: not a record"
            continue
        records.append(record)
        good.append(i)
    if not records:
        return rules.topic.arrow.empty_table(), []
    return pa.Table.from_pylist(records, schema=rules.topic.arrow), good


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


def _event_time_us(col: pa.ChunkedArray, rules: DecodeRules) -> pa.Array:
    """Event times as epoch microseconds (int64), null where absent or unreadable."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_timestamp(col.type):
        return col.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    if rules.event_unit == "iso8601":
        zone = ZoneInfo(rules.timezone)
        out: list[int | None] = []
        for text in col.to_pylist():
            out.append(_parse_iso_us(text, zone))
        return pa.array(out, pa.int64())
    as_float = pc.cast(col, pa.float64())
    per = _US_PER_UNIT[rules.event_unit]
    scaled = pc.divide(as_float, 1000.0) if per == 0 else pc.multiply(as_float, float(per))
    in_range = pc.and_(pc.greater(scaled, -float(_MAX_US)), pc.less(scaled, float(_MAX_US)))
    return pc.if_else(in_range, pc.cast(pc.floor(scaled), pa.int64()), pa.scalar(None, pa.int64()))


def _parse_iso_us(text: str | None, zone: ZoneInfo) -> int | None:
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=zone)
    return int(moment.timestamp() * 1_000_000)


def _check_event_time(
    event_us: pa.Array,
    kafka_ts: pa.ChunkedArray,
    idx: list[int],
    rules: DecodeRules,
    reasons: list[str | None],
) -> list[bool]:
    kafka_us = pc.multiply(kafka_ts.combine_chunks().cast(pa.int64()), 1000)
    missing = pc.is_null(event_us)
    too_early = pc.fill_null(pc.less(event_us, rules.min_valid_us), False)
    limit = pc.add(kafka_us, rules.max_future_skew_ms * 1000)
    too_far = pc.fill_null(pc.greater(event_us, limit), False)
    bad = pc.or_(pc.or_(missing, too_early), too_far)
    keep = [True] * len(idx)
    if not pc.any(bad).as_py():
        return keep
    events = event_us.to_pylist()
    kafka = kafka_us.to_pylist()
    missing_l, early_l = missing.to_pylist(), too_early.to_pylist()
    for pos in pc.indices_nonzero(bad).to_pylist():
        keep[pos] = False
        if missing_l[pos]:
            reasons[idx[pos]] = f"missing or unreadable event time `{rules.event_field}`"
        elif early_l[pos]:
            reasons[idx[pos]] = (
                f"event time {_iso(events[pos])} is before "
                f"{_iso(rules.min_valid_us)} (epoch zero or an unset clock)"
            )
        else:
            ahead = (events[pos] - kafka[pos]) // 1000
            reasons[idx[pos]] = (
                f"event time {_iso(events[pos])} is {human_duration(ahead)} ahead of its Kafka "
                f"timestamp {_iso(kafka[pos])} "
                f"(allowed skew {human_duration(rules.max_future_skew_ms)})"
            )
    return keep


def _iso(us: int) -> str:
    return datetime.fromtimestamp(us / 1_000_000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def human_duration(ms: int) -> str:
    """A duration in the largest fitting unit, e.g. `3.5h` or `2.0d`."""
    seconds = ms / 1000
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"


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
