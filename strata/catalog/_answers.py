"""A query's answer as people and programs read it: an aligned table, CSV or JSON.

Pure: the rows are Python values as DuckDB's and Trino's clients return them
(numbers, `Decimal`, strings, `bytes`, dates and times, lists, maps and rows).
"""

from __future__ import annotations

import base64
import csv
import io
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Literal

AnswerFormat = Literal["table", "csv", "json"]
FORMATS: tuple[AnswerFormat, ...] = ("table", "csv", "json")


@dataclass(frozen=True)
class QueryAnswer:
    """The columns and rows a query answered.

    Attributes:
        columns: The columns' names, in order.
        rows: The rows, each a value per column.
    """

    columns: list[str]
    rows: list[tuple[Any, ...]]

    def records(self) -> list[dict[str, Any]]:
        """The rows as objects keyed by column, JSON-ready (see `json_value`)."""
        return [
            {c: json_value(v) for c, v in zip(self.columns, row, strict=True)} for row in self.rows
        ]


def render_answer(answer: QueryAnswer, fmt: AnswerFormat) -> str:
    """The answer as text, without a final newline.

    Args:
        answer: The answer.
        fmt: `table` (aligned columns under a header, numbers to the right, then the
            row count), `csv` (a header line, then a line a row; NULL is empty) or
            `json` (a list of objects; timestamps in ISO-8601).
    """
    if fmt == "json":
        return json.dumps(answer.records(), indent=1)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(answer.columns)
        writer.writerows([_text(v, null="") for v in row] for row in answer.rows)
        return out.getvalue().rstrip("\n")
    return _aligned(answer)


def json_value(value: Any) -> Any:  # noqa: ANN401 - any value a query returns
    """A value as JSON holds it.

    Times in ISO-8601 (with their offset where they have one), exact decimals as
    numbers when whole and as strings otherwise (a float would change them), binary
    as base64, NaN and infinities as strings, nested lists and maps element by element.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else str(value)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return _duration(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, Mapping):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    return str(value)


def _duration(value: timedelta) -> str:
    """An interval in ISO-8601: `P1DT2H3M4.5S`."""
    seconds = value.total_seconds()
    sign = "-" if seconds < 0 else ""
    days, rest = divmod(abs(seconds), 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, rest = divmod(rest, 60)
    clock = "".join(f"{n:g}{unit}" for n, unit in ((hours, "H"), (minutes, "M"), (rest, "S")) if n)
    return f"{sign}P{int(days)}D" + (f"T{clock}" if clock else "")


def _text(value: Any, null: str) -> str:  # noqa: ANN401 - any value a query returns
    """A value as one cell of text: the CSV's and the aligned table's."""
    if value is None:
        return null
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(json_value(value), separators=(",", ":"))
    if isinstance(value, timedelta):
        return _duration(value)
    return str(value)


def _aligned(answer: QueryAnswer) -> str:
    """Columns aligned under a header, numbers to the right, as Trino's CLI shows them."""
    cells = [[_text(v, null="NULL").replace("\n", "\\n") for v in row] for row in answer.rows]
    widths = [
        max([len(name), *(len(row[i]) for row in cells)]) for i, name in enumerate(answer.columns)
    ]
    numeric = [
        bool(answer.rows) and all(_is_number(row[i]) for row in answer.rows if row[i] is not None)
        for i in range(len(answer.columns))
    ]

    def line(values: list[str]) -> str:
        padded = [
            v.rjust(w) if right else v.ljust(w)
            for v, w, right in zip(values, widths, numeric, strict=True)
        ]
        return " " + " | ".join(padded).rstrip()

    out = [
        line([n.center(w) for n, w in zip(answer.columns, widths, strict=True)]),
        "-" + "-+-".join("-" * w for w in widths) + "-",
        *(line(row) for row in cells),
    ]
    count = len(answer.rows)
    out.append(f"({count} row{'' if count == 1 else 's'})")
    return "\n".join(out)


def _is_number(value: Any) -> bool:  # noqa: ANN401 - any value a query returns
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)
