"""The ledger: a queryable Delta table with one row per batch and partition.

It is the source of truth for what has been committed: the next plan starts where
its highest batch ended, and consumer-group offsets (which expire on quiet topics)
are only a copy of it for lag tools.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc

from strata.config import PipelineConfig
from strata.delta import BATCH_KEY, commit_files, ensure_table, open_table
from strata.storage import filesystem
from strata.write import write_file

# Commit metadata of the ledger: the data table's columns as each batch wrote them.
COLUMNS_KEY = "strata.columns"

LEDGER_SCHEMA = pa.schema(
    [
        pa.field("pipeline", pa.string(), nullable=False),
        pa.field("batch", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("start_offset", pa.int64(), nullable=False),
        pa.field("end_offset", pa.int64(), nullable=False),
        pa.field("messages", pa.int64(), nullable=False),
        pa.field("rows", pa.int64(), nullable=False),
        pa.field("quarantined", pa.int64(), nullable=False),
        pa.field("gaps", pa.int64(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("late_rows", pa.int64(), nullable=False),
        pa.field("max_lateness_ms", pa.int64(), nullable=False),
        pa.field("min_event_time", pa.timestamp("us", tz="UTC")),
        pa.field("max_event_time", pa.timestamp("us", tz="UTC")),
        pa.field("high_watermark", pa.int64()),
        pa.field("committed_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("note", pa.string()),
    ]
)


@dataclass(frozen=True)
class LedgerState:
    """What the ledger says about a pipeline.

    Attributes:
        last_batch: Highest committed batch (of any kind), or 0 if none.
        committed: End offset of the latest ingested range per (topic, partition); a
            backfill re-reads old offsets and never moves it.
    """

    last_batch: int
    committed: dict[tuple[str, int], int]


def read_ledger(cfg: PipelineConfig) -> pa.Table:
    """Every ledger row of the pipeline (empty if nothing was committed yet)."""
    table = open_table(cfg.location("ledger"), cfg.storage_options)
    if table is None:
        return LEDGER_SCHEMA.empty_table()
    return table.to_pyarrow_table()


def ledger_state(cfg: PipelineConfig, rows: pa.Table | None = None) -> LedgerState:
    """The last committed batch and the committed end offset of every partition.

    Args:
        cfg: The pipeline configuration.
        rows: The ledger, if already read.
    """
    rows = read_ledger(cfg) if rows is None else rows
    if rows.num_rows == 0:
        return LedgerState(0, {})
    last = pc.max(rows.column("batch")).as_py()
    committed: dict[tuple[str, int], int] = {}
    ingested = rows.filter(pc.equal(rows.column("kind"), "ingest"))
    ordered = ingested.sort_by([("batch", "ascending")])
    for topic, partition, end in zip(
        ordered.column("topic").to_pylist(),
        ordered.column("partition").to_pylist(),
        ordered.column("end_offset").to_pylist(),
        strict=True,
    ):
        committed[(topic, partition)] = end
    return LedgerState(last, committed)


def commit_ledger(
    cfg: PipelineConfig,
    batch: int,
    rows: list[dict[str, object]],
    columns: list[list[str]] | None = None,
) -> None:
    """Append a batch's rows to the ledger in one transaction, unless already there.

    Args:
        cfg: The pipeline configuration.
        batch: The batch number.
        rows: Ledger rows without `pipeline`, `batch` and `committed_at`.
        columns: The data table's column signature the batch was written with; the
            next plan checks the schema against it.
    """
    uri = cfg.location("ledger")
    table = ensure_table(uri, LEDGER_SCHEMA, [], cfg.storage_options, f"{cfg.name}_ledger")
    if (table.transaction_version(cfg.name) or 0) >= batch:
        return
    now = datetime.now(UTC)
    full = [
        {"pipeline": cfg.name, "batch": batch, "committed_at": now, "note": None, **r} for r in rows
    ]
    data = pa.Table.from_pylist(full, schema=LEDGER_SCHEMA)
    fs, root = filesystem(uri, cfg.storage_options)
    # A fixed name per batch: a re-run overwrites, so even a plain Parquet reader of
    # the ledger directory never sees a batch twice.
    written = write_file(fs, root, f"ledger-b{batch:010d}.parquet", data, {})
    meta = {} if columns is None else {COLUMNS_KEY: columns}
    commit_files(table, LEDGER_SCHEMA, [], [written], cfg.name, batch, meta)


def committed_columns(cfg: PipelineConfig) -> tuple[int, list[list[str]]] | None:
    """The data table's columns as of the newest batch that recorded them, with its number.

    Returns:
        (batch, column signature), or None before the first batch.
    """
    table = open_table(cfg.location("ledger"), cfg.storage_options)
    if table is None:
        return None
    # The newest commits come first; maintenance commits (vacuum, optimize) carry no
    # columns, so look further back only when the recent ones have none.
    for limit in (20, None):
        for commit in table.history(limit):
            if COLUMNS_KEY in commit:
                return int(commit[BATCH_KEY]), json.loads(commit[COLUMNS_KEY])
    return None
