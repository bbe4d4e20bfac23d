"""Decoded values checked against their Avro types, and brought to the table's types.

A value the table's column could not hold faithfully (an Avro int beyond 32 bits, a
date beyond year 9999, a decimal with too many digits, a JSON NaN, a missing required
field) sends its message to quarantine with the field named. Checks run on whole
columns in Arrow; only the values found wrong are looked at in Python.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from strata.batch._rules import MAX_US, MIN_US, DecodeRules, quote, quote_reason
from strata.schema.avro import TopicSchema, decimal_digits, logical_type, non_null

# Range of each logical type's underlying number, and how to say it.
_RANGES: dict[str, tuple[int, int, str]] = {
    "int": (-(2**31), 2**31 - 1, "int (32 bits)"),
    "date": (-719_162, 2_932_896, "date (days from 1970-01-01; 0001-01-01 to 9999-12-31)"),
    "time-millis": (0, 86_399_999, "time-millis (a time of day: 0 to 86399999)"),
    "time-micros": (0, 86_399_999_999, "time-micros (a time of day: 0 to 86399999999)"),
    "timestamp-millis": (
        MIN_US // 1000,
        MAX_US // 1000,
        "timestamp-millis (0001-01-01 to 9999-12-31T23:59:59Z)",
    ),
    "timestamp-micros": (MIN_US, MAX_US, "timestamp-micros (0001-01-01 to 9999-12-31T23:59:59Z)"),
    "local-timestamp-millis": (
        MIN_US // 1000,
        MAX_US // 1000,
        "local-timestamp-millis (0001-01-01 to 9999-12-31T23:59:59)",
    ),
    "local-timestamp-micros": (
        MIN_US,
        MAX_US,
        "local-timestamp-micros (0001-01-01 to 9999-12-31T23:59:59)",
    ),
}
_UUID = r"^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$"

# (position in the array checked, reason): what a check found wrong.
Findings = list[tuple[int, str]]


def conform(
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
            return quote_reason(f"field `{name}` holds a value its column cannot: {detail}")
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
        return arr, _where(arr, bad, lambda v: f"field `{path}`: {quote(repr(v))} is not a UUID")
    if kind == "enum" and fmt == "json":
        symbols = avro_type.get("symbols", [])
        bad = pc.and_(
            pc.is_valid(arr), pc.invert(pc.is_in(arr, value_set=pa.array(symbols, pa.string())))
        )
        listed = quote(", ".join(symbols))
        return arr, _where(
            arr,
            bad,
            lambda v: f"field `{path}`: {quote(repr(v))} is not a symbol of the enum ({listed})",
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


def fill_defaults(parsed: pa.Table, topic: TopicSchema) -> pa.Table:
    """The rows with each absent value of a field that has a default set to it."""
    for name, default in topic.defaults.items():
        col = parsed.column(name)
        if col.null_count:
            fill = pa.scalar(default, type=col.type)
            parsed = parsed.set_column(
                parsed.schema.get_field_index(name), name, pc.fill_null(col, fill)
            )
    return parsed


def check_required(
    parsed: pa.Table, idx: list[int], topic: TopicSchema, reasons: list[str | None]
) -> list[bool]:
    """Which rows to keep: those missing a required field get a reason, and are not."""
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
