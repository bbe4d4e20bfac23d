"""Registration: record a pipeline's tables in the Hive Metastore, idempotently.

Runs after the commit, so a registration failure never loses data: the batch stands,
and the next run (or `strata register`) completes the registration. Every call
compares what the metastore holds with what it should hold and changes only the
difference, so registering twice changes nothing, and a table whose location drifted
is corrected. Of a plain Parquet table's registered partitions, a run's registration
reads back only those moved or completed since the last one (`strata.catalog._partitions`);
`strata register` compares them all.

Delta tables are registered the way Spark and Trino's Delta Lake connector expect
them: an external table with the location, `spark.sql.sources.provider=delta`, and
a placeholder column; readers take the schema and the files from the Delta log, so
no `register_table` call is needed by hand.

Registration also says which event-time partitions are complete (`strata.catalog.completeness`):
as parameters of each complete partition of a Parquet table, and of the data table;
`publish_completeness`, after a batch's quality gate, writes the `_SUCCESS` markers too.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import pyarrow as pa
from pymetastore.hive_metastore.ttypes import (
    FieldSchema,
    Partition,
    SerDeInfo,
    StorageDescriptor,
    Table,
)

from strata.catalog._partitions import (
    REGISTERED_KEY,
    Since,
    moved_since,
    registered_parts,
    storage_partitions,
)
from strata.catalog._partitions import (
    # Published here, with registration: vacuum asks where the metastore points partitions.
    registered_locations as registered_locations,
)
from strata.catalog.completeness import (
    COMPLETE_BEFORE_KEY,
    PARTITION_KEYS,
    WATERMARK_KEY,
    BatchFacts,
    Completeness,
    completeness,
    watermark_now,
    write_markers,
)
from strata.catalog.metastore import MetastoreClient
from strata.catalog.types import sql_type
from strata.config import CompletenessConfig, MetastoreConfig, PartitioningConfig, SchemaSpec
from strata.errors import MetastoreError
from strata.schema.avro import TABLE_SUFFIXES, partition_columns, table_layout
from strata.store.iceberg import set_properties
from strata.store.ledger import LEDGER_SCHEMA, ledger_state
from strata.store.locations import place, read_markers
from strata.store.parquet import partition_path
from strata.store.places import DATABASE_DESCRIPTION, Places, Role, TableRef

DELTA_PROVIDER = "delta"


def registered_as(table_format: str, role: Role) -> Literal["delta", "iceberg", "parquet"]:
    """How the metastore records one of a pipeline's tables, so which Trino connector reads it.

    A plain Parquet pipeline's tables are all plain Parquet tables, read by listing
    their directories (its ledger and quality table, Delta on disk, too: each file they
    hold stands). Otherwise the ledger and the quality table are Delta tables, and the
    others are of the pipeline's format.

    Args:
        table_format: The pipeline's `table_format`.
        role: Which of its tables.
    """
    if table_format == "parquet":
        return "parquet"
    if role in ("ledger", "quality") or table_format == "delta":
        return "delta"
    return "iceberg"


@dataclass(frozen=True)
class Registration:
    """What registering a pipeline's (or routed table's) tables reads, gathered once.

    The entry points build it from the configuration (`strata.edge.registration`) and
    hand it down: nothing below them reads the configuration to register.

    Attributes:
        places: The tables' places and names.
        schemas: What the Parquet tables' columns are made from, and the data table's
            partitioning (`PipelineConfig.schemas`).
        metastore: The metastore settings; `uri` must be set to register.
        warehouse: The warehouse root: the metastore database's location.
        completeness: The `completeness` settings: whether the tables say which
            partitions are complete, the lateness, the markers.
        gate: `quality.gate`: under `fail`, a batch not checked yet holds the partitions
            it wrote from being complete.
        asset: The URI of the data table's Airflow Asset (`PipelineConfig.asset_uri`).
    """

    places: Places
    schemas: SchemaSpec
    metastore: MetastoreConfig
    warehouse: str
    completeness: CompletenessConfig
    gate: str
    asset: str


@dataclass
class RegistrationReport:
    """What registering changed.

    Attributes:
        database: The metastore database.
        created: Tables created.
        updated: Tables whose definition was corrected.
        unchanged: Tables already as they should be.
        partitions: Event-time partitions the data table has on storage.
        partitions_added: Partitions the metastore lacked and now has.
        partitions_unknown: Partitions the metastore lists but storage lacks (left alone).
        partitions_moved: Partitions whose location was set to their directory in use.
        partitions_completed: Partitions whose completeness parameters were set now
            (`strata.complete` and the rest; see `strata.catalog.completeness`).
        partitions_reopened: Partitions whose completeness parameters were removed: a
            failed quality gate marked them incomplete.
        completeness_error: Why completeness could not be worked out; the tables and
            partitions are registered all the same.
        full: Every registered partition was compared, not only those changed since
            the last registration.
        partitions_read: Registered partitions read back from the metastore to compare.
    """

    database: str
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    partitions: int = 0
    partitions_added: list[str] = field(default_factory=list)
    partitions_unknown: list[str] = field(default_factory=list)
    partitions_moved: list[str] = field(default_factory=list)
    partitions_completed: list[str] = field(default_factory=list)
    partitions_reopened: list[str] = field(default_factory=list)
    completeness_error: str | None = None
    full: bool = False
    partitions_read: int = 0


def location_uri(location: str) -> str:
    """A table location as the metastore stores it (`file:/...` for local paths)."""
    return location if "://" in location else f"file:{location}"


def delta_table(database: str, name: str, location: str, pipeline: str) -> Table:
    """The metastore definition of an external Delta table."""
    uri = location_uri(location)
    storage = _storage(
        # Spark's convention for a data source table: the real schema is the Delta log's.
        [FieldSchema("col", "array<string>", "from deserializer")],
        uri,
        "org.apache.hadoop.mapred.SequenceFileInputFormat",
        "org.apache.hadoop.hive.ql.io.HiveSequenceFileOutputFormat",
        "org.apache.hadoop.hive.serde2.lazy.LazySimpleSerDe",
        {"path": uri, "serialization.format": "1"},
    )
    return _external_table(
        database, name, storage, [], pipeline, {"spark.sql.sources.provider": DELTA_PROVIDER}
    )


PARQUET_SERDE = "org.apache.hadoop.hive.ql.io.parquet.serde.ParquetHiveSerDe"
PARQUET_INPUT = "org.apache.hadoop.hive.ql.io.parquet.MapredParquetInputFormat"
PARQUET_OUTPUT = "org.apache.hadoop.hive.ql.io.parquet.MapredParquetOutputFormat"


def hive_type(kind: pa.DataType) -> str:
    """The Hive type of an Arrow type, as Parquet readers (Hive, Trino, Spark) map it.

    Raises:
        MetastoreError: For a type Hive has no column type for, e.g. a decimal above
            38 digits.
    """
    try:
        return sql_type(kind, "hive")
    except ValueError as exc:
        raise MetastoreError(str(exc)) from None


def _external_table(
    database: str,
    name: str,
    storage: StorageDescriptor,
    partition_by: list[str],
    pipeline: str,
    parameters: dict[str, str],
) -> Table:
    return Table(
        tableName=name,
        dbName=database,
        owner="strata",
        createTime=int(time.time()),
        lastAccessTime=0,
        retention=0,
        sd=storage,
        partitionKeys=[FieldSchema(c, "string", None) for c in partition_by],
        parameters={"EXTERNAL": "TRUE", "strata.pipeline": pipeline, **parameters},
        tableType="EXTERNAL_TABLE",
    )


def _storage(
    cols: list[FieldSchema],
    location: str,
    input_format: str,
    output_format: str,
    serde: str,
    serde_parameters: dict[str, str],
) -> StorageDescriptor:
    return StorageDescriptor(
        cols=cols,
        location=location,
        inputFormat=input_format,
        outputFormat=output_format,
        compressed=False,
        numBuckets=-1,
        serdeInfo=SerDeInfo(serializationLib=serde, parameters=serde_parameters),
        bucketCols=[],
        sortCols=[],
        parameters={},
    )


def _parquet_storage(
    location: str, schema: pa.Schema, partition_by: list[str]
) -> StorageDescriptor:
    cols = [
        FieldSchema(f.name, hive_type(f.type), None) for f in schema if f.name not in partition_by
    ]
    return _storage(
        cols, location, PARQUET_INPUT, PARQUET_OUTPUT, PARQUET_SERDE, {"serialization.format": "1"}
    )


def parquet_table(
    database: str,
    name: str,
    location: str,
    schema: pa.Schema,
    partition_by: list[str],
    pipeline: str,
) -> Table:
    """The metastore definition of an external, Hive-style Parquet table."""
    storage = _parquet_storage(location_uri(location), schema, partition_by)
    return _external_table(database, name, storage, partition_by, pipeline, {})


def ensure_definition(client: MetastoreClient, wanted: Table) -> tuple[str, Table | None]:
    """Create a table in the metastore, or correct its definition if it differs.

    Args:
        client: An open metastore client.
        wanted: The table's definition.

    Returns:
        What was done (`created`, `updated` or `unchanged`), and the definition the
        metastore held before (None if it held none).
    """
    current = client.get_table(wanted.dbName, wanted.tableName)
    if current is None:
        client.create_table(wanted)
        return "created", None
    wanted.sd.cols = _in_place(current.sd.cols or [], wanted.sd.cols)
    if _same(current, wanted):
        return "unchanged", current
    wanted.createTime = current.createTime
    client.alter_table(wanted)
    return "updated", current


def _in_place(current: list[FieldSchema], wanted: list[FieldSchema]) -> list[FieldSchema]:
    """The wanted columns with those the metastore holds kept in their positions.

    A field added to the schema comes before Strata's own `_` columns in the files, but
    a Hive table's columns are matched by position: against its existing partitions
    (Trino's Hive connector refuses a type that differs at a position) and by the
    metastore itself, which refuses an `alter_table` that changes a column's type at its
    position. New columns therefore go at the end, as Delta and Iceberg add them; the
    Parquet readers match the files' columns by name.
    """
    by_name = {c.name: c for c in wanted}
    kept = [by_name[c.name] for c in current if c.name in by_name]
    held = {c.name for c in kept}
    return kept + [c for c in wanted if c.name not in held]


def _same(current: Table, wanted: Table) -> bool:
    params = current.parameters or {}
    provider = (wanted.parameters or {}).get("spark.sql.sources.provider")
    return (
        current.sd.location == wanted.sd.location
        and params.get("spark.sql.sources.provider") == provider
        and current.tableType == wanted.tableType
        and current.sd.serdeInfo.serializationLib == wanted.sd.serdeInfo.serializationLib
        and [(c.name, c.type) for c in current.sd.cols]
        == [(c.name, c.type) for c in wanted.sd.cols]
        and [c.name for c in current.partitionKeys or []] == [c.name for c in wanted.partitionKeys]
    )


def _settings_key(registration: Registration) -> str:
    """What a partition's completion depends on besides the ledger, in one string."""
    done = registration.completeness
    zone = registration.schemas.partitioning.timezone
    return json.dumps([done.enabled, done.lateness, registration.gate, zone])


def _reconcile_partitions(
    client: MetastoreClient,
    ref: TableRef,
    partitioning: PartitioningConfig,
    batch: int,
    table: Table,
    report: RegistrationReport,
    found: Completeness | None,
    since: Since | None,
    settings: str,
    full: bool,
) -> Since:
    """Bring the data table's partitions in the metastore in line with storage.

    Every partition on storage the metastore does not list is added (one listing of
    each); of those it lists, only the ones moved or completed since the last
    registration (`since`) are read back and corrected, every compacted one when `since`
    is None, every one on `full`.

    Returns:
        The record of this registration, for the next one.
    """
    columns = partition_columns(partitioning)
    on_storage = storage_partitions(ref, partitioning)
    report.partitions = len(on_storage)
    fs, root = ref.filesystem()
    markers = read_markers(fs, root)
    current = markers.current()

    def name(values: tuple[str, ...]) -> str:
        return partition_path(columns, values)

    def location(partition: str) -> str:
        return f"{table.sd.location}/{place(partition, current)}"

    registered = set(client.partition_names(table.dbName, table.tableName))
    if full:
        # Asked for by hand: a location changed in the metastore is put right too.
        moved = sorted(registered & {name(v) for v in on_storage})
    else:
        moved = moved_since(markers, registered, None if since is None else since.moved_ms)
    _move_partitions(client, table, moved, location, batch, report)
    missing = [values for values in on_storage if name(values) not in registered]
    wanted = {} if found is None else {s.partition: s.parameters() for s in found.partitions}
    report.partitions_unknown = sorted(registered - {name(v) for v in on_storage})
    for at in range(0, len(missing), batch):
        parts = []
        for values in missing[at : at + batch]:
            storage = copy.deepcopy(table.sd)
            storage.location = location(name(values))
            parts.append(
                Partition(
                    values=list(values),
                    dbName=table.dbName,
                    tableName=table.tableName,
                    createTime=int(time.time()),
                    lastAccessTime=0,
                    sd=storage,
                    parameters=wanted.get(name(values), {}),
                )
            )
        client.add_partitions(table.dbName, table.tableName, parts)
    report.partitions_added = [name(v) for v in missing]
    report.partitions_completed = [p for p in report.partitions_added if wanted.get(p)]
    held: list[str] = []
    if found is not None:
        held = sorted(s.partition for s in found.partitions if s.held_by)
        # Only a partition whose span the watermark passed can carry the parameters (a
        # mark may have reopened it since): the open ones are not even fetched. Of the
        # settled ones, those a batch after the last registration completed, and those
        # held then or now: no other's parameters can have changed since.
        last = None if since is None or since.held is None else since.batch
        again = set(held) | set(() if since is None or since.held is None else since.held)
        settled = [
            s.partition
            for s in found.partitions
            if s.completed_batch is not None
            and s.partition in registered
            and (last is None or s.completed_batch > last or s.partition in again)
        ]
        _mark_partitions(client, table, settled, wanted, batch, report)
    return Since.after(None if found is None else found.batch, markers, held, settings)


def _mark_partitions(
    client: MetastoreClient,
    table: Table,
    names: list[str],
    wanted: dict[str, dict[str, str]],
    batch: int,
    report: RegistrationReport,
) -> None:
    """Give registered partitions the completeness parameters they should have, and no other.

    Other parameters (the metastore's own, an operator's) are kept as they are.
    """
    report.partitions_read += len(names)
    for parts in registered_parts(client, table, names, batch):
        changed = []
        for partition, part in parts:
            params = dict(part.parameters or {})
            want = wanted.get(partition, {})
            if {k: params[k] for k in PARTITION_KEYS if k in params} == want:
                continue
            part.parameters = {k: v for k, v in params.items() if k not in PARTITION_KEYS} | want
            changed.append(part)
            (report.partitions_completed if want else report.partitions_reopened).append(partition)
        if changed:
            client.alter_partitions(table.dbName, table.tableName, changed)


def _move_partitions(
    client: MetastoreClient,
    table: Table,
    names: list[str],
    location: Callable[[str], str],
    batch: int,
    report: RegistrationReport,
) -> None:
    """Point registered partitions at their directories in use, where they differ.

    A compaction moves a plain Parquet partition on storage first (its marker), then in
    the metastore; one killed in between, or a location changed by hand, is put right
    here.
    """
    report.partitions_read += len(names)
    for parts in registered_parts(client, table, names, batch):
        moved = []
        for partition, part in parts:
            if part.sd.location != location(partition):
                part.sd.location = location(partition)
                moved.append(part)
                report.partitions_moved.append(partition)
        if moved:
            client.alter_partitions(table.dbName, table.tableName, moved)


def register_tables(registration: Registration, *, full: bool = False) -> RegistrationReport:
    """Register the pipeline's data, raw, quarantine and ledger tables.

    The tables' definitions are compared every time (four calls). Of a plain Parquet
    data table's partitions, those on storage the metastore lacks are added; of those
    it lists, only the ones moved or completed since the table's last registration
    (its `REGISTERED_KEY` record) are read back and corrected, so a run's registration
    costs the same after years of partitions. `full` compares every partition, which
    also puts right a partition changed by hand (`strata register`).

    Args:
        registration: What to register, and where; `metastore.uri` must be set.
        full: Compare every registered partition, whatever the last registration did.

    Returns:
        What changed.

    Raises:
        MetastoreError: If the metastore cannot be reached or refuses a change.
    """
    ms, places = registration.metastore, registration.places
    if not ms.uri:
        raise MetastoreError(
            "no metastore configured; set metastore.uri (or STRATA_METASTORE_URI) to "
            "thrift://host:port"
        )
    report = RegistrationReport(ms.database, full=full)
    parquet = registered_as(places.format, "table") == "parquet"
    found, marks = None, {}
    if registration.completeness.enabled:
        try:
            # A Delta table's partitions are not listed in the metastore: the table's
            # parameters, from the ledger's newest state, are all it needs.
            found = _completeness(registration) if parquet else None
            marks = _table_marks(registration, found)
        except Exception as exc:  # noqa: BLE001 - completeness never stops registration
            report.completeness_error = f"completeness unknown: {exc}"
    settings = _settings_key(registration)
    with MetastoreClient(ms.uri, ms.timeout_s) as client:
        client.ensure_database(
            ms.database, location_uri(registration.warehouse), DATABASE_DESCRIPTION
        )
        for which, suffix in TABLE_SUFFIXES.items():
            name = f"{places.pipeline}{suffix}"
            location = places.table(which).uri
            kind = registered_as(places.format, which)
            if kind == "iceberg":
                # Its catalog entry is the table's own pointer to its metadata, kept by
                # each commit (`strata.store.iceberg`): never redefined from here. The
                # data table's completeness marks are Iceberg table properties (which
                # the catalog copies into the entry's parameters).
                changed = which == "table" and set_properties(places.table(which), marks)
                getattr(report, "updated" if changed else "unchanged").append(name)
                continue
            if kind == "parquet":
                schema, partition_by = (
                    (LEDGER_SCHEMA, [])
                    if which == "ledger"
                    else table_layout(registration.schemas, which)
                )
                wanted = parquet_table(
                    ms.database, name, location, schema, partition_by, places.pipeline
                )
            else:
                wanted = delta_table(ms.database, name, location, places.pipeline)
            if which == "table":
                wanted.parameters.update(marks)
            done, current = ensure_definition(client, wanted)
            getattr(report, done).append(name)
            # The definition the metastore holds now, whose parameters are brought up to date.
            stored = current if done == "unchanged" and current is not None else None
            if which == "table" and parquet:
                since = None
                if not full and stored is not None:
                    since = Since.read(stored.parameters, settings)
                record = _reconcile_partitions(
                    client,
                    places.table("table"),
                    registration.schemas.partitioning,
                    ms.partition_batch,
                    wanted,
                    report,
                    found,
                    since,
                    settings,
                    full,
                )
                # Recorded last, once every partition is in line: a registration that
                # failed half way leaves the record of the one before it.
                stored = stored or copy.deepcopy(wanted)
                wanted.parameters[REGISTERED_KEY] = record.text()
            if stored is not None:
                _update_marks(client, stored, wanted)
    return report


def _completeness(
    registration: Registration,
    batch: int | None = None,
    since: int | None = None,
    facts: BatchFacts | None = None,
) -> Completeness:
    """The completeness registration publishes: without the late rows of every partition,
    which it does not show (see `strata.catalog.completeness.completeness`)."""
    return completeness(
        registration.places,
        registration.completeness,
        registration.schemas.partitioning,
        registration.gate,
        registration.asset,
        batch,
        totals=False,
        since=since,
        facts=facts,
    )


def _table_marks(registration: Registration, found: Completeness | None) -> dict[str, str]:
    """The data table's completeness parameters: for Delta tables, whose partitions the
    metastore does not list, the only place a metastore reader finds them.

    Taken from the completeness already worked out (`found`), else from the ledger's
    newest state, so the ledger is read once.
    """
    if found is not None:
        at, before = found.watermark, found.complete_before()
    else:
        now = watermark_now(registration.completeness, ledger_state(registration.places))
        at, before = (None, None) if now is None else (now["at"], now["complete_before"])
    if at is None or before is None:
        return {}
    return {WATERMARK_KEY: at, COMPLETE_BEFORE_KEY: before}


def _update_marks(client: MetastoreClient, current: Table, wanted: Table) -> None:
    """Bring a table's completeness parameters (and its registration record) up to date;
    its other ones stay."""
    params = dict(current.parameters or {})
    marks = {k: v for k, v in (wanted.parameters or {}).items() if k in _TABLE_KEYS}
    if {k: params[k] for k in _TABLE_KEYS if k in params} != marks:
        current.parameters = {k: v for k, v in params.items() if k not in _TABLE_KEYS} | marks
        client.alter_table(current)


_TABLE_KEYS = (WATERMARK_KEY, COMPLETE_BEFORE_KEY, REGISTERED_KEY)


def render_registration(report: RegistrationReport) -> str:
    """The report as one line."""
    parts = [
        f"{label} {', '.join(names)}"
        for label, names in (
            ("created", report.created),
            ("updated", report.updated),
            ("unchanged", report.unchanged),
        )
        if names
    ]
    if report.partitions_added:
        parts.append(f"{len(report.partitions_added)} partitions added")
    if report.partitions_completed:
        parts.append(f"{len(report.partitions_completed)} partitions marked complete")
    if report.partitions_reopened:
        parts.append(
            f"{len(report.partitions_reopened)} partitions no longer complete (failed quality)"
        )
    if report.completeness_error:
        parts.append(report.completeness_error)
    if report.partitions_moved:
        parts.append(f"{len(report.partitions_moved)} partitions moved to their compacted files")
    if report.partitions_read:
        compared = "every registered partition" if report.full else "registered partitions"
        parts.append(f"{report.partitions_read} {compared} read back and compared")
    if report.partitions_unknown:
        parts.append(
            f"{len(report.partitions_unknown)} registered partitions have no data on storage "
            f"(left alone): {', '.join(report.partitions_unknown[:5])}"
        )
    return f"metastore database {report.database}: " + "; ".join(parts)


def publish_completeness(
    registration: Registration,
    batch: int | None,
    since: int | None = None,
    facts: BatchFacts | None = None,
) -> tuple[Completeness | None, list[str]]:
    """After a batch and its quality gate: mark complete partitions, say what changed.

    Writes the `_SUCCESS` markers (with `completeness.marker`), and registers again when
    the batch's failed gate held partitions, so that no metastore parameter says
    complete where the gate says not. Runs after the commit; a failure is a warning.

    Args:
        registration: The pipeline's tables, its metastore and completeness settings.
        batch: The batch just committed (and checked); None for the newest ingest batch.
        since: The last batch whose completed partitions were announced (see
            `strata.catalog.completeness.completeness`).
        facts: What working out the batch's completeness read of the tables already, in
            this process (`strata.run` keeps it in the run's outcome).

    Returns:
        The completeness (None if it could not be worked out) and the warnings to show.
    """
    if not registration.completeness.enabled:
        return None, []
    try:
        found = _completeness(registration, batch, since, facts)
        write_markers(registration.places.table("table"), registration.completeness, found)
        # Registration ran before the gate, which held the batch's partitions (under
        # `fail`) until it passed, or marks them now: the metastore is set right at once.
        held = any(found.batch in s.held_by for s in found.partitions)
        if registration.metastore.uri and (held or found.completed):
            register_tables(registration)
    except Exception as exc:  # noqa: BLE001 - the batch stands; the next run marks again
        return None, [f"partition completeness not published: {exc}"]
    return found, []
