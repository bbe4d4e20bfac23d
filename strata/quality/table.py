"""The quality table: every batch's checks and event-time partitions, for SQL.

A Delta table at `<quality location>/checks`, written through delta-rs like the
pipeline's own tables, and registered in the metastore as `<pipeline>_quality` the
way they are (`strata.catalog.register`): a Delta table for a Delta pipeline, a plain Parquet
table for a plain Parquet one. Checking a batch again replaces its rows in one
transaction, so the table holds each batch once, as last checked.

Each batch's rows are one file, and a replaced file is deleted as soon as the
transaction that replaced it stands: the table's directory, read as plain Parquet
(as a Parquet pipeline's catalog reads it), then holds every batch once too. A
query running over the old snapshot at that moment may fail, and be run again. Checks
of different batches may run at once; two checks of the same batch should not (the
Airflow DAG runs one at a time): one could delete the file the other is committing,
until the batch is checked again.

Writing it comes after the batch committed and its result was saved: a failure here
is a warning, never a lost batch or a lost result.
"""

from __future__ import annotations

import time
import uuid

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import RemoveAction

from strata.catalog.metastore import MetastoreClient
from strata.catalog.register import (
    RegistrationReport,
    delta_table,
    ensure_definition,
    location_uri,
    parquet_table,
)
from strata.config import MetastoreConfig
from strata.errors import MetastoreError
from strata.log import get_logger
from strata.quality.checks import QUALITY_SCHEMA, QualityResult, quality_rows
from strata.store.delta import BATCH_KEY, COMMIT_HOOKS, add_actions, ensure_table, open_table
from strata.store.files import filesystem
from strata.store.parquet import write_file
from strata.store.places import DATABASE_DESCRIPTION, NAME_SUFFIXES, Places, TableRef

logger = get_logger(__name__)

QUALITY_SUFFIX = NAME_SUFFIXES["quality"]
"""The quality table's name in the metastore: the pipeline's name and this."""

_ATTEMPTS = 3
"""Commits tried when another check of the same pipeline commits meanwhile."""


def quality_table_location(quality: TableRef) -> str:
    """Where the pipeline's quality table lives: `checks` under its quality location.

    Args:
        quality: The pipeline's quality location (`Places.table("quality")`).
    """
    return f"{quality.uri}/checks"


def register_written(
    places: Places, metastore: MetastoreConfig, warehouse: str, report: RegistrationReport
) -> None:
    """Register the quality table along with the pipeline's own, once a check wrote it.

    So `strata register` (and the registration after each run) repairs it too, where
    someone dropped or changed it.

    Args:
        places: The pipeline's places (its quality location among them).
        metastore: The metastore settings; `uri` must be set.
        warehouse: The warehouse root: the metastore database's location.
        report: The registration's report, which gets the table's name.

    Raises:
        MetastoreError: If the metastore cannot be reached or refuses a change.
    """
    quality = places.table("quality")
    try:
        written = open_table(quality_table_location(quality), quality.options) is not None
    except (DeltaError, OSError) as exc:
        # The pipeline's own tables are registered; this one waits for the next time.
        logger.warning(
            "pipeline %s: the quality table at %s could not be read (%s); it is registered "
            "the next time",
            places.pipeline,
            quality_table_location(quality),
            exc,
        )
        return
    if written:
        done = register_quality_table(places, metastore, warehouse)
        getattr(report, done).append(f"{places.pipeline}{QUALITY_SUFFIX}")


def _file_prefix(batch: int) -> str:
    return f"quality-b{batch:010d}-"


def replace_batch(quality: TableRef, result: QualityResult) -> int:
    """Put a batch's result in the quality table, in place of its earlier rows.

    Args:
        quality: The pipeline's quality location (`Places.table("quality")`), whose
            name is the quality table's.
        result: The batch's result.

    Returns:
        The rows the batch now has in the table.

    Raises:
        CommitFailedError: If other checks kept committing beside this one.
    """
    uri = quality_table_location(quality)
    rows = quality_rows(result)
    table = ensure_table(uri, QUALITY_SCHEMA, [], quality.options, quality.name)
    fs, root = filesystem(uri, quality.options)
    prefix = _file_prefix(result.batch)
    written = write_file(fs, root, f"{prefix}{uuid.uuid4().hex[:12]}.parquet", rows, {})
    [add] = add_actions([written])
    for attempt in range(_ATTEMPTS):
        try:
            table.create_write_transaction(
                [*_removes(table, prefix), add],
                mode="append",
                schema=QUALITY_SCHEMA,
                commit_properties=CommitProperties(custom_metadata={BATCH_KEY: result.batch}),
                post_commithook_properties=COMMIT_HOOKS,
            )
            break
        except CommitFailedError:
            # Another check (of another batch) landed first: its rows stay; the removes
            # are worked out again on the table as it now is.
            if attempt == _ATTEMPTS - 1:
                fs.delete_file(f"{root}/{written.path}")
                raise
            table.update_incremental()
    # This batch's files that no commit holds: the one just replaced, and those of
    # earlier attempts that failed before their commit.
    table.update_incremental()
    held = {p.rsplit("/", 1)[-1] for p in table.file_uris()}
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=False)):
        if info.base_name.startswith(prefix) and info.base_name not in held:
            fs.delete_file(info.path)
    return int(rows.num_rows)


def _removes(table: DeltaTable, prefix: str) -> list[RemoveAction]:
    """Remove actions for the table's files of one batch (by their names' prefix)."""
    now = int(time.time() * 1000)
    adds = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    return [
        RemoveAction(a["path"], True, now, a["size_bytes"], None)
        for a in adds
        if a["path"].startswith(prefix)
    ]


def register_quality_table(places: Places, metastore: MetastoreConfig, warehouse: str) -> str:
    """Register the quality table in the metastore, or correct its definition.

    Args:
        places: The pipeline's places (its quality location among them).
        metastore: The metastore settings; `uri` must be set.
        warehouse: The warehouse root: the metastore database's location.

    Returns:
        What was done: `created`, `updated` or `unchanged`.

    Raises:
        MetastoreError: If the metastore cannot be reached or refuses a change.
    """
    ms = metastore
    if not ms.uri:
        raise MetastoreError("no metastore configured; set metastore.uri")
    pipeline = places.pipeline
    name = f"{pipeline}{QUALITY_SUFFIX}"
    location = quality_table_location(places.table("quality"))
    if places.format == "parquet":
        wanted = parquet_table(ms.database, name, location, QUALITY_SCHEMA, [], pipeline)
    else:
        wanted = delta_table(ms.database, name, location, pipeline)
    with MetastoreClient(ms.uri, ms.timeout_s) as client:
        client.ensure_database(ms.database, location_uri(warehouse), DATABASE_DESCRIPTION)
        return ensure_definition(client, wanted)[0]


def publish_result(
    places: Places, metastore: MetastoreConfig, warehouse: str, result: QualityResult
) -> bool:
    """Write a batch's result to the quality table and register it, warning on failure.

    Args:
        places: The pipeline's places (its quality location among them).
        metastore: The metastore settings; nothing is registered without `uri`.
        warehouse: The warehouse root: the metastore database's location.
        result: The batch's result.

    Returns:
        Whether both were done.
    """
    quality = places.table("quality")
    try:
        replace_batch(quality, result)
    except (DeltaError, OSError) as exc:
        logger.warning(
            "pipeline %s: batch %d's quality result is saved, but the quality table at %s "
            "could not take it (%s); `strata quality --batch %d` writes it again",
            places.pipeline,
            result.batch,
            quality_table_location(quality),
            exc,
            result.batch,
        )
        return False
    if not metastore.uri:
        return True
    try:
        register_quality_table(places, metastore, warehouse)
    except MetastoreError as exc:
        logger.warning(
            "pipeline %s: the quality table holds batch %d, but registering it failed: %s; "
            "the next check registers it",
            places.pipeline,
            result.batch,
            exc,
        )
        return False
    return True
