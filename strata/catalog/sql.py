"""Trino DDL for a pipeline's tables, as `strata sql ddl` prints it, and Trino told of them.

Every identifier is quoted and every literal escaped, and names that reach SQL were
already validated by the config (pipeline, database, topics) or by the Avro schema
(field names), so nothing from config or data can change a statement's meaning.

A Trino whose catalogs read the metastore Strata registers in (`metastore.uri`) needs
no statement for a Delta or Iceberg table: the metastore's entry is what its Delta Lake
and Iceberg connectors read, and their `register_table` answers `ALREADY_EXISTS`
there. So `register_table` is sent, and printed to run, only for a Trino whose catalogs
use another metastore (`trino.register_delta_tables`); otherwise `strata sql ddl`
prints the calls as comments, for review. A statement Trino answers `ALREADY_EXISTS`
(a table registered before) is skipped with a note, never an error.

Such a Trino keeps, for an Iceberg table, the metadata file it was registered at: its
metastore, not Strata's, holds the table's current snapshot. So where `register_table`
answers `ALREADY_EXISTS` for an Iceberg table (`Repoint`), Trino is asked whether it
reads the snapshot Strata's metastore names; if not, the table is re-pointed,
`unregister_table` then `register_table` (Trino has no call that moves a registered
table), and a query in between finds no table for that moment. A Trino that reads the
current snapshot (one on Strata's own metastore, `trino.register_delta_tables` set by
mistake) is never told to unregister: there that would drop Strata's own entry. A Delta
table needs no such step: the Delta Lake connector reads the table's log each time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from strata.catalog.types import quote_identifier, sql_type
from strata.config import MetastoreConfig, SchemaSpec, TrinoConfig
from strata.config.secrets import redact
from strata.log import get_logger
from strata.schema.avro import TABLE_SUFFIXES, table_layout
from strata.store.ledger import LEDGER_SCHEMA
from strata.store.places import NAME_SUFFIXES, Places, Role

logger = get_logger(__name__)

# Trino's name of the error a statement meets when what it creates or registers is
# there already: a schema, a table, a table registered by `register_table`.
_ALREADY_EXISTS = "ALREADY_EXISTS"


class Repoint(str):
    """A `register_table` call (the string itself) of an Iceberg table that a Trino on
    another metastore may hold at an older snapshot.

    Where Trino answers the call `ALREADY_EXISTS`, `probe` asks it whether it reads the
    snapshot Strata's metastore names (one row, true if so); if it does not,
    `unregister` and then the call again re-point it. A string, so that it prints, logs
    and is recorded as the call it is.
    """

    unregister: str
    probe: str

    def __new__(cls, register: str, unregister: str, probe: str) -> Repoint:
        """The call `register`, re-pointed by `unregister` where `probe` answers false."""
        made = super().__new__(cls, register)
        made.unregister = unregister
        made.probe = probe
        return made


def quote_literal(value: str) -> str:
    """A Trino string literal, single-quoted with inner quotes doubled."""
    return "'" + value.replace("'", "''") + "'"


def trino_type(kind: pa.DataType) -> str:
    """The type of a column of Trino's Hive connector, for an Arrow type (`sql_type`).

    Timestamps are `timestamp(3)`: the connector reads every timestamp at its one
    precision (`hive.timestamp-precision`, milliseconds by default) and refuses a
    table that declares another.

    Raises:
        ValueError: For a type Trino has no column type for.
    """
    return sql_type(kind, "trino_hive")


def _uri(location: str) -> str:
    return location if "://" in location else f"file://{location}"


def trino_statements(
    places: Places, metastore: MetastoreConfig, settings: TrinoConfig
) -> list[str]:
    """What to run in Trino after registering, for `trino.url`.

    Parquet tables: `sync_partition_metadata`, so Trino's Hive catalog sees partitions
    added since its metastore cache was filled. Delta and Iceberg tables: nothing,
    since the metastore entry is all Trino's Delta Lake and Iceberg catalogs need,
    unless those catalogs use another metastore (`trino.register_delta_tables`): then
    `register_table` for each table, the quality table once a check has written it;
    each Iceberg table's a `Repoint`, so that Trino answers its newest snapshot.

    Args:
        places: The pipeline's tables: their names, locations and format.
        metastore: The metastore settings (the database).
        settings: The `trino` settings (the catalogs).
    """
    database = quote_literal(metastore.database)
    if places.format == "parquet":
        catalog = quote_identifier(settings.hive_catalog)
        args = f"{database}, {quote_literal(places.pipeline)}, 'ADD'"
        return [f"CALL {catalog}.system.sync_partition_metadata({args})"]
    if not settings.register_delta_tables:
        return []
    table_catalog = (
        settings.iceberg_catalog if places.format == "iceberg" else settings.delta_catalog
    )
    return _register(
        places,
        metastore,
        settings.delta_catalog,
        table_catalog,
        quality_written(places),
        repoint=places.format == "iceberg",
    )


def quality_written(places: Places) -> bool:
    """Whether a quality check has written the pipeline's quality table (its log is there)."""
    from strata.quality.table import quality_table_location
    from strata.store.delta import open_table

    quality = places.table("quality")
    return open_table(quality_table_location(quality), quality.options) is not None


def _register(
    places: Places,
    metastore: MetastoreConfig,
    delta_catalog: str,
    table_catalog: str,
    quality: bool,
    repoint: bool = False,
) -> list[str]:
    """`register_table` of each table: the ledger and the quality table (Delta) in the
    Delta catalog, the others in the catalog of the pipeline's format (Delta or
    Iceberg), both procedures alike; with `repoint`, each of the others (Iceberg's) a
    `Repoint` at the table's current snapshot, which a Trino on another metastore may
    not read."""
    from strata.quality.table import quality_table_location

    tables: list[tuple[Role, str]] = [(which, places.table(which).uri) for which in TABLE_SUFFIXES]
    if quality:
        tables.append(("quality", quality_table_location(places.table("quality"))))
    out: list[str] = []
    for which, location in tables:
        delta = which in ("ledger", "quality")
        catalog = quote_identifier(delta_catalog if delta else table_catalog)
        names = [
            f"schema_name => {quote_literal(metastore.database)}",
            f"table_name => {quote_literal(places.pipeline + NAME_SUFFIXES[which])}",
        ]
        args = ", ".join([*names, f"table_location => {quote_literal(_uri(location))}"])
        call = f"CALL {catalog}.system.register_table({args})"
        if repoint and not delta:
            unregister = f"CALL {catalog}.system.unregister_table({', '.join(names)})"
            name = quote_identifier(places.pipeline + NAME_SUFFIXES[which] + "$snapshots")
            snapshots = f"{catalog}.{quote_identifier(metastore.database)}.{name}"
            out.append(Repoint(call, unregister, _reads_current(places, which, snapshots)))
        else:
            out.append(call)
    return out


def _reads_current(places: Places, which: Role, snapshots: str) -> str:
    """A query answering whether Trino reads the Iceberg table's current snapshot, as
    Strata's metastore names it now: Trino's `$snapshots` table lists that one only if
    the metadata file Trino reads is the current one (or one written after it)."""
    from strata.store.iceberg import open_table

    table = open_table(places.table(which))
    current = None if table is None else table.current_snapshot()
    if current is None:
        return f"SELECT count(*) = 0 FROM {snapshots}"
    return f"SELECT count(*) > 0 FROM {snapshots} WHERE snapshot_id = {current.snapshot_id:d}"


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
            rows = [tuple(_named_rows(v) for v in r) for r in cursor.fetchall()]
            columns = [d[0] for d in cursor.description or []]
    except TrinoUserError as exc:
        raise QueryError(redact(f"{where} refused the query: {exc.message}")) from None
    except Exception as exc:  # noqa: BLE001 - the client raises requests' errors too
        raise MetastoreError(redact(f"{where}: {type(exc).__name__}: {exc}")) from None
    return columns, rows


def _named_rows(value: Any) -> Any:  # noqa: ANN401 - any value Trino answers
    """A value with each ROW whose fields all have names as a mapping of them.

    Trino's client gives a ROW as a tuple with the names aside; DuckDB gives a STRUCT
    as a mapping, and an answer's text (JSON's objects) is then the same in both.
    """
    from trino.types import NamedRowTuple

    if isinstance(value, NamedRowTuple):
        names = value.__annotations__["names"]
        fields = [_named_rows(v) for v in value]
        if None not in names and len(set(names)) == len(names):
            return dict(zip(names, fields, strict=True))
        return tuple(fields)
    if isinstance(value, list):
        return [_named_rows(v) for v in value]
    if isinstance(value, dict):
        return {k: _named_rows(v) for k, v in value.items()}
    return value


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
    """Run statements on a Trino DB-API connection; `ALREADY_EXISTS` is not an error.

    A table registered already (by this statement before, or in the metastore Trino's
    catalog reads, where Strata registered it) is what the statement was for: it is
    skipped, with a note; a `Repoint` Trino holds at an older snapshot is re-pointed
    (unregistered, registered again). Stopped between those two, the table is not
    registered there until the next run, whose call registers it.
    """
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
                    if exc.error_name != _ALREADY_EXISTS:
                        raise
                    if isinstance(statement, Repoint) and not _answers(cursor, statement.probe):
                        for again in (statement.unregister, statement):
                            cursor.execute(again)
                            cursor.fetchall()
                        ran.append(statement.unregister)
                        logger.info(
                            "%s: re-pointed at its current snapshot: %.300s", where, statement
                        )
                    else:
                        logger.info(
                            "%s: skipped, there already (%s): %.300s",
                            where,
                            redact(exc.message or exc.error_name),
                            statement,
                        )
                ran.append(statement)
    except (TrinoQueryError, OSError) as exc:
        raise MetastoreError(redact(f"{where}: {exc}")) from None
    except Exception as exc:  # noqa: BLE001 - the client raises requests' errors too
        raise MetastoreError(redact(f"{where}: {type(exc).__name__}: {exc}")) from None
    return ran


def _answers(cursor: Any, probe: str) -> bool:  # noqa: ANN401 - a DB-API cursor, not annotated
    """Whether a query of one boolean answers true; false if Trino fails it.

    A Trino holding a table at a metadata file vacuum has since deleted fails to read
    its snapshots: that table is the one most in need of re-pointing.
    """
    from trino.exceptions import TrinoQueryError

    try:
        cursor.execute(probe)
        return bool(cursor.fetchall()[0][0])
    except TrinoQueryError as exc:
        logger.info("Trino could not read the table's snapshots (%s)", redact(str(exc))[:300])
        return False


def pipeline_ddl(
    places: Places,
    schemas: SchemaSpec,
    metastore: MetastoreConfig,
    delta_catalog: str = "delta",
    hive_catalog: str = "hive",
    iceberg_catalog: str = "iceberg",
    register_tables: bool = False,
) -> str:
    """Trino statements that make a pipeline's tables queryable, as a script.

    See `ddl_statements`. The quality table is among them whether a check has written it
    yet or not; its statement runs once one has.

    Args:
        places: The pipeline's tables: their names, locations and format.
        schemas: What the Parquet tables' columns are made from.
        metastore: The metastore settings (the database, Trino's schema).
        delta_catalog: Name of Trino's Delta Lake catalog.
        hive_catalog: Name of Trino's Hive catalog.
        iceberg_catalog: Name of Trino's Iceberg catalog.
        register_tables: `trino.register_delta_tables`: Trino's Delta Lake and Iceberg
            catalogs use another metastore than `metastore.uri`, and the `register_table`
            calls are printed to run; otherwise they are printed as comments, since such
            a catalog on the same metastore reads the tables already (and answers the
            calls `ALREADY_EXISTS`).

    Returns:
        Semicolon-terminated statements, one per paragraph.
    """
    out = [f"-- Tables of pipeline {places.pipeline} ({places.format})"]
    statements = ddl_statements(
        places, schemas, metastore, delta_catalog, hive_catalog, iceberg_catalog, quality=True
    )
    if places.format == "parquet":
        return "\n\n".join(out + [f"{s};" for s in statements]) + "\n"
    if places.format == "iceberg":
        out.append(iceberg_catalog_note(metastore, iceberg_catalog))
    calls = [s for s in statements if s.startswith("CALL ")]
    out += [f"{s};" for s in statements if s not in calls]
    if register_tables:
        out.append("-- Trino's catalogs use another metastore (trino.register_delta_tables):")
        out += [f"{s};" for s in calls]
    else:
        out.append(_same_metastore_note(metastore))
        out += ["\n".join(f"-- {line}" for line in f"{s};".splitlines()) for s in calls]
    return "\n\n".join(out) + "\n"


def _same_metastore_note(metastore: MetastoreConfig) -> str:
    """Why the `register_table` calls are printed as comments."""
    uri = redact(metastore.uri) if metastore.uri else "metastore.uri"
    return "\n".join(
        [
            "-- Trino's Delta Lake and Iceberg catalogs on the metastore Strata registers in",
            f"-- ({uri}) read these tables with no statement: `strata register` and every",
            "-- run record them there, and register_table would answer ALREADY_EXISTS.",
            "-- For catalogs on another metastore, set trino.register_delta_tables: true and",
            "-- these calls are printed to run (the procedure must be enabled there:",
            "-- delta.register-table-procedure.enabled=true, and for Iceberg tables",
            "-- iceberg.register-table-procedure.enabled=true):",
        ]
    )


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
            "-- Its ledger and quality table are Delta tables: query them in the Delta Lake",
            "-- catalog (delta.<database>.<pipeline>_ledger).",
        ]
    )


def ddl_statements(
    places: Places,
    schemas: SchemaSpec,
    metastore: MetastoreConfig,
    delta_catalog: str,
    hive_catalog: str,
    iceberg_catalog: str = "iceberg",
    quality: bool | None = None,
    repoint: bool = False,
) -> list[str]:
    """Trino statements that make a pipeline's tables queryable, one by one.

    Delta tables are registered in the Delta Lake catalog, Iceberg tables in the
    Iceberg catalog (the ledger and the quality table, Delta, in the Delta Lake
    catalog); plain Parquet tables are created in the Hive catalog (the ledger and the
    quality table too, as `strata register` records them), and their partitions
    synchronised from storage. `strata register` does the same through the metastore;
    these statements are for a Trino whose catalogs point at another metastore, or for
    review. Each can run again: a table there already is not created twice.

    Plain Parquet tables belong with Trino's Hive catalog on the metastore Strata
    registers in: compaction moves a partition there (`strata.store.locations`), and
    `sync_partition_metadata` on another metastore would keep it at its first directory.

    Args:
        places: The pipeline's tables: their names, locations and format.
        schemas: What the Parquet tables' columns are made from (`PipelineConfig.schemas`).
        metastore: The metastore settings (the database, Trino's schema).
        delta_catalog: Name of Trino's Delta Lake catalog.
        hive_catalog: Name of Trino's Hive catalog.
        iceberg_catalog: Name of Trino's Iceberg catalog.
        quality: Include the quality table; None: if a check has written it (its table
            is looked for), since a statement on a table not there yet fails.
        repoint: Make each Iceberg table's call a `Repoint`, for a Trino on another
            metastore, which holds a registered table at the snapshot it registered.

    Returns:
        The statements, without terminating semicolons.
    """
    from strata.quality.checks import QUALITY_SCHEMA
    from strata.quality.table import quality_table_location

    with_quality = quality_written(places) if quality is None else quality
    schema = quote_identifier(metastore.database)
    out = []
    if places.format in ("delta", "iceberg"):
        catalogs = {delta_catalog, delta_catalog if places.format == "delta" else iceberg_catalog}
        for catalog in sorted(catalogs):
            out.append(f"CREATE SCHEMA IF NOT EXISTS {quote_identifier(catalog)}.{schema}")
        table_catalog = delta_catalog if places.format == "delta" else iceberg_catalog
        return out + _register(
            places, metastore, delta_catalog, table_catalog, with_quality, repoint=repoint
        )
    catalog = quote_identifier(hive_catalog)
    out.append(f"CREATE SCHEMA IF NOT EXISTS {catalog}.{schema}")
    tables: list[tuple[Role, pa.Schema, list[str], str]] = []
    for metastore_table in TABLE_SUFFIXES:
        arrow, partition_by = (
            (LEDGER_SCHEMA, [])
            if metastore_table == "ledger"
            else table_layout(schemas, metastore_table)
        )
        location = places.table(metastore_table).uri
        tables.append((metastore_table, arrow, partition_by, location))
    if with_quality:
        location = quality_table_location(places.table("quality"))
        tables.append(("quality", QUALITY_SCHEMA, [], location))
    for which, arrow, partition_by, location in tables:
        name = f"{catalog}.{schema}.{quote_identifier(places.pipeline + NAME_SUFFIXES[which])}"
        columns = ",\n".join(f"  {quote_identifier(f.name)} {trino_type(f.type)}" for f in arrow)
        props = [
            f"external_location = {quote_literal(_uri(location))}",
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
