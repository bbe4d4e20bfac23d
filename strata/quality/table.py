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
from deltalake.transaction import AddAction, RemoveAction

from strata.batch.write import write_file
from strata.catalog.metastore import MetastoreClient
from strata.catalog.register import (
    RegistrationReport,
    delta_table,
    ensure_definition,
    location_uri,
    parquet_table,
)
from strata.config import PipelineConfig
from strata.errors import MetastoreError
from strata.log import get_logger
from strata.quality.checks import QUALITY_SCHEMA, QualityResult, quality_rows
from strata.store.delta import BATCH_KEY, ensure_table, open_table
from strata.store.files import filesystem
from strata.store.places import NAME_SUFFIXES

logger = get_logger(__name__)

QUALITY_SUFFIX = NAME_SUFFIXES["quality"]
"""The quality table's name in the metastore: the pipeline's name and this."""

_ATTEMPTS = 3
"""Commits tried when another check of the same pipeline commits meanwhile."""


def quality_table_location(cfg: PipelineConfig) -> str:
    """Where the pipeline's quality table lives: `checks` under its quality location."""
    return f"{cfg.location('quality')}/checks"


def register_written(cfg: PipelineConfig, report: RegistrationReport) -> None:
    """Register the quality table along with the pipeline's own, once a check wrote it.

    So `strata register` (and the registration after each run) repairs it too, where
    someone dropped or changed it.

    Args:
        cfg: The pipeline configuration; `metastore.uri` must be set.
        report: The registration's report, which gets the table's name.

    Raises:
        MetastoreError: If the metastore cannot be reached or refuses a change.
    """
    try:
        written = open_table(quality_table_location(cfg), cfg.storage_options) is not None
    except (DeltaError, OSError) as exc:
        # The pipeline's own tables are registered; this one waits for the next time.
        logger.warning(
            "pipeline %s: the quality table at %s could not be read (%s); it is registered "
            "the next time",
            cfg.name,
            quality_table_location(cfg),
            exc,
        )
        return
    if written:
        getattr(report, register_quality_table(cfg)).append(f"{cfg.name}{QUALITY_SUFFIX}")


def _file_prefix(batch: int) -> str:
    return f"quality-b{batch:010d}-"


def replace_batch(cfg: PipelineConfig, result: QualityResult) -> int:
    """Put a batch's result in the quality table, in place of its earlier rows.

    Args:
        cfg: The pipeline configuration.
        result: The batch's result.

    Returns:
        The rows the batch now has in the table.

    Raises:
        CommitFailedError: If other checks kept committing beside this one.
    """
    uri = quality_table_location(cfg)
    rows = quality_rows(result)
    name = f"{cfg.name}{QUALITY_SUFFIX}"
    table = ensure_table(uri, QUALITY_SCHEMA, [], cfg.storage_options, name)
    fs, root = filesystem(uri, cfg.storage_options)
    prefix = _file_prefix(result.batch)
    written = write_file(fs, root, f"{prefix}{uuid.uuid4().hex[:12]}.parquet", rows, {})
    add = AddAction(written.path, written.size, {}, int(time.time() * 1000), True, written.stats)
    for attempt in range(_ATTEMPTS):
        try:
            table.create_write_transaction(
                [*_removes(table, prefix), add],
                mode="append",
                schema=QUALITY_SCHEMA,
                commit_properties=CommitProperties(custom_metadata={BATCH_KEY: result.batch}),
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


def register_quality_table(cfg: PipelineConfig) -> str:
    """Register the quality table in the metastore, or correct its definition.

    Args:
        cfg: The pipeline configuration; `metastore.uri` must be set.

    Returns:
        What was done: `created`, `updated` or `unchanged`.

    Raises:
        MetastoreError: If the metastore cannot be reached or refuses a change.
    """
    ms = cfg.metastore
    if not ms.uri:
        raise MetastoreError("no metastore configured; set metastore.uri")
    name = f"{cfg.name}{QUALITY_SUFFIX}"
    location = quality_table_location(cfg)
    if cfg.table_format == "parquet":
        wanted = parquet_table(ms.database, name, location, QUALITY_SCHEMA, [], cfg.name)
    else:
        wanted = delta_table(ms.database, name, location, cfg.name)
    with MetastoreClient(ms.uri, ms.timeout_s) as client:
        client.ensure_database(
            ms.database, location_uri(cfg.warehouse), "Tables landed from Kafka by Strata"
        )
        return ensure_definition(client, wanted)[0]


def publish_result(cfg: PipelineConfig, result: QualityResult) -> bool:
    """Write a batch's result to the quality table and register it, warning on failure.

    Returns:
        Whether both were done.
    """
    try:
        replace_batch(cfg, result)
    except (DeltaError, OSError) as exc:
        logger.warning(
            "pipeline %s: batch %d's quality result is saved, but the quality table at %s "
            "could not take it (%s); `strata quality --batch %d` writes it again",
            cfg.name,
            result.batch,
            quality_table_location(cfg),
            exc,
            result.batch,
        )
        return False
    if not cfg.metastore.uri:
        return True
    try:
        register_quality_table(cfg)
    except MetastoreError as exc:
        logger.warning(
            "pipeline %s: the quality table holds batch %d, but registering it failed: %s; "
            "the next check registers it",
            cfg.name,
            result.batch,
            exc,
        )
        return False
    return True
