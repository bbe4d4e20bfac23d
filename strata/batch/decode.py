"""Decode raw Kafka messages into typed rows, and quarantine what cannot be trusted.

Pure functions: Arrow in, Arrow out, no I/O. A message lands either as a row of the
data table or as a row of the quarantine table with its reason and raw bytes, never
neither, whatever its bytes (a tombstone, under `on_tombstone: skip` or `fail`, is
handed back by its coordinates instead, to be counted or refused): no value a
producer sends may make decoding raise, because a batch's plan is saved and resumed,
and a message that crashes a task would fail its batch on every re-run. Every check
is deterministic for a given message (the future-skew and lateness checks are
against the message's own Kafka timestamp, not the clock), so a re-run of a batch
routes every message exactly as the first run did.

The clean path stays in Arrow: a chunk is validated and parsed in bulk, and only
when a check fails does Python look at the messages one by one to say why.

The parts: the rules (`_rules`), JSON parsing and its reasons (`_json`), Avro
parsing (`_avro`), values checked against their types (`_values`) and event times
checked against the message's timestamp (`_event_time`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from strata.batch._avro import parse_avro
from strata.batch._event_time import check_event_time, event_time_us
from strata.batch._json import not_null_json, only_utf8, parse_json
from strata.batch._rules import DecodeRules
from strata.batch._values import check_required, conform, fill_defaults
from strata.schema.avro import QUARANTINE_SCHEMA
from strata.schema.partitions import event_partitions, field_partitions

__all__ = ["DecodeRules", "Decoded", "decode_chunk", "partition_stats"]


TombstoneRule = Literal["quarantine", "skip", "fail"]
"""What a null value does (`on_tombstone`)."""

TOMBSTONE_REASON = "empty value (tombstone)"

TOMBSTONE_SCHEMA = pa.schema(
    [
        pa.field("_topic", pa.string(), nullable=False),
        pa.field("_partition", pa.int32(), nullable=False),
        pa.field("_offset", pa.int64(), nullable=False),
    ]
)


@dataclass(frozen=True)
class Decoded:
    """The outcome of decoding one chunk of raw messages.

    Attributes:
        rows: Decoded rows in the data table's schema (partition columns included).
        quarantine: Rejected messages in the quarantine schema, each with its reason.
        tombstones: The coordinates (`_topic`, `_partition`, `_offset`) of the
            tombstones neither decoded nor quarantined, under a rule other than
            `quarantine`: to be counted as skipped, or to stop the batch.
    """

    rows: pa.Table
    quarantine: pa.Table
    tombstones: pa.Table = field(default_factory=lambda: TOMBSTONE_SCHEMA.empty_table())


# The raw message's fields each row of the table carries.
_COORDINATE_COLUMNS = ["_topic", "_partition", "_offset", "_kafka_ts", "_key", "_batch"]


def decode_chunk(
    raw: pa.Table,
    rules: DecodeRules,
    rejected: Mapping[int, str] | None = None,
    tombstones: TombstoneRule = "quarantine",
) -> Decoded:
    """Decode a chunk of raw messages.

    Args:
        raw: Messages in the raw table's schema (coordinates, `_value`, `_headers`, `_batch`).
        rules: The pipeline's decode rules.
        rejected: Row indices of `raw` to quarantine with the given reason whatever
            their value, e.g. messages whose headers the Kafka client could not read.
        tombstones: What a null value does (`on_tombstone`): `quarantine` it with the
            reason "empty value (tombstone)", or hand it back in `Decoded.tombstones`
            (`skip` and `fail` alike: the caller counts or refuses them).

    Returns:
        Rows, quarantined messages and tombstones handed back; together they hold every
        input message once.

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
    nulls = pc.indices_nonzero(pc.is_null(values)).to_pylist()
    if tombstones == "quarantine" or not nulls:
        for i in nulls:
            reasons[i] = reasons[i] or TOMBSTONE_REASON
        left_out: list[int] = []
    else:
        # A message rejected before decoding (its headers unreadable) is quarantined for
        # that, tombstone or not: only a readable tombstone follows the rule.
        left_out = [i for i in nulls if reasons[i] is None]

    if rules.format == "json":
        usable = only_utf8(values, usable, reasons)
        usable = not_null_json(values, usable, reasons)
        wire, parsed_idx = parse_json(values, pc.indices_nonzero(usable), rules, reasons)
    else:
        wire, parsed_idx = parse_avro(
            values.to_pylist(), pc.indices_nonzero(usable).to_pylist(), rules, reasons
        )
    parsed, parsed_idx = conform(wire, parsed_idx, rules, reasons)

    parsed = fill_defaults(parsed, rules.topic)
    keep_rows = check_required(parsed, parsed_idx, rules.topic, reasons)
    # Clean chunks, the usual case, keep every row: no filtering copy, no Python pass.
    if not all(keep_rows):
        parsed = parsed.filter(pa.array(keep_rows, pa.bool_()))
        parsed_idx = [i for i, k in zip(parsed_idx, keep_rows, strict=True) if k]

    # Only the coordinates travel on with the rows; the values were parsed. A chunk of
    # clean messages keeps every row, and needs no copy.
    coords = raw.select(_COORDINATE_COLUMNS)
    if len(parsed_idx) != raw.num_rows:
        coords = coords.take(pa.array(parsed_idx, pa.int64()))
    event_us, beyond = event_time_us(parsed.column(rules.event_field), rules)
    keep_rows = check_event_time(
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
    dropped = raw.take(pa.array(left_out, pa.int64())).select(TOMBSTONE_SCHEMA.names)
    return Decoded(rows=rows, quarantine=quarantine, tombstones=dropped.cast(TOMBSTONE_SCHEMA))


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
