"""Checking one committed batch: read what it wrote, check it, store the outcome.

This is the one module of the package that reads the pipeline's tables (through
`strata.store.tables`, like every other reader) and ties the parts together: the pure
checks (`checks`), the Great Expectations suite (`suite`), the page (`page`) and
the quality location (`store`). A batch over `quality.max_rows` is validated by the
suite on an evenly spread sample, and the result says so; reconciliation needs no
sample: it counts every row.
"""

from __future__ import annotations

import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from strata.batch.plan import PlanStore
from strata.config import MetastoreConfig, QualityConfig, SchemaSpec, TableName
from strata.errors import QualityError
from strata.quality.checks import (
    COORDINATES,
    QualityResult,
    lateness_counts,
    partition_counts,
    reason_counts,
    recent_batches,
    reconcile_checks,
    spread_sample,
)
from strata.quality.page import docs_index, summary_page
from strata.quality.store import ResultStore
from strata.quality.suite import run_suite, suite_expectations
from strata.quality.table import publish_result
from strata.schema.avro import load_topic_schema, partition_columns, table_layout
from strata.store import tables
from strata.store.delta import open_table, range_filter
from strata.store.files import filesystem
from strata.store.ledger import lag_after, read_ledger
from strata.store.places import Places, TableRef
from strata.store.ranges import OffsetRange
from strata.store.tables import Counts

_TOTALS = ("messages", "rows", "quarantined", "gaps", "bytes", "late_rows")
"""The ledger's counters summed into a result."""


def run_quality(
    places: Places,
    settings: QualityConfig,
    schemas: SchemaSpec,
    metastore: MetastoreConfig,
    warehouse: str,
    batch: int | None = None,
) -> QualityResult:
    """Check one committed batch, and write its result, Data Docs, quality table rows and
    the summary page.

    Args:
        places: The pipeline's (or routed table's) places: its tables, ledger and
            quality location.
        settings: The `quality` settings: the expectations, the gate, the sample size.
        schemas: What the data table's schema is made from, and its partitioning
            (`PipelineConfig.schemas`).
        metastore: The metastore settings; the quality table is registered when `uri`
            is set.
        warehouse: The warehouse root: the metastore database's location.
        batch: The batch; the latest committed one if None.

    Returns:
        The result. A failure is reported in it, never raised: quality never undoes
        or blocks a commit; the gate policy decides what a failure means.

    Raises:
        QualityError: If there is no such batch, or an expectation in the config is
            unknown to Great Expectations.
    """
    pipeline, table = places.pipeline, places.table("table")
    ledger = read_ledger(places)
    batch, records = _batch_records(pipeline, ledger, batch)
    committed_at = max(r["committed_at"] for r in records)
    data, missing = _batch_rows(table, schemas, batch)
    checks = reconcile_checks(ledger, batch, _counted(places, batch, data), missing)
    validated = spread_sample(data, settings.max_rows)
    topic = load_topic_schema(schemas.path, schemas.text)
    expectations = suite_expectations(
        settings, table_layout(schemas, "table")[0].names, topic.required, committed_at
    )
    store = ResultStore.of(places)
    context = Path(tempfile.mkdtemp(prefix="strata-gx-"))
    try:
        gx_checks, docs_page, runs = run_suite(
            pipeline, batch, expectations, validated, _neighbours(table, data), context / "docs"
        )
        checks = gx_checks + checks
        docs = store.copy_docs(context / "docs", docs_page)
        # Listed once their pages are there, beside every earlier run's.
        documented = [*store.docs_runs(), *runs]
        store.save_docs_runs(documented)
        store.write_docs_index(docs_index(pipeline, documented))
    finally:
        shutil.rmtree(context, ignore_errors=True)
    result = QualityResult(
        pipeline=pipeline,
        batch=batch,
        kind=records[0]["kind"],
        gate=settings.gate,
        success=all(c.success for c in checks),
        checked_at=datetime.now(UTC).isoformat(timespec="seconds"),
        committed_at=committed_at.isoformat(timespec="seconds"),
        rows=data.num_rows,
        validated_rows=validated.num_rows,
        sampled=data.num_rows > settings.max_rows,
        ledger={name: sum(r[name] for r in records) for name in _TOTALS},
        lag_after=lag_after([r for r in records if r["kind"] != "loss"]),
        checks=checks,
        partitions=partition_counts(data, partition_columns(schemas.partitioning)),
        lateness=lateness_counts(data),
        docs=docs,
        docs_location=None if docs is None else store.where(docs),
        losses=[
            {k: r[k] for k in ("topic", "partition", "start_offset", "end_offset", "note")}
            for r in records
            if r["kind"] == "loss"
        ],
    )
    if settings.gate == "fail" and not result.success:
        result.incomplete = sorted(result.partitions)
    store.save(result)
    publish_result(places, metastore, warehouse, result)
    write_summary_page(places, settings, store.recent(settings.history), ledger)
    return result


def write_summary_page(
    places: Places,
    settings: QualityConfig,
    results: list[dict[str, Any]],
    ledger_table: pa.Table,
) -> str:
    """Write `<quality>/index.html` from recent results and the ledger; returns its path.

    Args:
        places: The pipeline's places: its quarantine and quality location.
        settings: The `quality` settings: the gate and the history shown.
        results: The recent batch results, oldest first.
        ledger_table: Every ledger row.
    """
    ledger = ledger_table.to_pylist()
    batches = recent_batches(ledger, settings.history)
    reasons = _quarantine_reasons(places.table("quarantine"), batches[0] if batches else 0)
    page = summary_page(places.pipeline, settings.gate, settings.history, ledger, results, reasons)
    return ResultStore.of(places).write_page(page)


def _batch_records(
    pipeline: str, ledger: pa.Table, batch: int | None
) -> tuple[int, list[dict[str, Any]]]:
    """The batch (the latest if None) and its ledger rows.

    Raises:
        QualityError: If the ledger holds no such batch.
    """
    if ledger.num_rows == 0:
        raise QualityError(f"pipeline {pipeline} has committed no batch yet")
    latest = pc.max(ledger.column("batch")).as_py()
    batch = latest if batch is None else batch
    mine = ledger.filter(pc.equal(ledger.column("batch"), batch)).to_pylist()
    if not mine:
        raise QualityError(
            f"pipeline {pipeline} has no batch {batch}; committed batches run 1 to {latest}"
        )
    return batch, mine


def _counted(places: Places, batch: int, data: pa.Table) -> dict[TableName, Counts]:
    """The batch's rows per partition in each table it wrote, to reconcile with the ledger.

    A batch read from the raw copy (a replay) wrote no raw copy of its own.
    """
    counted: dict[TableName, Counts] = {
        "table": tables.count_by_partition(data),
        "quarantine": tables.batch_counts(places.table("quarantine"), batch),
    }
    plan = PlanStore(places).load(batch)
    if plan is None or plan.source != "raw":
        counted["raw"] = tables.batch_counts(places.table("raw"), batch)
    return counted


def _batch_rows(ref: TableRef, schemas: SchemaSpec, batch: int) -> tuple[pa.Table, list[str]]:
    """The batch's rows in the data table, and data files the table lists but lost."""
    schema = table_layout(schemas, "table")[0]
    if ref.format == "delta":
        survived = _rows_beside_lost_files(ref, batch, partition_columns(schemas.partitioning))
        if survived is not None:
            return survived
    found = tables.dataset(ref, schema=schema)
    if found is None:
        return schema.empty_table(), []
    return found.to_table(filter=ds.field("_batch") == batch), []


def _rows_beside_lost_files(
    ref: TableRef, batch: int, partitions: list[str]
) -> tuple[pa.Table, list[str]] | None:
    """For a Delta table whose log lists files of the batch that are gone: the rows of
    the files still there, and the lost files' paths; None if no file is lost.

    Delta alone can lose a file this way: its log names every data file, and a file
    deleted behind its back fails any read of the table. A lost file must be
    reported, not stop the report, so the files still there are read one by one.
    """
    table = open_table(ref.uri, ref.options)
    if table is None:
        return None
    fs, root = filesystem(ref.uri, ref.options)
    missing, present = [], []
    for add in pa.table(table.get_add_actions(flatten=True)).to_pylist():
        lo, hi = add.get("min._batch"), add.get("max._batch")
        if lo is not None and hi is not None and not lo <= batch <= hi:
            continue
        if fs.get_file_info(f"{root}/{add['path']}").type == pafs.FileType.NotFound:
            missing.append(add["path"])
        else:
            present.append(add)
    if not missing:
        return None
    schema = pa.schema(table.schema())
    if not present:
        return schema.empty_table(), missing
    wanted = ds.field("_batch") == batch
    pieces = []
    for add in present:
        path = f"{root}/{add['path']}"
        piece = ds.dataset(path, filesystem=fs, format="parquet").to_table(filter=wanted)
        # A Delta data file holds no partition values; the log does.
        for column in partitions:
            value = pa.array([add[f"partition.{column}"]] * piece.num_rows, pa.string())
            piece = piece.append_column(column, value)
        pieces.append(piece.select([n for n in schema.names if n in piece.column_names]))
    return pa.concat_tables(pieces, promote_options="default"), missing


def _neighbours(table: TableRef, data: pa.Table) -> pa.Table:
    """Coordinates of every row in the table, of any batch, within the batch's offsets.

    Uniqueness is a property of the table, not of one batch: a message landed again by
    a later batch (a re-ingest past the ledger) must show here as a duplicate.
    """
    if data.num_rows == 0:
        return data.select(COORDINATES)
    bounds = data.group_by(["_topic", "_partition"]).aggregate(
        [("_offset", "min"), ("_offset", "max")]
    )
    wanted = None
    for t, p, lo, hi in zip(*(bounds.column(i).to_pylist() for i in range(4)), strict=True):
        one = range_filter(OffsetRange(t, p, lo, hi + 1))
        wanted = one if wanted is None else wanted | one
    try:
        return tables.read(table, COORDINATES, wanted)
    except OSError:
        # A lost data file is reported by reconciliation; check what can be read.
        return data.select(COORDINATES)


def _quarantine_reasons(quarantine: TableRef, first_batch: int) -> dict[str, int]:
    """Quarantined rows per reason class (`checks.reason_class`) since `first_batch`."""
    try:
        found = tables.read(quarantine, ["reason"], ds.field("_batch") >= first_batch)
    except OSError:
        # A lost data file is reconciliation's to report; the page shows what it can.
        return {}
    return reason_counts(found.column("reason"))
