"""Delta commits through delta-rs: add actions, an app transaction, and metadata.

Each table gets one transaction per batch, carrying `txn(appId=pipeline,
version=batch)`. That is Delta's own idempotency mechanism (the one Spark's
streaming sinks and kafka-delta-ingest use): a batch whose version is already in the
log is skipped, so every re-run is safe.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction, Transaction

from strata.storage import delta_options
from strata.write import WrittenFile

BATCH_KEY = "strata.batch"


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
    )


def committed_batch(uri: str, app_id: str, options: dict[str, str]) -> int | None:
    """The highest batch committed to a table by a pipeline, or None."""
    table = open_table(uri, options)
    return None if table is None else table.transaction_version(app_id)


def commit_files(
    table: DeltaTable,
    schema: pa.Schema,
    partition_by: list[str],
    files: list[WrittenFile],
    app_id: str,
    batch: int,
    metadata: dict[str, Any],
) -> None:
    """Commit files and the batch's app transaction as one Delta transaction.

    Args:
        table: The table.
        schema: Arrow schema of the files.
        partition_by: Partition columns.
        files: Files to add (may be empty: the transaction still records the batch).
        app_id: The pipeline name.
        batch: The batch number.
        metadata: Custom commit metadata (ranges and counts).
    """
    now = int(time.time() * 1000)
    actions: list[AddAction | RemoveAction] = [
        AddAction(f.path, f.size, f.partition_values, now, True, f.stats) for f in files
    ]
    table.create_write_transaction(
        actions,
        mode="append",
        schema=schema,
        partition_by=partition_by or None,
        commit_properties=CommitProperties(
            custom_metadata={BATCH_KEY: batch, **{k: json.dumps(v) for k, v in metadata.items()}},
            app_transactions=[Transaction(app_id, batch)],
        ),
    )


def batch_metadata(uri: str, batch: int, options: dict[str, str], key: str) -> Any:  # noqa: ANN401
    """A custom metadata value of the commit that recorded `batch`, or None."""
    table = open_table(uri, options)
    if table is None:
        return None
    for commit in table.history():
        if commit.get(BATCH_KEY) == batch and key in commit:
            return json.loads(commit[key])
    return None
