"""Column types in SQL: each Arrow type as Hive and Trino spell it, by one walk.

The metastore's Parquet tables declare Hive types; the DDL Strata prints for Trino
declares Trino's. Both readers map Parquet's types the same way, so one walk over the
Arrow type decides for both, and only the spelling differs. Trino's Hive connector
(`trino_hive`) spells Trino's types but for timestamps: it reads each at the one
precision it is configured with (`hive.timestamp-precision`, milliseconds by default)
and refuses a table declaring another.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import pyarrow as pa

Dialect = Literal["hive", "trino", "trino_hive"]


@dataclass(frozen=True)
class _Spelling:
    """How a dialect spells each kind of type."""

    simple: dict[pa.DataType, str]
    timestamp_ms: str
    timestamp_us: str
    decimal: str
    array: str
    map: str
    struct: str
    field: str
    separator: str


def quote_identifier(name: str) -> str:
    """A Trino identifier, double-quoted with inner quotes doubled."""
    return '"' + name.replace('"', '""') + '"'


_SPELLINGS: dict[Dialect, _Spelling] = {
    "hive": _Spelling(
        simple={
            pa.int8(): "tinyint",
            pa.int16(): "smallint",
            pa.int32(): "int",
            pa.int64(): "bigint",
            pa.float32(): "float",
            pa.float64(): "double",
            pa.bool_(): "boolean",
            pa.string(): "string",
            pa.large_string(): "string",
            pa.binary(): "binary",
            pa.large_binary(): "binary",
            pa.date32(): "date",
        },
        timestamp_ms="timestamp",
        timestamp_us="timestamp",
        decimal="decimal({precision},{scale})",
        array="array<{item}>",
        map="map<{key},{value}>",
        struct="struct<{fields}>",
        field="{name}:{type}",
        separator=",",
    ),
    "trino": _Spelling(
        simple={
            pa.int8(): "tinyint",
            pa.int16(): "smallint",
            pa.int32(): "integer",
            pa.int64(): "bigint",
            pa.float32(): "real",
            pa.float64(): "double",
            pa.bool_(): "boolean",
            pa.string(): "varchar",
            pa.large_string(): "varchar",
            pa.binary(): "varbinary",
            pa.large_binary(): "varbinary",
            pa.date32(): "date",
        },
        timestamp_ms="timestamp(3)",
        timestamp_us="timestamp(6)",
        decimal="decimal({precision}, {scale})",
        array="array({item})",
        map="map({key}, {value})",
        struct="row({fields})",
        field="{quoted} {type}",
        separator=", ",
    ),
}
_NAMES: dict[Dialect, str] = {"hive": "Hive", "trino": "Trino", "trino_hive": "Trino"}
_SPELLINGS["trino_hive"] = replace(_SPELLINGS["trino"], timestamp_us="timestamp(3)")


def sql_type(kind: pa.DataType, dialect: Dialect) -> str:
    """The column type of an Arrow type in a SQL dialect, as it reads it from Parquet.

    Args:
        kind: The Arrow type.
        dialect: `hive` (the metastore's tables), `trino`, or `trino_hive` (Trino's
            Hive connector: the DDL of plain Parquet tables).

    Returns:
        The type as the dialect writes it.

    Raises:
        ValueError: For a type the dialect has no column type for, e.g. a decimal above
            38 digits.
    """
    spell = _SPELLINGS[dialect]
    if kind in spell.simple:
        return spell.simple[kind]
    if pa.types.is_timestamp(kind):
        return spell.timestamp_us if kind.unit in ("us", "ns") else spell.timestamp_ms
    if pa.types.is_decimal(kind):
        if kind.precision > 38:
            name = _NAMES[dialect]
            raise ValueError(f"no {name} type for {kind}: {name} decimals hold at most 38 digits")
        return spell.decimal.format(precision=kind.precision, scale=kind.scale)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return spell.array.format(item=sql_type(kind.value_type, dialect))
    if pa.types.is_map(kind):
        key, value = sql_type(kind.key_type, dialect), sql_type(kind.item_type, dialect)
        return spell.map.format(key=key, value=value)
    if pa.types.is_struct(kind):
        fields = spell.separator.join(
            spell.field.format(
                name=kind.field(i).name,
                quoted=quote_identifier(kind.field(i).name),
                type=sql_type(kind.field(i).type, dialect),
            )
            for i in range(kind.num_fields)
        )
        return spell.struct.format(fields=fields)
    raise ValueError(f"no {_NAMES[dialect]} type for Arrow type {kind}")
