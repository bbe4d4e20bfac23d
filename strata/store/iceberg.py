"""Iceberg tables through pyiceberg's Hive catalog: each batch's files in one snapshot, once.

The Spark tasks write Parquet files as for Delta (partition columns kept out of the
files, Hive-style `dt=/hr=` directories). The driver commits a table's files of a
batch as one append, built from what the tasks reported (`WrittenFile`): no file
is opened again. It is a merge append: each batch adds a manifest, and once a table
holds 100 small ones they are folded into one, so that finding a batch's files (and
every read) plans over a bounded number of manifests after years of hourly batches.
The snapshot's summary records the batch, the run and the batch's
ranges; the table property `strata.batch.<pipeline>` records the newest batch
committed, set in the same metadata commit as the append.

Exactly once rests on three things:

- The batch is checked on the table as loaded for the commit, and the append carries
  pyiceberg's requirement that the branch still points at the snapshot it was built
  on. The Hive catalog checks that requirement under the metastore's table lock, so
  of two runners committing one batch, one commits; the other's commit fails.
- A failed commit is retried here, not by pyiceberg: its own retry rebuilds the
  append on whatever landed meanwhile, and would add a batch's files a second time
  after another runner committed the batch. Tables are created with
  `commit.retry.num-retries=0`; `commit_batch` reloads the table, and stops if the
  batch is there now.
- Data files lack field ids: the table's name mapping (`schema.name-mapping.default`)
  maps the Parquet columns to Iceberg's column ids, and identity partition columns,
  kept out of the files, are read from each file's partition values, as Iceberg's
  specification has every reader do.
"""

from __future__ import annotations

import getpass
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar, cast

import pyarrow as pa
import pyarrow.dataset as ds
from hive_metastore.ttypes import (
    DataOperationType,
    LockComponent,
    LockLevel,
    LockRequest,
    LockType,
)
from pyiceberg.catalog.hive import HiveCatalog
from pyiceberg.conversions import to_bytes
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.io.pyarrow import _ConvertToIcebergWithoutIDs, visit_pyarrow
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table import TableProperties
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Identifier, Record
from thrift.Thrift import TException

from strata import faults
from strata.errors import MetastoreError, TableMismatch
from strata.store.files import filesystem
from strata.store.parquet import WrittenFile
from strata.store.places import DATABASE_DESCRIPTION

if TYPE_CHECKING:
    from pyiceberg.io import FileIO
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.types import PrimitiveType

    from strata.store.places import TableRef
    from strata.store.ranges import OffsetRange

# The table property holding the newest batch of a pipeline committed to the table.
_BATCH_PROPERTY = "strata.batch.{pipeline}"
# Snapshot summary keys of a batch's commit.
SUMMARY_BATCH = "strata.batch"
SUMMARY_PIPELINE = "strata.pipeline"
# A commit beaten by another writer's is tried again this often, the batch checked first.
COMMIT_TRIES = 8
# The first field id of partition fields, as Iceberg numbers them.
_PARTITION_FIELD_IDS = 1000


class _HiveCatalog(HiveCatalog):
    """pyiceberg's Hive catalog, with the table lock Hive Metastores of every version take.

    pyiceberg asks for the lock without an operation type; a Hive 2.3 metastore in
    test mode refuses that (`operationType=UNSET`). Iceberg's Java client asks for the
    same lock with `NO_TXN`, which every metastore since 2.x accepts.
    """

    @staticmethod
    def _write_metadata(metadata: TableMetadata, io: FileIO, metadata_path: str) -> None:
        """Write a commit's new metadata file (under the table lock, before the swap)."""
        HiveCatalog._write_metadata(metadata, io, metadata_path)
        faults.reached(faults.ICEBERG_METADATA_WRITTEN)

    def load_table(self, identifier: str | Identifier) -> Table:
        """Load a table; what the metastore answers in Thrift's terms, as Strata's error."""
        with _metastore_errors(self, "load", identifier):
            return super().load_table(identifier)

    def create_table(self, identifier: str | Identifier, *args: Any, **kwargs: Any) -> Table:  # noqa: ANN401
        """Create a table, its errors as `load_table`'s."""
        with _metastore_errors(self, "create", identifier):
            return super().create_table(identifier, *args, **kwargs)

    def commit_table(self, table: Table, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        """Commit to a table under its lock, its errors as `load_table`'s."""
        with _metastore_errors(self, "commit to", table.name()):
            return super().commit_table(table, *args, **kwargs)

    def create_namespace(self, namespace: str | Identifier, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401
        """Create a database, its errors as `load_table`'s."""
        with _metastore_errors(self, "create the database of", namespace):
            super().create_namespace(namespace, *args, **kwargs)

    def _create_lock_request(self, database_name: str, table_name: str) -> LockRequest:
        component = LockComponent(
            level=LockLevel.TABLE,
            type=LockType.EXCLUSIVE,
            dbname=database_name,
            tablename=table_name,
            operationType=DataOperationType.NO_TXN,
            isTransactional=False,
        )
        return LockRequest(
            component=[component], user=getpass.getuser(), hostname=socket.gethostname()
        )


@contextmanager
def _metastore_errors(
    found: HiveCatalog, what: str, identifier: str | Identifier
) -> Iterator[None]:
    """Raise what the metastore refused, or a lost connection, as `MetastoreError`.

    Thrift's exceptions cannot take a traceback once raised (they are frozen), so one
    passing through a `with` block of the caller's fails there with a `TypeError`
    that hides it; and their text names no table.
    """
    try:
        yield
    except TException as exc:
        name = identifier if isinstance(identifier, str) else ".".join(identifier)
        detail = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        raise MetastoreError(
            f"the metastore at {found.properties.get('uri')} could not {what} Iceberg table "
            f"{name}: {detail}. Check that it runs and that its schema has the transaction "
            "tables (TXNS, HIVE_LOCKS) Iceberg's table lock needs"
        ) from None


def catalog(ref: TableRef) -> HiveCatalog:
    """The Hive catalog of the table's metastore (one per metastore and storage options).

    Raises:
        ValueError: If the table has no metastore (configuration checks this first).
    """
    if ref.metastore is None:
        raise ValueError(
            f"table {ref.name}: table_format iceberg needs metastore.uri, where its catalog is"
        )
    key = (ref.metastore[0], tuple(sorted(ref.options.items())))
    held: dict[Any, HiveCatalog] = _THREAD.__dict__.setdefault("catalogs", {})
    if key not in held:
        held[key] = _catalog(*key)
    return held[key]


# A catalog's metastore client is one Thrift connection, which threads must not share:
# each thread (a routed pipeline's batches commit from a few) keeps catalogs of its own.
_THREAD = threading.local()


def _catalog(uri: str, options: tuple[tuple[str, str], ...]) -> HiveCatalog:
    """A catalog of the metastore at `uri`, its files reached with the storage `options`."""
    opts = dict(options)
    properties = {
        "uri": uri,
        # A lock whose holder died is given up by the metastore (`hive.txn.timeout`);
        # until then a commit waits, rather than failing at once.
        "lock-check-retries": "30",
        "lock-check-max-wait-time": "5",
        # The metastore's copy of the columns in types Hive 2 knows too (`timestamp` for
        # a UTC instant); Iceberg readers take the types from the table's metadata.
        "hive.hive2-compatible": "true",
    }
    endpoint = opts.get("AWS_ENDPOINT_URL")
    if endpoint:
        properties["s3.endpoint"] = endpoint
    for ours, theirs in (
        ("AWS_ACCESS_KEY_ID", "s3.access-key-id"),
        ("AWS_SECRET_ACCESS_KEY", "s3.secret-access-key"),
        ("AWS_SESSION_TOKEN", "s3.session-token"),
    ):
        if opts.get(ours):
            properties[theirs] = opts[ours]
    region = opts.get("AWS_REGION") or opts.get("AWS_DEFAULT_REGION")
    if region or endpoint:
        properties["s3.region"] = region or "us-east-1"
    return _HiveCatalog("strata", **properties)


def location(uri: str) -> str:
    """A table location as Iceberg metadata records it: a URI (`file:` for a local path)."""
    return uri if "://" in uri else f"file://{uri}"


def identifier(ref: TableRef) -> tuple[str, str]:
    """The table's (database, name) in the catalog."""
    return (ref.metastore[1] if ref.metastore else "default", ref.name)


def open_table(ref: TableRef) -> Table | None:
    """The Iceberg table, or None if the catalog has none of that name.

    Raises:
        TableMismatch: If the metastore names the table but its metadata file is gone
            (its files were deleted under it).
    """
    try:
        return catalog(ref).load_table(identifier(ref))
    except NoSuchTableError:
        return None
    except FileNotFoundError as exc:
        database, name = identifier(ref)
        raise TableMismatch(
            f"the metastore's entry of Iceberg table {database}.{name} points at metadata "
            f"that is gone ({exc}): the table's files were deleted at {ref.uri}. "
            "`strata status` names the ways out"
        ) from None


def committed_batch(table: Table | None, pipeline: str) -> int | None:
    """The newest batch of `pipeline` committed to the table (as loaded), or None."""
    if table is None:
        return None
    value = table.properties.get(_BATCH_PROPERTY.format(pipeline=pipeline))
    return None if value is None else int(value)


# How far back from the current snapshot `current_batch` looks for a batch's own: past a
# few maintenance snapshots (a compaction's, a vacuum's fence), never the whole history.
_ANCESTRY = 50


def current_batch(table: Table, pipeline: str) -> int | None:
    """The newest batch of `pipeline` among the current snapshot and its ancestors, or None.

    None when none of the nearest ancestors was a batch's (or the table has none).
    """
    snapshot = table.current_snapshot()
    for _ in range(_ANCESTRY):
        if snapshot is None:
            return None
        summary = snapshot.summary
        if summary is not None and summary.get(SUMMARY_PIPELINE) == pipeline:
            batch = summary.get(SUMMARY_BATCH)
            if batch is not None:
                return int(batch)
        parent = snapshot.parent_snapshot_id
        snapshot = None if parent is None else table.snapshot_by_id(parent)
    return None


def iceberg_schema(schema: pa.Schema) -> Schema:
    """An Arrow schema as an Iceberg schema with fresh column ids (non-nullable: required)."""
    converted = visit_pyarrow(schema, _ConvertToIcebergWithoutIDs())
    return assign_fresh_schema_ids(converted)


def create_table(ref: TableRef, schema: pa.Schema, partition_by: list[str]) -> Table:
    """Create the table (identity partitions on `partition_by`), or load it if it exists.

    Of two runners creating it at once, the metastore keeps one; the other loads it.
    """
    # The partition columns are kept out of the files, and pyiceberg's reader fills a
    # column a file lacks from the file's partition value only if the column is
    # optional: they are declared optional (every row has them all the same).
    fresh = iceberg_schema(
        pa.schema([f.with_nullable(True) if f.name in partition_by else f for f in schema])
    )
    spec = PartitionSpec(
        *(
            PartitionField(
                fresh.find_field(column).field_id,
                _PARTITION_FIELD_IDS + i,
                IdentityTransform(),
                column,
            )
            for i, column in enumerate(partition_by)
        )
    )
    properties = {
        TableProperties.DEFAULT_NAME_MAPPING: fresh.name_mapping.model_dump_json(),
        TableProperties.COMMIT_NUM_RETRIES: "0",
        # A manifest per batch would be read by every scan, for ever: fold them.
        TableProperties.MANIFEST_MERGE_ENABLED: "true",
        "write.parquet.compression-codec": "snappy",
    }
    found = catalog(ref)
    database, _ = identifier(ref)
    # The first commit can come before the first registration, which creates the
    # database too (and finds it here then): beside the table, as registration puts it.
    found.create_namespace_if_not_exists(
        database,
        {
            "location": location(ref.uri).rstrip("/").rsplit("/", 1)[0],
            "comment": DATABASE_DESCRIPTION,
        },
    )
    try:
        return found.create_table(
            identifier(ref),
            fresh,
            location=location(ref.uri),
            partition_spec=spec,
            properties=properties,
        )
    except TableAlreadyExistsError:
        return catalog(ref).load_table(identifier(ref))


def data_file(table: Table, root: str, written: WrittenFile) -> DataFile:
    """The manifest entry of a file a task wrote, from what the task reported."""
    spec = table.spec()
    schema = table.schema()
    values = []
    for field in spec.fields:
        column = schema.find_column_name(field.source_id)
        raw = written.partition_values.get(column or "")
        # Every partition column is a string (`strata.schema.avro.data_schema`), as the
        # Hive-style directory names hold it.
        values.append(raw)
    bounds = _batch_bounds(schema, written.stats)
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=f"{root}/{written.path}",
        file_format=FileFormat.PARQUET,
        partition=Record(*values),
        file_size_in_bytes=written.size,
        record_count=written.rows,
        sort_order_id=None,
        spec_id=spec.spec_id,
        equality_ids=None,
        key_metadata=None,
        lower_bounds=bounds[0],
        upper_bounds=bounds[1],
    )


def _batch_bounds(
    schema: Schema, stats: str | None
) -> tuple[dict[int, bytes] | None, dict[int, bytes] | None]:
    """The `_batch` column's bounds, from the task's statistics, as manifest metrics.

    With them a scan for one batch's rows (`batch_files`) reads only the files that may
    hold it, as Delta's statistics let a Delta table's count do.
    """
    if stats is None or "_batch" not in {f.name for f in schema.fields}:
        return None, None
    found = json.loads(stats)
    low = found.get("minValues", {}).get("_batch")
    high = found.get("maxValues", {}).get("_batch")
    if low is None or high is None:
        return None, None
    column = schema.find_field("_batch")
    kind = cast("PrimitiveType", column.field_type)
    return {column.field_id: to_bytes(kind, low)}, {column.field_id: to_bytes(kind, high)}


def batch_files(table: Table, batch: int) -> list[str]:
    """The current data files that may hold rows of `batch`, by their `_batch` bounds."""
    if table.current_snapshot() is None:
        return []
    scan = table.scan(row_filter=f"_batch = {int(batch)}")
    return [task.file.file_path for task in scan.plan_files()]


T = TypeVar("T")


def retry_commits(table: Table, step: Callable[[Table], T], fresh: bool = False) -> T:
    """Take a commit's step on the table as loaded now; again while others' commits beat it.

    Each try loads the table again (the first too, unless the caller just loaded it:
    `fresh`), so the step decides on what stands now (whether the batch is there, which
    files are current) before it commits. A commit leaves the handle at the metadata it
    committed.

    Raises:
        CommitFailedException: If every try was beaten by another writer's commit.
    """
    for attempt in range(COMMIT_TRIES):
        try:
            return step(table if fresh and attempt == 0 else table.refresh())
        except CommitFailedException:
            if attempt == COMMIT_TRIES - 1:
                raise
            time.sleep(min(0.05 * 2**attempt, 2.0))
    raise AssertionError("unreachable")


def summary_properties(summary: Mapping[str, Any]) -> dict[str, str]:
    """Snapshot summary values as Iceberg keeps them: strings, anything else as JSON."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in summary.items()}


def commit_files(
    ref: TableRef,
    schema: pa.Schema,
    partition_by: list[str],
    files: list[WrittenFile],
    pipeline: str,
    batch: int,
    meta: Mapping[str, Any],
    replacing: list[OffsetRange] | None = None,
    table: Table | None = None,
) -> tuple[list[str], Table]:
    """Commit a batch's files to one Iceberg table, creating it first if there is none.

    Args:
        ref: The table.
        schema: Its Arrow schema as the batch wrote it.
        partition_by: Its partition columns (identity partitions).
        files: The batch's files.
        pipeline: The pipeline (or routed table) committing.
        batch: The batch number.
        meta: What the snapshot's summary records (the batch's ranges, ...).
        replacing: Ranges whose rows the commit removes first (a backfill or replay).
        table: The table as loaded earlier in the batch; None if there was none.

    Returns:
        The columns added to the table first, and the table after the commit.
    """
    if table is None:
        table = create_table(ref, schema, partition_by)
    else:
        # Loaded before the batch's tasks ran: what landed since is read once here.
        table = table.refresh()
    added = add_missing_columns(table, schema)
    committed = commit_batch(ref, pipeline, table, files, batch, meta, replacing, fresh=True)
    return added, committed or table.refresh()


def commit_batch(
    ref: TableRef,
    pipeline: str,
    table: Table,
    files: list[WrittenFile],
    batch: int,
    summary: Mapping[str, Any],
    replacing: list[OffsetRange] | None = None,
    fresh: bool = False,
) -> Table | None:
    """Append a batch's files to the table in one snapshot, unless the batch is there.

    Args:
        ref: The table.
        pipeline: The pipeline (or routed table) committing: whose batch it is.
        table: The table as loaded earlier; it is reloaded before each try.
        files: The batch's files (paths relative to the table's root).
        batch: The batch number.
        summary: What the snapshot's summary records besides the batch (its ranges,
            the run); values that are not strings are kept as JSON.
        replacing: Ranges whose rows are deleted in the same metadata commit, before
            the files are added (a backfill or replay): files holding only such rows
            are dropped, the others rewritten without them.
        fresh: The table was loaded just now: the first try takes it as it is.

    Returns:
        The table after the commit; None if the batch was there already (another
        runner, or an earlier attempt, committed it).

    Raises:
        CommitFailedException: If every try was beaten by another writer's commit.
    """
    properties = {
        SUMMARY_BATCH: str(batch),
        SUMMARY_PIPELINE: pipeline,
        **summary_properties(summary),
    }
    root = location(ref.uri).rstrip("/")

    def commit(current: Table) -> Table | None:
        if (committed_batch(current, pipeline) or -1) >= batch:
            return None
        entries = [data_file(current, root, f) for f in files]
        with current.transaction() as tx:
            tx.set_properties({_BATCH_PROPERTY.format(pipeline=pipeline): str(batch)})
            if replacing:
                tx.delete(ranges_filter(replacing), snapshot_properties=properties)
            # Always one snapshot, even of no files: the append carries the requirement
            # that no commit landed since the table was loaded, which a change of
            # properties alone would not.
            with tx.update_snapshot(snapshot_properties=properties).merge_append() as append:
                for entry in entries:
                    append.append_data_file(entry)
        return current

    return retry_commits(table, commit, fresh)


def ranges_filter(ranges: list[OffsetRange]) -> str:
    """An Iceberg row filter for the rows of any of the offset ranges."""
    return " OR ".join(
        f"(_topic = '{r.topic}' AND _partition = {int(r.partition)} AND "
        f"_offset >= {int(r.start)} AND _offset < {int(r.end)})"
        for r in ranges
    )


def snapshot_summary(table: Table, pipeline: str, batch: int, key: str) -> Any:  # noqa: ANN401
    """A value the batch's snapshot recorded (`commit_batch`'s summary), or None."""
    for snapshot in reversed(table.snapshots()):
        summary = snapshot.summary
        if summary is None:
            continue
        if summary.get(SUMMARY_BATCH) == str(batch) and summary.get(SUMMARY_PIPELINE) == pipeline:
            value = summary.get(key)
            if value is None:
                return None
            try:
                return json.loads(value)
            except ValueError:
                return value
    return None


def current_files(table: Table) -> list[str]:
    """The data files of the table's current snapshot, as absolute URIs."""
    if table.current_snapshot() is None:
        return []
    return [task.file.file_path for task in table.scan().plan_files()]


def relative(ref: TableRef, path: str) -> str:
    """A data file's URI as a path relative to the table's root."""
    root = location(ref.uri).rstrip("/") + "/"
    if not path.startswith(root):
        raise ValueError(f"{path} is not under the table's location {root}")
    return path[len(root) :]


def add_missing_columns(table: Table, schema: pa.Schema) -> list[str]:
    """Add the columns of `schema` the table lacks (new ids, the name mapping with them).

    Of two runners adding them at once, one's change lands; the other finds the
    columns there when it tries again.

    Returns:
        The columns added, by name.
    """

    if all(f.name in {c.name for c in table.schema().fields} for f in schema):
        return []  # the common case: the handle, loaded just now, has every column

    def add(current: Table) -> list[str]:
        have = {f.name for f in current.schema().fields}
        missing = [f.name for f in schema if f.name not in have]
        if missing:
            # Only the new columns, optional (as Iceberg adds a column to existing rows):
            # a union with the whole schema would also try to tighten the partition
            # columns to required.
            added = pa.schema([schema.field(name).with_nullable(True) for name in missing])
            with current.update_schema() as update:
                update.union_by_name(added)
        return missing

    return retry_commits(table, add)


def arrow_dataset(ref: TableRef, table: Table | None = None) -> ds.Dataset | None:
    """The table's current snapshot as one Arrow dataset; None if there is no table or file.

    The files are read as the tasks wrote them, each partition's columns from its
    `dt=/hr=` directories (as its partition values hold them), under the table's
    current schema: a column added since a file was written reads as null there.
    """
    if table is None:
        table = open_table(ref)
    if table is None:
        return None
    files = current_files(table)
    if not files:
        return None
    fs, root = filesystem(ref.uri, ref.options)
    schema = _plain_strings(table.schema().as_arrow())
    partition_by = [table.schema().find_column_name(f.source_id) for f in table.spec().fields]
    partitioning = ds.partitioning(
        pa.schema([schema.field(c) for c in partition_by if c is not None]), flavor="hive"
    )
    return ds.dataset(
        [f"{root}/{relative(ref, f)}" for f in files],
        filesystem=fs,
        format="parquet",
        schema=schema,
        partitioning=partitioning,
        partition_base_dir=root,
    )


def _plain_strings(schema: pa.Schema) -> pa.Schema:
    """pyiceberg's Arrow schema with `string`/`binary` where it says `large_` (as written)."""
    swap = {pa.large_string(): pa.string(), pa.large_binary(): pa.binary()}
    return pa.schema(
        [f.with_type(swap.get(f.type, f.type)) for f in schema], metadata=schema.metadata
    )


def files_to_read(ref: TableRef, batch: int | None = None) -> tuple[str, ...]:
    """The current files of the table, relative to its root; of one batch's rows if given.

    What the Spark tasks read a raw copy from: they reach the files, not the catalog.
    """
    table = open_table(ref)
    if table is None:
        return ()
    found = current_files(table) if batch is None else batch_files(table, batch)
    return tuple(relative(ref, f) for f in found)


def set_properties(ref: TableRef, properties: Mapping[str, str]) -> bool:
    """Set table properties the table does not hold yet as given; whether any changed.

    No table yet (its first batch not committed): nothing to set, and False.
    """
    table = open_table(ref)
    if table is None:
        return False
    changed = {k: v for k, v in properties.items() if table.properties.get(k) != v}
    if not changed:
        return False
    with table.transaction() as tx:
        tx.set_properties(changed)
    return True
