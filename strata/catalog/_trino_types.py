"""The embedded engine in Trino's types: what each connector reads, and what Trino refuses.

DuckDB reads the tables' files; Trino reads them through a connector, with the types the
connector gives them, and is strict where DuckDB bends. Two differences change answers:

- **Timestamps.** The Delta Lake connector reads a `timestamp` (with a zone) as
  `timestamp(3) with time zone`, and a `timestamp_ntz` at microseconds; the Hive
  connector (plain Parquet) reads every timestamp as `timestamp(3)`, without a zone (its
  `hive.timestamp-precision`, milliseconds by default); the Iceberg connector reads them
  at microseconds. Where they cut precision both round half up (`…01.337861` reads as
  `…01.338`). So each table's view gives its timestamps as the connector serving it
  gives them (`view_select`), and every function and comparison then sees what Trino's
  would.
- **Comparisons.** Trino compares a string only with a string: `dt = DATE '2026-12-01'`,
  `hr = 5`, `_event_time >= '2026-12-01'` and `user_id = '3'` are refused ("Cannot apply
  operator: varchar = date"), where DuckDB casts a side and answers. A comparison, an IN
  list or a BETWEEN range that sets a string against a number, a date or time or a
  boolean is refused here too (`check_comparisons`), the types found by sqlglot from the
  tables' columns.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

import pyarrow as pa
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify

from strata.catalog.types import quote_identifier
from strata.errors import QueryError
from strata.log import get_logger

logger = get_logger(__name__)

ReadAs = Literal["delta", "iceberg", "parquet"]
"""How Trino reads a table: through its Delta Lake, Iceberg or (plain Parquet) Hive connector."""


def view_select(schema: pa.Schema, read_as: ReadAs) -> str:
    """The select list of a table's view: its columns as Trino's connector reads them.

    Args:
        schema: The columns DuckDB reads from the table's files.
        read_as: The connector that reads the table in Trino.

    Returns:
        `*`, or `* REPLACE (...)` with the timestamps that connector reads otherwise.
    """
    replaced = []
    for field in schema:
        value = _as_read(quote_identifier(field.name), field.type, read_as)
        if value is not None:
            replaced.append(f"{value} AS {quote_identifier(field.name)}")
    return f"* REPLACE ({', '.join(replaced)})" if replaced else "*"


def _as_read(column: str, kind: pa.DataType, read_as: ReadAs) -> str | None:
    """A timestamp column as the connector reads it, or None where DuckDB reads it so."""
    if not pa.types.is_timestamp(kind) or read_as == "iceberg":
        return None
    zoned = kind.tz is not None
    if read_as == "delta" and not zoned:
        return None
    finer = kind.unit in ("us", "ns")
    if read_as == "delta":
        # With its zone: DuckDB's session is in UTC, as the instants are.
        return f"CAST({_to_millis(column)} AS TIMESTAMPTZ)" if finer else None
    # The Hive connector: milliseconds, and the UTC wall clock without its zone.
    if finer:
        return _to_millis(column)
    return f"CAST({column} AS TIMESTAMP)" if zoned else None


def _to_millis(column: str) -> str:
    """A timestamp rounded half up to milliseconds, as a TIMESTAMP (UTC wall clock).

    On the epoch's microseconds, with a modulo that is never negative: before 1970 too,
    half a millisecond rounds up, as Trino rounds.
    """
    shifted = f"(epoch_us({column}) + 500)"
    return f"make_timestamp({shifted} - ((({shifted} % 1000) + 1000) % 1000))"


# The kinds of type Trino never compares with a string, nor a string with.
_NOT_TEXT = exp.DataType.NUMERIC_TYPES | exp.DataType.TEMPORAL_TYPES | {exp.DataType.Type.BOOLEAN}
_COMPARISONS = (
    exp.EQ,
    exp.NEQ,
    exp.GT,
    exp.GTE,
    exp.LT,
    exp.LTE,
    exp.NullSafeEQ,
    exp.NullSafeNEQ,
    exp.In,
    exp.Between,
)


def check_comparisons(
    tree: exp.Expr,
    columns: Mapping[tuple[str, str, str], pa.Schema],
    catalog: str,
    database: str,
) -> None:
    """Refuse a comparison Trino refuses: a string set against a number, date, time or boolean.

    Args:
        tree: The query, parsed as Trino SQL (not changed).
        columns: Each table's columns, by (catalog, database, name).
        catalog: The session's catalog.
        database: The session's schema.

    Raises:
        QueryError: Naming the comparison and both types, as Trino does, and what to write.
    """
    schema: dict[str, object] = {}
    for (in_catalog, in_database, name), arrow in columns.items():
        typed = {f.name: spelled for f in arrow if (spelled := _sqlglot_type(f.type)) is not None}
        databases: Any = schema.setdefault(in_catalog, {})
        databases.setdefault(in_database, {})[name] = typed
    try:
        qualified = qualify(
            tree.copy(),
            schema=schema,
            dialect="trino",
            catalog=catalog,
            db=database,
            validate_qualify_columns=False,
            quote_identifiers=False,
            expand_stars=False,
        )
        typed_tree = annotate_types(qualified, schema=schema, dialect="trino")
    except (SqlglotError, KeyError, ValueError) as exc:
        # What sqlglot cannot resolve, DuckDB reports as it runs (an unknown column).
        logger.debug("the query's types are not known (%s): comparisons not checked", exc)
        return
    for node in typed_tree.find_all(*_COMPARISONS):
        if isinstance(node, exp.In):
            sides = [node.this, *node.expressions]
        elif isinstance(node, exp.Between):
            sides = [node.this, node.args["low"], node.args["high"]]
        else:
            sides = [node.this, node.expression]
        if _clash(sides):
            raise QueryError(_refusal(node, [_trino_name(s.type) for s in sides]))


def _clash(sides: Iterable[exp.Expr]) -> bool:
    """Whether the sides set a string against a number, a date or time, or a boolean."""
    kinds = {s.type.this for s in sides if s.type is not None}
    return bool(kinds & exp.DataType.TEXT_TYPES) and bool(kinds & _NOT_TEXT)


def _trino_name(kind: exp.DataType | None) -> str:
    """A type as Trino names it in its refusals: varchar, date, timestamp with time zone."""
    return "unknown" if kind is None else kind.sql("trino").lower()


_OPERATORS: dict[type[exp.Expr], str] = {
    exp.EQ: "=",
    exp.NEQ: "<>",
    exp.GT: ">",
    exp.GTE: ">=",
    exp.LT: "<",
    exp.LTE: "<=",
    exp.NullSafeEQ: "IS NOT DISTINCT FROM",
    exp.NullSafeNEQ: "IS DISTINCT FROM",
}


def _refusal(node: exp.Expr, types: list[str]) -> str:
    """The refusal: what Trino says of the comparison, and how to write it."""
    if isinstance(node, exp.In):
        said = f"IN value and list items must be the same type: {', '.join(dict.fromkeys(types))}"
    elif isinstance(node, exp.Between):
        said = f"Cannot check if {types[0]} is BETWEEN {types[1]} and {types[2]}"
    else:
        said = f"Cannot apply operator: {types[0]} {_OPERATORS[type(node)]} {types[1]}"
    return (
        f"Trino refuses this query ({said}): it compares a string only with a string, and "
        "the embedded engine answers only what Trino would. Compare like with like: the "
        "partition columns dt and hr are strings (dt = '2026-12-01', hr = '05'), or cast a "
        "side (CAST(dt AS date), CAST(hr AS integer))"
    )


def _sqlglot_type(kind: pa.DataType) -> str | None:
    """An Arrow type as sqlglot's types spell it, for the kinds a comparison can clash on."""
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "VARCHAR"
    if pa.types.is_boolean(kind):
        return "BOOLEAN"
    if pa.types.is_integer(kind):
        return "BIGINT" if kind.bit_width == 64 else "INT"
    if pa.types.is_floating(kind):
        return "DOUBLE"
    if pa.types.is_decimal(kind):
        return f"DECIMAL({kind.precision}, {kind.scale})"
    if pa.types.is_date(kind):
        return "DATE"
    if pa.types.is_timestamp(kind):
        return "TIMESTAMPTZ" if kind.tz is not None else "TIMESTAMP"
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return "VARBINARY"
    return None
