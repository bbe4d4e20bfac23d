"""JSON messages parsed against the table's schema, and why one is not.

The clean path stays in Arrow: a chunk's values are validated and parsed in bulk,
and a block that fails is halved until each bad message stands alone, to be told
why in plain words.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from strata.batch._rules import DecodeRules, quote
from strata.schema.avro import TopicSchema

_JSON_BLOCK = 8 << 20


def only_utf8(values: pa.Array, usable: pa.Array, reasons: list[str | None]) -> pa.Array:
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


def not_null_json(values: pa.Array, usable: pa.Array, reasons: list[str | None]) -> pa.Array:
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


def parse_json(
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
            return f"not valid JSON for the schema: {where}{quote(text)} is out of range for {kind}"
        return f"not valid JSON for the schema: {where}{quote(text)} is not written as an integer"
    if "Number too big to be stored in double" in error:
        where, number = _json_field(value, fields, _beyond_double)
        return (
            f"not valid JSON for the schema: {where}{quote(number or 'a number')} is beyond "
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
            f"not valid JSON for the schema: {where}{quote(text)} has more {much} than {kind} holds"
        )
    not_decimal = re.search(r"The string '(.*)' is not a valid (decimal\d+) number", error)
    if not_decimal:
        text, kind = not_decimal.groups()
        where, _ = _json_field(value, fields, lambda n: n == text)
        return f"not valid JSON for the schema: {where}{quote(repr(text))} is not a {kind} number"
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
