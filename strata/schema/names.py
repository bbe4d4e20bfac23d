"""Which names a schema's fields may take: those the tables can hold as columns.

A field's name is its column's name in the data table, and Hive, Trino and Delta
compare column names without case. A field the tables would take for a partition
column, for one of Strata's own columns or for another field is refused wherever a
schema comes from: the configuration when it loads (each routed table's as it is
configured), and a schema a batch is read with at run time (`strata.schema.avro`).
A table following its registry subject leaves such a field out (`strata.schema.evolve`).

Plain Python, no Arrow: the configuration checks names when it loads, in processes
(Airflow's DAG files) that import nothing heavy.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

TIME_COLUMNS = ("dt", "hr")
"""The event-time partition columns, which no field of a schema may be named."""
OWN_COLUMNS = "names starting with '_', and 'dt' and 'hr' in any case"
"""The names a schema's fields may not take, in words."""

# The way out of a field name the tables cannot hold. Strata has no column mapping:
# the name a column has is the name its field has in the schema.
_RENAME_FIELD = (
    "rename the field in the schema file (Avro messages are read by field position, and a "
    'writer schema that still uses the old name resolves through the field\'s "aliases": '
    "list the old name there; JSON messages are read by field name, so producers must send "
    "the new one)"
)


def is_own_column(name: str) -> bool:
    """Whether a field name is one the tables keep for their own columns, in any case.

    Coordinates and Strata's columns start with `_` (`_offset`, `_event_time`,
    `_batch`); `dt` and `hr` are the event-time partitions. Hive, Trino and Delta
    compare column names without case, so `DT` is `dt` to them. A field partition's
    column (`p_<field>`) depends on the pipeline (`PartitioningConfig`).
    """
    return name.startswith("_") or name.lower() in TIME_COLUMNS


def name_clashes(avro: Any, partition_columns: Collection[str] = ()) -> str | None:  # noqa: ANN401 - Avro schemas are JSON
    """What in a schema's field names the tables cannot hold, as Hive, Trino and Delta compare them.

    They compare column names without case: a field `DT` is the partition column `dt`
    to them (the metastore would list `dt` twice, and queries read the field's values
    for the partition's), and fields `user` and `User` of one record are one column.
    Refused: a top-level field named as one of Strata's own columns (`is_own_column`)
    or as one of `partition_columns`, and two fields of one record, at any depth,
    whose names differ only in case.

    Args:
        avro: An Avro record schema, as parsed from JSON; anything that is not one has
            no clashes here (the schema check says what it is).
        partition_columns: The data table's partition columns; `dt` and `hr` are
            refused whatever they are (a field partition's `p_<field>` depends on it).

    Returns:
        Each field that clashes, with what it clashes with and the way out (to follow
        the schema's path in a message); None if none does.
    """
    reserved = {column.lower(): column for column in (*TIME_COLUMNS, *partition_columns)}
    problems = []
    folded = False
    for name in (f["name"] for f in _fields(avro)):
        if name.startswith("_"):
            problems.append(
                f"field `{name}` starts with '_', as Strata's own columns do "
                f"({', '.join(f'`{c}`' for c in _OWN_EXAMPLES)}, ...)"
            )
        elif name.lower() in reserved:
            column = reserved[name.lower()]
            which = "event-time partition" if column in TIME_COLUMNS else "partition"
            problems.append(f"field `{name}` is the {which} column `{column}`")
            folded = folded or name != column
    twins = _case_twins(avro, "")
    if not problems and not twins:
        return None
    text = "; ".join(problems + twins)
    if folded or twins:
        text += " (Hive, Trino and Delta compare column names without case)"
    return f"{text}; {_RENAME_FIELD}"


# Strata's own columns, as the message about a field starting with '_' names them.
_OWN_EXAMPLES = ("_topic", "_partition", "_offset", "_kafka_ts", "_key", "_event_time", "_batch")


def _fields(record: Any) -> list[dict[str, Any]]:  # noqa: ANN401 - Avro schemas are JSON
    """The field entries of a record schema that have a name; none for anything else."""
    fields = record.get("fields") if isinstance(record, dict) else None
    if not isinstance(fields, list):
        return []
    return [f for f in fields if isinstance(f, dict) and isinstance(f.get("name"), str)]


def _case_twins(record: Any, prefix: str) -> list[str]:  # noqa: ANN401 - Avro schemas are JSON
    """Fields of a record, and of the records nested in it, whose names differ only in case."""
    problems = []
    seen: dict[str, str] = {}
    for field in _fields(record):
        name = field["name"]
        first = seen.setdefault(name.lower(), name)
        if first != name:
            problems.append(f"fields `{prefix}{first}` and `{prefix}{name}` are one column")
    for field in _fields(record):
        for inner in _nested_records(field.get("type")):
            problems += _case_twins(inner, f"{prefix}{field['name']}.")
    return problems


def _nested_records(avro_type: Any) -> list[dict[str, Any]]:  # noqa: ANN401 - Avro schemas are JSON
    """The record schemas an Avro type is, or holds (in a union, an array, a map)."""
    if isinstance(avro_type, list):
        return [r for branch in avro_type for r in _nested_records(branch)]
    if not isinstance(avro_type, dict):
        return []
    kind = avro_type.get("type")
    if kind == "record":
        return [avro_type]
    if kind == "array":
        return _nested_records(avro_type.get("items"))
    if kind == "map":
        return _nested_records(avro_type.get("values"))
    return []
