"""Trino DDL for a pipeline's tables, as `strata sql ddl` prints it.

Every identifier is quoted and every literal escaped, and names that reach SQL were
already validated by the config (pipeline, database, topics) or by the Avro schema
(field names), so nothing from config or data can change a statement's meaning.
"""

from __future__ import annotations

import pyarrow as pa

from strata.config import PipelineConfig
from strata.ledger import LEDGER_SCHEMA
from strata.publish import TABLE_SUFFIXES
from strata.schema import table_layout


def quote_identifier(name: str) -> str:
    """A Trino identifier, double-quoted with inner quotes doubled."""
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value: str) -> str:
    """A Trino string literal, single-quoted with inner quotes doubled."""
    return "'" + value.replace("'", "''") + "'"


def trino_type(kind: pa.DataType) -> str:
    """The Trino type of an Arrow type, as Trino reads it from Parquet."""
    simple = {
        pa.int8(): "tinyint",
        pa.int16(): "smallint",
        pa.int32(): "integer",
        pa.int64(): "bigint",
        pa.float32(): "real",
        pa.float64(): "double",
        pa.bool_(): "boolean",
        pa.string(): "varchar",
        pa.binary(): "varbinary",
        pa.date32(): "date",
    }
    if kind in simple:
        return simple[kind]
    if pa.types.is_timestamp(kind):
        return "timestamp(6)" if kind.unit in ("us", "ns") else "timestamp(3)"
    if pa.types.is_list(kind):
        return f"array({trino_type(kind.value_type)})"
    if pa.types.is_map(kind):
        return f"map({trino_type(kind.key_type)}, {trino_type(kind.item_type)})"
    if pa.types.is_struct(kind):
        fields = ", ".join(
            f"{quote_identifier(kind.field(i).name)} {trino_type(kind.field(i).type)}"
            for i in range(kind.num_fields)
        )
        return f"row({fields})"
    raise ValueError(f"no Trino type for Arrow type {kind}")


def _uri(location: str) -> str:
    return location if "://" in location else f"file://{location}"


def pipeline_ddl(
    cfg: PipelineConfig, delta_catalog: str = "delta", hive_catalog: str = "hive"
) -> str:
    """Trino statements that make a pipeline's tables queryable.

    Delta tables are registered in the Delta Lake catalog; plain Parquet tables are
    created in the Hive catalog, and their partitions synchronised from storage.
    `strata publish` does the same through the metastore; these statements are for
    a Trino whose catalogs point at another metastore, or for review.

    Args:
        cfg: The pipeline configuration.
        delta_catalog: Name of Trino's Delta Lake catalog.
        hive_catalog: Name of Trino's Hive catalog.

    Returns:
        Semicolon-terminated statements, one per paragraph.
    """
    schema = quote_identifier(cfg.metastore.database)
    out = [f"-- Tables of pipeline {cfg.name} ({cfg.table_format})"]
    if cfg.table_format == "delta":
        catalog = quote_identifier(delta_catalog)
        out.append(f"CREATE SCHEMA IF NOT EXISTS {catalog}.{schema};")
        for which, suffix in TABLE_SUFFIXES.items():
            args = ", ".join(
                [
                    f"schema_name => {quote_literal(cfg.metastore.database)}",
                    f"table_name => {quote_literal(cfg.name + suffix)}",
                    f"table_location => {quote_literal(_uri(cfg.location(which)))}",  # type: ignore[arg-type]
                ]
            )
            out.append(f"CALL {catalog}.system.register_table({args});")
        return "\n\n".join(out) + "\n"
    catalog = quote_identifier(hive_catalog)
    out.append(f"CREATE SCHEMA IF NOT EXISTS {catalog}.{schema};")
    for which, suffix in TABLE_SUFFIXES.items():
        arrow, partition_by = (LEDGER_SCHEMA, []) if which == "ledger" else table_layout(cfg, which)
        name = f"{catalog}.{schema}.{quote_identifier(cfg.name + suffix)}"
        columns = ",\n".join(f"  {quote_identifier(f.name)} {trino_type(f.type)}" for f in arrow)
        props = [
            f"external_location = {quote_literal(_uri(cfg.location(which)))}",  # type: ignore[arg-type]
            "format = 'PARQUET'",
        ]
        if partition_by:
            keys = ", ".join(quote_literal(c) for c in partition_by)
            props.append(f"partitioned_by = ARRAY[{keys}]")
        out.append(
            f"CREATE TABLE IF NOT EXISTS {name} (\n{columns}\n)\nWITH (\n  "
            + ",\n  ".join(props)
            + "\n);"
        )
    sync = ", ".join([quote_literal(cfg.metastore.database), quote_literal(cfg.name), "'ADD'"])
    out.append(f"CALL {catalog}.system.sync_partition_metadata({sync});")
    return "\n\n".join(out) + "\n"
