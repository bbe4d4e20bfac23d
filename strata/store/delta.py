"""Delta commits through delta-rs: add actions, an app transaction, and metadata.

Each table gets one transaction per batch, carrying `txn(appId=pipeline,
version=batch)`. That is Delta's own idempotency mechanism (the one Spark's
streaming sinks and kafka-delta-ingest use): a batch whose version is already in the
log is skipped, so every re-run is safe. The check is made on the very snapshot the
commit is built on, and delta-rs refuses a commit when a transaction of the same app
id landed after that snapshot: of two runners committing one batch, exactly one
commits and the other's commit is a no-op.

Maintenance uses the same mechanism as a fence. Where runs hold a lease on an object
store, a compaction's commit carries `txn(appId=<pipeline>.maintenance,
version=<its lease's fencing token>)`, and vacuum, before it deletes files no commit
lists, commits that app transaction alone with its own, higher token. A compaction
paused past its lease then cannot commit files a vacuum deleted meanwhile: if the
fence is in the snapshot it builds on, it sees a token above its own and stops; if the
fence landed after that snapshot, delta-rs refuses the commit. Ingest commits carry
another app id and add files only, so a fence never makes them fail. Each fenced
commit also records, in its commit info (`strata.maintenance_fence`), the token, what
fenced and the holder's run id: a token equal to the one the table holds passes only
for the run that wrote it (`strata.store.fencing.Fence.admit`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import (
    AddAction,
    RemoveAction,
    Transaction,
    create_table_with_add_actions,
)

from strata.errors import MaintenanceError
from strata.store.fencing import Fence, FenceRecord
from strata.store.files import delta_options
from strata.store.parquet import WrittenFile, write_file
from strata.store.ranges import OffsetRange

Key = TypeVar("Key")

BATCH_KEY = "strata.batch"
# The commit info of a fenced maintenance commit: the token, what fenced, the run.
FENCE_INFO_KEY = "strata.maintenance_fence"
# A fence beaten by concurrent commits (a schema change) is tried this often.
_FENCE_TRIES = 5
# What every commit of ours runs after it lands: delta-rs's checkpoint every
# `delta.checkpointInterval` commits (it keeps opening a table from growing with its
# log), but not its expired-log cleanup, which by default runs after every commit and
# lists the whole `_delta_log` to find nothing to delete: a cost per commit that grows
# with every batch ever committed (10,000 batches: about 35 ms of CPU a commit, and a
# listing of thousands of objects on a store). Deleting old commits is `strata
# checkpoint`'s, which keeps those a plan or an unfinished batch still reads
# (`strata.maintenance.vacuum`).
COMMIT_HOOKS = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)


def open_table(uri: str, options: dict[str, str]) -> DeltaTable | None:
    """The Delta table at `uri`, or None if there is none yet."""
    try:
        return DeltaTable(uri, storage_options=delta_options(uri, options))
    except TableNotFoundError:
        return None


def ensure_table(
    uri: str, schema: pa.Schema, partition_by: list[str], options: dict[str, str], name: str
) -> DeltaTable:
    """Open the table, creating it empty if it does not exist.

    Args:
        uri: Table location.
        schema: Arrow schema of the table.
        partition_by: Partition columns.
        options: Storage options.
        name: Table name recorded in the Delta metadata.

    Returns:
        The table.
    """
    table = open_table(uri, options)
    if table is not None:
        return table
    return DeltaTable.create(
        uri,
        schema=schema,
        partition_by=partition_by or None,
        mode="ignore",
        name=name,
        storage_options=delta_options(uri, options),
        post_commithook_properties=COMMIT_HOOKS,
    )


def create_with_files(
    uri: str,
    schema: pa.Schema,
    partition_by: list[str],
    options: dict[str, str],
    name: str,
    files: list[WrittenFile],
    app_id: str,
    batch: int,
    metadata: dict[str, Any],
) -> DeltaTable | None:
    """Create a table whose first commit holds a batch's files and app transaction.

    One transaction where creating the table empty (`ensure_table`) and then committing
    (`commit_files`) took two, and a third reading of the log between them. Version 0 is
    written only if it is absent, as every commit is: of two runners creating the table
    at once, one creates it and the other finds it there.

    Args:
        uri: Table location.
        schema: Arrow schema of the table (and of the files).
        partition_by: Partition columns.
        options: Storage options.
        name: Table name recorded in the Delta metadata.
        files: Files to add (may be empty: the transaction still records the batch).
        app_id: The pipeline name.
        batch: The batch number.
        metadata: Custom commit metadata (ranges and counts).

    Returns:
        None if this call created the table with the batch. If a table stood at `uri`
        already, that table, which this call left as it was: commit to it as to any
        table (`commit_files`, whose check tells whether it holds the batch).

    Raises:
        DeltaError: If the table could not be created and none stands there.
    """
    try:
        create_table_with_add_actions(
            uri,
            DeltaSchema.from_arrow(schema),
            add_actions(files),
            mode="error",
            partition_by=partition_by or None,
            name=name,
            storage_options=delta_options(uri, options),
            commit_properties=_batch_properties(app_id, batch, metadata),
            post_commithook_properties=COMMIT_HOOKS,
        )
    except DeltaError:
        # A table created meanwhile (by another runner) is the one case that is not a
        # failure; delta-rs gives it no type of its own, so the table itself tells.
        standing = open_table(uri, options)
        if standing is None:
            raise
        return standing
    return None


def up_to_date(tables: dict[Key, DeltaTable | None]) -> dict[Key, DeltaTable | None]:
    """The tables, each handle moved onto the newest version of its table's log.

    Only the commits made since a handle's snapshot are read: the table as opening it
    again would show it, without reading again what the handle holds. delta-rs leaves
    a handle at the snapshot its own commit was built on, so a read after a commit
    goes through here.
    """
    for table in tables.values():
        if table is not None:
            table.update_incremental()
    return tables


def range_filter(r: OffsetRange) -> ds.Expression:
    """A dataset filter for the rows of one offset range (any table with coordinates)."""
    return (
        (ds.field("_topic") == r.topic)
        & (ds.field("_partition") == r.partition)
        & (ds.field("_offset") >= r.start)
        & (ds.field("_offset") < r.end)
    )


def add_missing_columns(table: DeltaTable, schema: pa.Schema) -> list[str]:
    """Add the schema's columns the table lacks, as nullable columns, before a commit.

    delta-rs commits files whose schema has more columns than the table's without a
    word, and readers then never see the extra columns: the table must be evolved
    first. Old files have no such column, so their rows read it as null.

    Returns:
        The names of the columns added.
    """
    have = set(pa.schema(table.schema()).names)
    missing = [f.with_nullable(True) for f in schema if f.name not in have]
    if missing:
        table.alter.add_columns(
            DeltaSchema.from_arrow(pa.schema(missing)).fields,
            post_commithook_properties=COMMIT_HOOKS,
        )
    return [f.name for f in missing]


def committed_batch(uri: str, app_id: str, options: dict[str, str]) -> int | None:
    """The highest batch committed to a table by a pipeline, or None."""
    table = open_table(uri, options)
    return None if table is None else table.transaction_version(app_id)


def maintenance_app_id(pipeline: str) -> str:
    """The app id of a pipeline's maintenance commits; a pipeline name never holds a dot."""
    return f"{pipeline}.maintenance"


def maintenance_fence(table: DeltaTable, pipeline: str) -> int | None:
    """The fencing token of the newest maintenance commit the table holds, or None."""
    return table.transaction_version(maintenance_app_id(pipeline))


def fence_record(table: DeltaTable) -> FenceRecord | None:
    """What the table's newest fenced commit recorded (its token, what fenced, its run)."""
    found = newest_commit(table, lambda c: FENCE_INFO_KEY in c)
    if found is None:
        return None
    return FenceRecord.of(str(found[FENCE_INFO_KEY]), found.get("timestamp"))


def maintenance_transactions(
    table: DeltaTable, pipeline: str, fence: Fence | None
) -> list[Transaction]:
    """The app transaction a maintenance commit built on this snapshot must carry.

    Args:
        table: The table, at the snapshot the commit is built on.
        pipeline: The pipeline name.
        fence: The maintenance lock's fence; None for a lock nobody can take over (an
            flock), whose commits need no fence.

    Returns:
        `txn(<pipeline>.maintenance, token)`, or nothing without a fence.

    Raises:
        LeaseLost: If the snapshot holds a higher token, or this run's token written by
            another run (`strata.store.fencing.Fence.admit`).
    """
    if fence is None:
        return []
    stands = maintenance_fence(table, pipeline)
    fence.admit(pipeline, table.table_uri, stands, lambda: fence_record(table))
    return [Transaction(maintenance_app_id(pipeline), fence.token)]


def fence_maintenance(table: DeltaTable, pipeline: str, fence: Fence, what: str) -> None:
    """Commit a maintenance run's token to a table with no files: a fence.

    From then on, a commit carrying a lower token fails (see the module docstring), so
    files a paused compaction wrote can be deleted: it will never commit them. The
    token is above every fence the table held when the lease was taken
    (`strata.store.lease`), so the fence is always this run's own, written now.

    Args:
        table: The table.
        pipeline: The pipeline name.
        fence: The maintenance lease's fence.
        what: What fences (`vacuum`), recorded in the commit info.

    Raises:
        LeaseLost: If the table holds a higher token, or this run's token written by
            another run.
        MaintenanceError: If concurrent commits beat the fence on every try.
    """
    for attempt in range(_FENCE_TRIES):
        transactions = maintenance_transactions(table, pipeline, fence)
        if fence.wrote(table.table_uri):
            return  # an attempt whose reply was lost landed after all
        try:
            table.create_write_transaction(
                [],
                mode="append",
                schema=table.schema(),
                partition_by=list(table.metadata().partition_columns) or None,
                commit_properties=CommitProperties(
                    custom_metadata={FENCE_INFO_KEY: json.dumps(fence.record(what))},
                    app_transactions=transactions,
                ),
                post_commithook_properties=COMMIT_HOOKS,
            )
        except CommitFailedError:
            # A schema change, or a compaction that lost its lease committing, landed
            # after this snapshot: look again on the new one.
            if attempt + 1 < _FENCE_TRIES:
                table.update_incremental()
            continue
        fence.landed(table.table_uri)
        return
    raise MaintenanceError(
        f"{table.table_uri}: the {what} fence was beaten by concurrent commits "
        f"{_FENCE_TRIES} times; nothing was deleted from this table. Run it again."
    )


def commit_files(
    table: DeltaTable,
    schema: pa.Schema,
    partition_by: list[str],
    files: list[WrittenFile],
    app_id: str,
    batch: int,
    metadata: dict[str, Any],
    removes: list[RemoveAction] | None = None,
) -> bool:
    """Commit files and the batch's app transaction as one Delta transaction, once.

    Args:
        table: The table.
        schema: Arrow schema of the files.
        partition_by: Partition columns.
        files: Files to add (may be empty: the transaction still records the batch).
        app_id: The pipeline name.
        batch: The batch number.
        metadata: Custom commit metadata (ranges and counts).
        removes: Files to remove in the same transaction (a backfill's replaced rows).

    Returns:
        True if this call committed the batch; False if the table already held it
        (another runner, or an earlier attempt, committed it first).

    Raises:
        CommitFailedError: If a concurrent transaction that did not commit this
            batch conflicts with this one (nothing was committed; a re-run retries).
    """
    if (table.transaction_version(app_id) or 0) >= batch:
        return False
    actions: list[AddAction | RemoveAction] = [*(removes or []), *add_actions(files)]
    try:
        table.create_write_transaction(
            actions,
            mode="append",
            schema=schema,
            partition_by=partition_by or None,
            commit_properties=_batch_properties(app_id, batch, metadata),
            post_commithook_properties=COMMIT_HOOKS,
        )
    except CommitFailedError:
        # delta-rs found a transaction that landed after our snapshot and conflicts:
        # with the same app id, another runner committed a batch meanwhile.
        table.update_incremental()
        if (table.transaction_version(app_id) or 0) >= batch:
            return False
        raise
    return True


def add_actions(files: list[WrittenFile], data_change: bool = True) -> list[AddAction]:
    """Add actions for files written into a table (`data_change`: False for a rewrite)."""
    now = int(time.time() * 1000)
    # A file without statistics (None) is recorded without any: delta-rs takes None,
    # though its annotation says str.
    return [
        AddAction(f.path, f.size, f.partition_values, now, data_change, cast("str", f.stats))
        for f in files
    ]


def _batch_properties(app_id: str, batch: int, metadata: dict[str, Any]) -> CommitProperties:
    """What a batch's commit carries: its number and metadata, and its app transaction."""
    return CommitProperties(
        custom_metadata={BATCH_KEY: batch, **{k: json.dumps(v) for k, v in metadata.items()}},
        app_transactions=[Transaction(app_id, batch)],
    )


def batch_removes(table: DeltaTable, batch: int) -> list[RemoveAction]:
    """Remove actions for the files holding only rows of `batch` (an ingest's own files).

    Files are told by their `_batch` statistics, which every file Strata writes carries
    in full; a file whose statistics are missing is never picked.
    """
    adds = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    now = int(time.time() * 1000)
    partition_by = table.metadata().partition_columns
    removes = []
    for add in adds:
        if add.get("min._batch") == batch == add.get("max._batch"):
            values = {c: add[f"partition.{c}"] for c in partition_by}
            removes.append(RemoveAction(add["path"], True, now, add["size_bytes"], values or None))
    return removes


def commit_removes(
    table: DeltaTable,
    schema: pa.Schema,
    partition_by: list[str],
    removes: list[RemoveAction],
    batch: int,
    metadata: dict[str, Any],
) -> None:
    """Commit removals of a batch's files alone, with no app transaction.

    The batch's version already stands in the table (it was committed, then dropped),
    so the removal cannot carry it again.
    """
    if not removes:
        return
    table.create_write_transaction(
        list(removes),
        mode="append",
        schema=schema,
        partition_by=partition_by or None,
        commit_properties=CommitProperties(
            custom_metadata={BATCH_KEY: batch, **{k: json.dumps(v) for k, v in metadata.items()}}
        ),
        post_commithook_properties=COMMIT_HOOKS,
    )


def batch_metadata(uri: str, batch: int, options: dict[str, str], key: str) -> Any:  # noqa: ANN401
    """A custom metadata value of the commit that recorded `batch`, or None."""
    table = open_table(uri, options)
    return None if table is None else commit_metadata(table, batch, key)


def commit_metadata(table: DeltaTable, batch: int, key: str) -> Any:  # noqa: ANN401
    """A custom metadata value of the commit that recorded `batch` in an open table, or None.

    Args:
        table: The table, at a snapshot that holds the batch's commit.
        batch: The batch number.
        key: The metadata key.
    """
    found = newest_commit(table, lambda c: c.get(BATCH_KEY) == batch and key in c)
    return None if found is None else json.loads(found[key])


def newest_commit(
    table: DeltaTable, match: Callable[[dict[str, Any]], bool], whole: bool = True
) -> dict[str, Any] | None:
    """The newest commit whose info matches, or None.

    Asked almost always about recent commits: the last 20 are read first, the whole
    history only when they do not hold it (it grows with the table's age).

    Args:
        table: The table.
        match: Whether a commit's info is the one wanted.
        whole: Read the whole history when the last 20 commits do not hold it; without,
            a caller that has another way answers for older commits.
    """
    for limit in (20, None) if whole else (20,):
        for commit in table.history(limit):
            if match(commit):
                return commit
    return None


def without_ranges(
    table: DeltaTable,
    fs: pafs.FileSystem,
    root: str,
    partition_by: list[str],
    ranges: list[OffsetRange],
    batch: int,
) -> tuple[list[RemoveAction], list[WrittenFile], int]:
    """Rewrite the table's files that hold rows of the ranges, without those rows.

    Files are picked by their offset and partition statistics, then read to be sure.
    Nothing is committed: the caller commits the removes, the rewritten files and
    the ranges' new rows in one transaction, so readers see the old rows or the new,
    never both and never neither.

    Returns:
        Remove actions for the old files, the rewritten files, and the rows dropped.
    """
    adds = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    now = int(time.time() * 1000)
    removes: list[RemoveAction] = []
    rewritten: list[WrittenFile] = []
    dropped = 0
    # Rewritten files get names of this attempt's own: a second runner of the same
    # backfill must never overwrite a file the first one committed.
    token = uuid.uuid4().hex[:12]
    for number, add in enumerate(adds):
        bounds = [
            add.get(k) for k in ("min._partition", "max._partition", "min._offset", "max._offset")
        ]
        if None not in bounds and not any(
            bounds[0] <= r.partition <= bounds[1] and bounds[2] < r.end and bounds[3] >= r.start
            for r in ranges
        ):
            continue
        path = add["path"]
        if path.startswith("/") or "://" in path or ".." in path.split("/"):
            raise ValueError(
                f"the table's log lists a file outside the table ({path!r}); it was written by "
                "another tool. Nothing was changed."
            )
        data = pq.read_table(f"{root}/{path}", filesystem=fs)
        hit = pa.repeat(pa.scalar(False), data.num_rows)
        for r in ranges:
            in_range = pc.and_(
                pc.and_(
                    pc.equal(data.column("_topic"), r.topic),
                    pc.equal(data.column("_partition"), r.partition),
                ),
                pc.and_(
                    pc.greater_equal(data.column("_offset"), r.start),
                    pc.less(data.column("_offset"), r.end),
                ),
            )
            hit = pc.or_(hit, in_range)
        count = int(pc.sum(pc.cast(hit, pa.int64())).as_py() or 0)
        if count == 0:
            continue
        dropped += count
        values = {c: add[f"partition.{c}"] for c in partition_by}
        removes.append(RemoveAction(path, True, now, add["size_bytes"], values or None))
        keep = data.filter(pc.invert(hit))
        if keep.num_rows:
            directory = path.rsplit("/", 1)[0] + "/" if "/" in path else ""
            rel = f"{directory}part-b{batch:010d}-x{number:05d}-{token}-f000.snappy.parquet"
            rewritten.append(write_file(fs, root, rel, keep, values))
    return removes, rewritten, dropped
