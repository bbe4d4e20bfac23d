"""Trino DDL for a pipeline's tables, as `strata sql ddl` prints it.

Every identifier is quoted and every literal escaped, and names that reach SQL were
already validated by the config (pipeline, database, topics) or by the Avro schema
(field names), so nothing from config or data can change a statement's meaning.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from strata.catalog.types import quote_identifier, sql_type
from strata.config import MetastoreConfig, SchemaSpec, TrinoConfig
from strata.config.secrets import redact
from strata.schema.avro import TABLE_SUFFIXES, table_layout
from strata.store.ledger import LEDGER_SCHEMA
from strata.store.places import Places


def quote_literal(value: str) -> str:
    """A Trino string literal, single-quoted with inner quotes doubled."""
    return "'" + value.replace("'", "''") + "'"


def trino_type(kind: pa.DataType) -> str:
    """The Trino type of an Arrow type, as Trino reads it from Parquet (`sql_type`).

    Raises:
        ValueError: For a type Trino has no column type for.
    """
    return sql_type(kind, "trino")


def _uri(location: str) -> str:
    return location if "://" in location else f"file://{location}"


def trino_statements(
    places: Places, metastore: MetastoreConfig, settings: TrinoConfig
) -> list[str]:
    """What to run in Trino after registering, for `trino.url`.

    Parquet tables: `sync_partition_metadata`, so Trino's Hive catalog sees partitions
    added since its metastore cache was filled. Delta tables: nothing, since the
    metastore entry is all Trino's Delta catalog needs, unless that catalog uses
    another metastore (`trino.register_delta_tables`): then `register_table`.

    Args:
        places: The pipeline's tables: their names, locations and format.
        metastore: The metastore settings (the database).
        settings: The `trino` settings (the catalogs).
    """
    database = quote_literal(metastore.database)
    if places.format == "iceberg":
        # Trino's Iceberg catalog on this metastore reads each table's entry, which
        # every commit keeps; on another metastore, the tables are registered there.
        if not settings.register_delta_tables:
            return []
        return _register(places, metastore, settings.delta_catalog, settings.iceberg_catalog)
    if places.format == "parquet":
        catalog = quote_identifier(settings.hive_catalog)
        args = f"{database}, {quote_literal(places.pipeline)}, 'ADD'"
        return [f"CALL {catalog}.system.sync_partition_metadata({args})"]
    if not settings.register_delta_tables:
        return []
    return _register(places, metastore, settings.delta_catalog, settings.delta_catalog)


def _register(
    places: Places, metastore: MetastoreConfig, delta_catalog: str, table_catalog: str
) -> list[str]:
    """`register_table` of each table: the ledger in the Delta catalog, the others in
    the catalog of the pipeline's format (Delta or Iceberg), both procedures alike."""
    out = []
    for which, suffix in TABLE_SUFFIXES.items():
        catalog = quote_identifier(delta_catalog if which == "ledger" else table_catalog)
        args = ", ".join(
            [
                f"schema_name => {quote_literal(metastore.database)}",
                f"table_name => {quote_literal(places.pipeline + suffix)}",
                f"table_location => {quote_literal(_uri(places.table(which).uri))}",
            ]
        )
        out.append(f"CALL {catalog}.system.register_table({args})")
    return out


def run_in_trino(settings: TrinoConfig, statements: list[str]) -> list[str]:
    """Run statements in the Trino of `trino.url`; a table registered already is not an error.

    Signs in with `trino.password` (HTTP basic authentication) or `trino.access_token`
    (a JWT as bearer token), and checks the coordinator's certificate against
    `trino.ca_file` when one is given.

    Args:
        settings: The `trino` settings; `url` must be set.
        statements: The statements, without terminating semicolons.

    Returns:
        The statements that ran.

    Raises:
        MetastoreError: If Trino cannot be reached or refuses a statement.
    """
    return _run_statements(_connector(settings), f"Trino at {settings.url}", statements)


def query_in_trino(
    settings: TrinoConfig, catalog: str, schema: str, statement: str
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run one query in the Trino of `trino.url`, signed in as `run_in_trino` is.

    Args:
        settings: The `trino` settings; `url` must be set.
        catalog: The session's catalog, where unqualified schemas are looked up.
        schema: The session's schema, where unqualified tables are looked up.
        statement: The query, as Trino takes it.

    Returns:
        The answer's column names, and its rows.

    Raises:
        QueryError: If Trino refuses the query as the user's error (a syntax error,
            an unknown table or column).
        MetastoreError: If Trino cannot be reached or fails otherwise.
    """
    from trino.exceptions import TrinoUserError

    from strata.errors import MetastoreError, QueryError

    where = f"Trino at {settings.url}"
    try:
        with _connector(settings, catalog, schema)() as conn:
            cursor = conn.cursor()
            cursor.execute(statement.strip().rstrip(";"))
            rows = [tuple(r) for r in cursor.fetchall()]
            columns = [d[0] for d in cursor.description or []]
    except TrinoUserError as exc:
        raise QueryError(redact(f"{where} refused the query: {exc.message}")) from None
    except Exception as exc:  # noqa: BLE001 - the client raises requests' errors too
        raise MetastoreError(redact(f"{where}: {type(exc).__name__}: {exc}")) from None
    return columns, rows


def _connector(
    settings: TrinoConfig, catalog: str | None = None, schema: str | None = None
) -> Callable[[], Any]:
    """What opens a DB-API connection to the Trino of `trino.url`, signed in as configured."""
    import trino

    url = settings.url
    assert url is not None
    scheme, _, rest = url.partition("://")
    host, _, port = rest.rstrip("/").partition(":")
    auth: trino.auth.Authentication | None = None
    if settings.password is not None:
        auth = trino.auth.BasicAuthentication(settings.user, settings.password)
    elif settings.access_token is not None:
        auth = trino.auth.JWTAuthentication(settings.access_token)

    def connect() -> Any:  # noqa: ANN401 - the trino client is not annotated
        return trino.dbapi.connect(  # type: ignore[no-untyped-call]
            host=host,
            port=int(port or (443 if scheme == "https" else 8080)),
            user=settings.user,
            catalog=catalog,
            schema=schema,
            http_scheme=scheme,
            auth=auth,
            http_session=_trusting(settings.ca_file),
            request_timeout=settings.timeout_s,
        )

    return connect


def _trusting(ca_file: str | None) -> Any:  # noqa: ANN401 - a requests.Session
    """An HTTP session that checks certificates against `ca_file` (the system's if None).

    Plain `requests` lets `REQUESTS_CA_BUNDLE` or `CURL_CA_BUNDLE` in the environment
    win over a session's own authority, so a configured `ca_file` would be ignored
    wherever an image sets one of them; this session keeps its own.
    """
    import requests

    class Session(requests.Session):
        def merge_environment_settings(
            self,
            url: str,
            proxies: dict[str, str] | None,
            stream: bool | None,
            verify: bool | str | None,
            cert: str | tuple[str, str] | None,
        ) -> dict[str, Any]:
            merged = super().merge_environment_settings(url, proxies, stream, verify, cert)
            if ca_file is not None:
                merged["verify"] = ca_file
            return merged

    session = Session()
    session.verify = ca_file or True
    return session


def run_through_connection(conn_id: str, statements: list[str]) -> list[str]:
    """Run statements in Trino through an Airflow connection of type `trino`.

    The connection holds the coordinator, the user and the way of signing in (its
    password, or `auth: jwt` in its extra, and `verify`/`protocol`), so none of it
    sits in the pipeline's configuration; the Trino provider's hook opens it.

    Returns:
        The statements that ran.

    Raises:
        MetastoreError: If the connection is unknown, or Trino cannot be reached or
            refuses a statement.
    """
    from airflow.providers.trino.hooks.trino import TrinoHook

    hook = TrinoHook(trino_conn_id=conn_id)  # type: ignore[no-untyped-call]
    return _run_statements(
        hook.get_conn,
        f"Trino through the Airflow connection {conn_id}",
        statements,
    )


def _run_statements(connect: Callable[[], Any], where: str, statements: list[str]) -> list[str]:
    """Run statements on a Trino DB-API connection; `ALREADY_EXISTS` is not an error."""
    from trino.exceptions import TrinoQueryError

    from strata.errors import MetastoreError

    ran = []
    try:
        with connect() as conn:
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
        raise MetastoreError(redact(f"{where}: {exc}")) from None
    except Exception as exc:  # noqa: BLE001 - the client raises requests' errors too
        raise MetastoreError(redact(f"{where}: {type(exc).__name__}: {exc}")) from None
    return ran


def pipeline_ddl(
    places: Places,
    schemas: SchemaSpec,
    metastore: MetastoreConfig,
    delta_catalog: str = "delta",
    hive_catalog: str = "hive",
    iceberg_catalog: str = "iceberg",
) -> str:
    """Trino statements that make a pipeline's tables queryable, as a script.

    See `ddl_statements`.

    Returns:
        Semicolon-terminated statements, one per paragraph.
    """
    out = [f"-- Tables of pipeline {places.pipeline} ({places.format})"]
    if places.format == "iceberg":
        out.append(iceberg_catalog_note(metastore, iceberg_catalog))
    statements = ddl_statements(
        places, schemas, metastore, delta_catalog, hive_catalog, iceberg_catalog
    )
    out += [f"{s};" for s in statements]
    return "\n\n".join(out) + "\n"


def iceberg_catalog_note(metastore: MetastoreConfig, catalog: str) -> str:
    """The Trino catalog file that reads the Iceberg tables straight from the metastore."""
    uri = redact(metastore.uri or "thrift://<metastore host>:9083")
    return "\n".join(
        [
            "-- A Trino Iceberg catalog on this metastore sees the tables with no statement:",
            f"-- etc/catalog/{catalog}.properties",
            "--   connector.name=iceberg",
            "--   iceberg.catalog.type=hive_metastore",
            f"--   hive.metastore.uri={uri}",
            "-- On a Trino whose catalogs use another metastore, register them (the",
            "-- procedure needs iceberg.register-table-procedure.enabled=true):",
        ]
    )


def ddl_statements(
    places: Places,
    schemas: SchemaSpec,
    metastore: MetastoreConfig,
    delta_catalog: str,
    hive_catalog: str,
    iceberg_catalog: str = "iceberg",
) -> list[str]:
    """Trino statements that make a pipeline's tables queryable, one by one.

    Delta tables are registered in the Delta Lake catalog, Iceberg tables in the
    Iceberg catalog (the ledger, Delta, in the Delta Lake catalog); plain Parquet tables
    are created in the Hive catalog, and their partitions synchronised from storage.
    `strata register` does the same through the metastore; these statements are for
    a Trino whose catalogs point at another metastore, or for review. Each can run
    again: a table there already is not created twice.

    Args:
        places: The pipeline's tables: their names, locations and format.
        schemas: What the Parquet tables' columns are made from (`PipelineConfig.schemas`).
        metastore: The metastore settings (the database, Trino's schema).
        delta_catalog: Name of Trino's Delta Lake catalog.
        hive_catalog: Name of Trino's Hive catalog.
        iceberg_catalog: Name of Trino's Iceberg catalog.

    Returns:
        The statements, without terminating semicolons.
    """
    schema = quote_identifier(metastore.database)
    out = []
    if places.format in ("delta", "iceberg"):
        catalogs = {delta_catalog, delta_catalog if places.format == "delta" else iceberg_catalog}
        for catalog in sorted(catalogs):
            out.append(f"CREATE SCHEMA IF NOT EXISTS {quote_identifier(catalog)}.{schema}")
        table_catalog = delta_catalog if places.format == "delta" else iceberg_catalog
        return out + _register(places, metastore, delta_catalog, table_catalog)
    catalog = quote_identifier(hive_catalog)
    out.append(f"CREATE SCHEMA IF NOT EXISTS {catalog}.{schema}")
    for which, suffix in TABLE_SUFFIXES.items():
        arrow, partition_by = (
            (LEDGER_SCHEMA, []) if which == "ledger" else table_layout(schemas, which)
        )
        name = f"{catalog}.{schema}.{quote_identifier(places.pipeline + suffix)}"
        columns = ",\n".join(f"  {quote_identifier(f.name)} {trino_type(f.type)}" for f in arrow)
        props = [
            f"external_location = {quote_literal(_uri(places.table(which).uri))}",
            "format = 'PARQUET'",
        ]
        if partition_by:
            keys = ", ".join(quote_literal(c) for c in partition_by)
            props.append(f"partitioned_by = ARRAY[{keys}]")
        out.append(
            f"CREATE TABLE IF NOT EXISTS {name} (\n{columns}\n)\nWITH (\n  "
            + ",\n  ".join(props)
            + "\n)"
        )
    sync = ", ".join([quote_literal(metastore.database), quote_literal(places.pipeline), "'ADD'"])
    out.append(f"CALL {catalog}.system.sync_partition_metadata({sync})")
    return out
