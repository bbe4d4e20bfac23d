"""Trino DDL for a pipeline's tables, as `strata sql ddl` prints it.

Every identifier is quoted and every literal escaped, and names that reach SQL were
already validated by the config (pipeline, database, topics) or by the Avro schema
(field names), so nothing from config or data can change a statement's meaning.
"""

from __future__ import annotations

import pyarrow as pa

from strata.config import PipelineConfig
from strata.ledger import LEDGER_SCHEMA
from strata.schema import TABLE_SUFFIXES, table_layout


def quote_identifier(name: str) -> str:
    """A Trino identifier, double-quoted with inner quotes doubled."""
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value: str) -> str:
    """A Trino string literal, single-quoted with inner quotes doubled."""
    return "'" + value.replace("'", "''") + "'"


def trino_type(kind: pa.DataType) -> str:
    """The Trino type of an Arrow type, as Trino reads it from Parquet.

    Raises:
        ValueError: For a type Trino has no column type for, e.g. a decimal above 38
            digits.
    """
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
    if pa.types.is_decimal(kind):
        if kind.precision > 38:
            raise ValueError(f"no Trino type for {kind}: Trino decimals hold at most 38 digits")
        return f"decimal({kind.precision}, {kind.scale})"
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


def trino_statements(cfg: PipelineConfig) -> list[str]:
    """What to run in Trino after registering, for `trino.url`.

    Parquet tables: `sync_partition_metadata`, so Trino's Hive catalog sees partitions
    added since its metastore cache was filled. Delta tables: nothing, since the
    metastore entry is all Trino's Delta catalog needs, unless that catalog uses
    another metastore (`trino.register_delta_tables`): then `register_table`.
    """
    database = quote_literal(cfg.metastore.database)
    if cfg.table_format == "parquet":
        catalog = quote_identifier(cfg.trino.hive_catalog)
        args = f"{database}, {quote_literal(cfg.name)}, 'ADD'"
        return [f"CALL {catalog}.system.sync_partition_metadata({args})"]
    if not cfg.trino.register_delta_tables:
        return []
    catalog = quote_identifier(cfg.trino.delta_catalog)
    return [
        f"CALL {catalog}.system.register_table(schema_name => {database}, "
        f"table_name => {quote_literal(cfg.name + suffix)}, "
        f"table_location => {quote_literal(_uri(cfg.location(which)))})"
        for which, suffix in TABLE_SUFFIXES.items()
    ]


def run_in_trino(cfg: PipelineConfig, statements: list[str]) -> list[str]:
    """Run statements in Trino; a table registered already is not an error.

    Returns:
        The statements that ran.

    Raises:
        MetastoreError: If Trino cannot be reached or refuses a statement.
    """
    import trino
    from trino.exceptions import TrinoQueryError

    from strata.errors import MetastoreError

    url = cfg.trino.url
    assert url is not None
    scheme, _, rest = url.partition("://")
    host, _, port = rest.rstrip("/").partition(":")
    ran = []
    try:
        # The trino client is not annotated.
        with trino.dbapi.connect(  # type: ignore[no-untyped-call]
            host=host,
            port=int(port or (443 if scheme == "https" else 8080)),
            user=cfg.trino.user,
            http_scheme=scheme,
            request_timeout=cfg.trino.timeout_s,
        ) as conn:
            cursor = conn.cursor()
            for statement in statements:
                try:
                    cursor.execute(statement)
                    cursor.fetchall()
                except TrinoQueryError as exc:
                    if exc.error_name != "ALREADY_EXISTS":
                        raise
                ran.append(statement)
    except (TrinoQueryError, OSError) as exc:
        raise MetastoreError(f"Trino at {url}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the client raises requests' errors too
        raise MetastoreError(f"Trino at {url}: {type(exc).__name__}: {exc}") from None
    return ran


def pipeline_ddl(
    cfg: PipelineConfig, delta_catalog: str = "delta", hive_catalog: str = "hive"
) -> str:
    """Trino statements that make a pipeline's tables queryable.

    Delta tables are registered in the Delta Lake catalog; plain Parquet tables are
    created in the Hive catalog, and their partitions synchronised from storage.
    `strata register` does the same through the metastore; these statements are for
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
                    f"table_location => {quote_literal(_uri(cfg.location(which)))}",
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
            f"external_location = {quote_literal(_uri(cfg.location(which)))}",
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
