"""Data quality of each batch: a Great Expectations suite, reconciliation, and reports.

The suite runs on a pandas DataFrame of the batch's rows, read through Arrow from
the committed table. That is the honest choice here: Strata reads and writes its
tables with delta-rs and Arrow (local or S3), and the batch's rows are already in
that form; a Spark DataFrame would be a copy of the same Arrow table made through
the driver, and Spark has no Delta or S3 connector in this deployment. A batch over
`quality.max_rows` is validated on an evenly spread sample, and the result says so.

Reconciliation runs beside the suite and needs no sample: it counts every row.
Each run writes one JSON result per batch, the batch's Data Docs page, and the
pipeline's summary page, all under `quality.location`.

Great Expectations 1.x escapes the parameters of its sentences but writes unexpected
values, observed values and exception tracebacks into Data Docs as raw HTML, and those
hold message text. The docs are therefore built from a copy of each validation result
in which that text is escaped (`_inert_for_docs`); the JSON result keeps it as it is.
"""

from __future__ import annotations

import copy
import html
import json
import logging
import re
import shutil
import tempfile
import warnings
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from strata.config import PipelineConfig, parse_duration_ms
from strata.delta import open_table, range_filter
from strata.errors import QualityError
from strata.ledger import read_ledger
from strata.plan import OffsetRange, PlanStore
from strata.reconcile import ledger_continuity
from strata.schema import load_topic_schema, partition_columns, table_layout
from strata.storage import filesystem, read_bytes, write_bytes_atomically
from strata.tables import count_by_partition

if TYPE_CHECKING:
    from great_expectations.core.expectation_validation_result import (
        ExpectationSuiteValidationResult,
    )

COORDINATES = ["_topic", "_partition", "_offset"]
# Upper bounds of the late-arrival buckets (Kafka time minus event time), in seconds.
LATENESS_BUCKETS = [(60, "<1m"), (600, "1-10m"), (3600, "10m-1h"), (6 * 3600, "1-6h")]
LATENESS_LABELS = [label for _, label in LATENESS_BUCKETS] + ["6-24h", ">24h"]


@dataclass
class Check:
    """One check's outcome.

    Attributes:
        name: Expectation type, or `reconcile: ...` for reconciliation checks.
        success: Whether it passed.
        column: The column it is about, if one.
        detail: What failed, in words (empty when it passed).
        unexpected: How many rows failed it.
    """

    name: str
    success: bool
    column: str | None = None
    detail: str = ""
    unexpected: int = 0


@dataclass
class QualityResult:
    """A batch's quality, as written to `results/batch-<N>.json`.

    Attributes:
        pipeline: Pipeline name.
        batch: Batch number.
        kind: The batch's ledger kind.
        gate: The policy in force: `fail`, `warn` or `off`.
        success: Every check passed.
        checked_at: When the checks ran.
        committed_at: When the batch committed.
        rows: The batch's rows in the data table.
        validated_rows: Rows the expectations ran on.
        sampled: Whether the expectations ran on a sample.
        ledger: The batch's totals from the ledger.
        lag_after: Messages behind the high watermark when the batch was planned, less
            what it read.
        checks: Every check, passed or not.
        partitions: Event-time partitions the batch wrote, with rows each.
        lateness: Rows per late-arrival bucket.
        docs: The batch's Data Docs page, relative to the quality location.
        incomplete: Partitions marked incomplete because the gate failed.
        losses: Ranges this batch recorded as deleted by retention before read.
    """

    pipeline: str
    batch: int
    kind: str
    gate: str
    success: bool
    checked_at: str
    committed_at: str
    rows: int
    validated_rows: int
    sampled: bool
    ledger: dict[str, int]
    lag_after: int | None
    checks: list[Check] = field(default_factory=list)
    partitions: dict[str, int] = field(default_factory=dict)
    lateness: dict[str, int] = field(default_factory=dict)
    docs: str | None = None
    incomplete: list[str] = field(default_factory=list)
    losses: list[dict[str, Any]] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        """The checks that failed."""
        return [c for c in self.checks if not c.success]


def run_quality(cfg: PipelineConfig, batch: int | None = None) -> QualityResult:
    """Check one committed batch, and write its result, Data Docs and the summary page.

    Args:
        cfg: The pipeline configuration.
        batch: The batch; the latest committed one if None.

    Returns:
        The result. A failure is reported in it, never raised: quality never undoes
        or blocks a commit; the gate policy decides what a failure means.

    Raises:
        QualityError: If there is no such batch, or an expectation in the config is
            unknown to Great Expectations.
    """
    ledger = read_ledger(cfg)
    if ledger.num_rows == 0:
        raise QualityError(f"pipeline {cfg.name} has committed no batch yet")
    latest = pc.max(ledger.column("batch")).as_py()
    batch = latest if batch is None else batch
    mine = ledger.filter(pc.equal(ledger.column("batch"), batch))
    if mine.num_rows == 0:
        raise QualityError(
            f"pipeline {cfg.name} has no batch {batch}; committed batches run 1 to {latest}"
        )
    records = mine.to_pylist()
    kind = records[0]["kind"]
    committed_at = max(r["committed_at"] for r in records)
    data, missing = _batch_rows(cfg, batch)
    checks = reconcile_checks(cfg, batch, ledger, data, missing)
    validated = data
    sampled = data.num_rows > cfg.quality.max_rows
    if sampled:
        step = data.num_rows / cfg.quality.max_rows
        validated = data.take([int(i * step) for i in range(cfg.quality.max_rows)])
    context = Path(tempfile.mkdtemp(prefix="strata-gx-"))
    try:
        gx_checks, docs_page = _expectations(
            cfg, batch, validated, _neighbours(cfg, data), committed_at, context
        )
        checks = gx_checks + checks
        docs = _publish_docs(cfg, context, docs_page)
    finally:
        shutil.rmtree(context, ignore_errors=True)
    ingest = [r for r in records if r["kind"] != "loss"]
    result = QualityResult(
        pipeline=cfg.name,
        batch=batch,
        kind=kind,
        gate=cfg.quality.gate,
        success=all(c.success for c in checks),
        checked_at=datetime.now(UTC).isoformat(timespec="seconds"),
        committed_at=committed_at.isoformat(timespec="seconds"),
        rows=data.num_rows,
        validated_rows=validated.num_rows,
        sampled=sampled,
        ledger={
            name: sum(r[name] for r in records)
            for name in ("messages", "rows", "quarantined", "gaps", "bytes", "late_rows")
        },
        lag_after=lag_after(ingest),
        checks=checks,
        partitions=_partitions(cfg, data),
        lateness=_lateness(data),
        docs=docs,
        losses=[
            {k: r[k] for k in ("topic", "partition", "start_offset", "end_offset", "note")}
            for r in records
            if r["kind"] == "loss"
        ],
    )
    if cfg.quality.gate == "fail" and not result.success:
        result.incomplete = sorted(result.partitions)
    store = ResultStore(cfg)
    store.save(result)
    from strata.quality_page import write_summary_page

    write_summary_page(cfg, store.recent(cfg.quality.history), ledger)
    return result


def _batch_rows(cfg: PipelineConfig, batch: int) -> tuple[pa.Table, list[str]]:
    """The batch's rows in the data table, and data files the table lists but lost."""
    missing: list[str] = []
    wanted = ds.field("_batch") == batch
    if cfg.table_format == "parquet":
        fs, root = filesystem(cfg.location("table"), cfg.storage_options)
        if fs.get_file_info(root).type == pafs.FileType.NotFound:
            return table_layout(cfg, "table")[0].empty_table(), missing
        dataset = ds.dataset(
            root,
            filesystem=fs,
            format="parquet",
            partitioning="hive",
            schema=table_layout(cfg, "table")[0],
            exclude_invalid_files=True,
        )
        return dataset.to_table(filter=wanted), missing
    table = open_table(cfg.location("table"), cfg.storage_options)
    if table is None:
        return table_layout(cfg, "table")[0].empty_table(), missing
    fs, root = filesystem(cfg.location("table"), cfg.storage_options)
    adds = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    present = []
    for add in adds:
        lo, hi = add.get("min._batch"), add.get("max._batch")
        if lo is not None and hi is not None and not lo <= batch <= hi:
            continue
        if fs.get_file_info(f"{root}/{add['path']}").type == pafs.FileType.NotFound:
            missing.append(add["path"])
        else:
            present.append(add)
    if missing:
        # Read what is there: a lost file must be reported, not stop the report.
        schema = pa.schema(table.schema())
        paths = [f"{root}/{a['path']}" for a in present]
        if not paths:
            return schema.empty_table(), missing
        parts = partition_columns(cfg.partitioning)
        pieces = []
        for a, path in zip(present, paths, strict=True):
            t = ds.dataset(path, filesystem=fs, format="parquet").to_table(filter=wanted)
            for c in parts:
                t = t.append_column(c, pa.array([a[f"partition.{c}"]] * t.num_rows, pa.string()))
            pieces.append(t.select([n for n in schema.names if n in t.column_names]))
        return pa.concat_tables(pieces, promote_options="default"), missing
    return table.to_pyarrow_dataset().to_table(filter=wanted), missing


def _neighbours(cfg: PipelineConfig, data: pa.Table) -> pa.Table:
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
    if cfg.table_format == "parquet":
        fs, root = filesystem(cfg.location("table"), cfg.storage_options)
        dataset = ds.dataset(root, filesystem=fs, format="parquet", partitioning="hive")
    else:
        table = open_table(cfg.location("table"), cfg.storage_options)
        assert table is not None  # the batch's rows came from it
        dataset = table.to_pyarrow_dataset()
    try:
        return dataset.to_table(columns=COORDINATES, filter=wanted)
    except (OSError, FileNotFoundError):
        # A lost data file is reported by reconciliation; check what can be read.
        return data.select(COORDINATES)


def reconcile_checks(
    cfg: PipelineConfig, batch: int, ledger: pa.Table, data: pa.Table, missing: list[str]
) -> list[Check]:
    """Offsets read = rows + quarantined + gaps; the tables hold what the ledger says;
    no batch overlaps another and no hole lies between them unless a loss explains it.
    """
    rows = [
        r
        for r in ledger.to_pylist()
        if r["batch"] == batch and r["kind"] in ("ingest", "backfill", "replay")
    ]
    checks = []
    bad = [
        f"partition {r['partition']} of `{r['topic']}`: offsets [{r['start_offset']}, "
        f"{r['end_offset']}) span {r['end_offset'] - r['start_offset']}, but rows {r['rows']} + "
        f"quarantined {r['quarantined']} + gaps {r['gaps']} = "
        f"{r['rows'] + r['quarantined'] + r['gaps']}"
        for r in rows
        if r["end_offset"] - r["start_offset"] != r["rows"] + r["quarantined"] + r["gaps"]
    ]
    checks.append(
        Check(
            "reconcile: offsets = rows + quarantined + gaps",
            not bad,
            None,
            "; ".join(bad),
            len(bad),
        )
    )
    checks.append(
        Check(
            "reconcile: data files present",
            not missing,
            None,
            ""
            if not missing
            else f"the table lists {len(missing)} data file(s) that are gone: "
            + ", ".join(missing[:5]),
            len(missing),
        )
    )
    plan = PlanStore(cfg).load(batch)
    from_raw = plan is not None and plan.source == "raw"
    expect = {"table": "rows", "quarantine": "quarantined"}
    if not from_raw:
        expect["raw"] = "messages"
    for name, column in expect.items():
        counted = data if name == "table" else _rows_of(cfg, name, batch)
        have = count_by_partition(counted)
        wrong = [
            f"partition {r['partition']} of `{r['topic']}`: "
            f"{have.get((r['topic'], r['partition']), 0)} rows, the ledger says {r[column]}"
            for r in rows
            if have.get((r["topic"], r["partition"]), 0) != r[column]
        ]
        label = {"table": "data table", "quarantine": "quarantine", "raw": "raw copy"}[name]
        checks.append(
            Check(
                f"reconcile: {label} rows = ledger", not wrong, None, "; ".join(wrong), len(wrong)
            )
        )
    overlaps, holes = ledger_continuity(ledger)
    checks.append(
        Check(
            "reconcile: no overlapping batches",
            not overlaps,
            None,
            "; ".join(overlaps),
            len(overlaps),
        )
    )
    checks.append(
        Check("reconcile: no unexplained holes", not holes, None, "; ".join(holes), len(holes))
    )
    return checks


def _rows_of(cfg: PipelineConfig, name: str, batch: int) -> pa.Table:
    wanted = ds.field("_batch") == batch
    if cfg.table_format == "parquet":
        fs, root = filesystem(cfg.location(name), cfg.storage_options)  # type: ignore[arg-type]
        if fs.get_file_info(root).type == pafs.FileType.NotFound:
            return pa.table(
                {"_topic": pa.array([], pa.string()), "_partition": pa.array([], pa.int32())}
            )
        return ds.dataset(root, filesystem=fs, format="parquet").to_table(
            columns=["_topic", "_partition"], filter=wanted
        )
    table = open_table(cfg.location(name), cfg.storage_options)  # type: ignore[arg-type]
    if table is None:
        return pa.table(
            {"_topic": pa.array([], pa.string()), "_partition": pa.array([], pa.int32())}
        )
    return table.to_pyarrow_dataset().to_table(columns=["_topic", "_partition"], filter=wanted)


def lag_after(rows: list[dict[str, Any]]) -> int | None:
    """Messages left behind the planned high watermarks by a batch's ingest rows."""
    known = [r for r in rows if r["high_watermark"] is not None]
    if not known:
        return None
    return sum(max(r["high_watermark"] - r["end_offset"], 0) for r in known)


def _partitions(cfg: PipelineConfig, data: pa.Table) -> dict[str, int]:
    columns = partition_columns(cfg.partitioning)
    if data.num_rows == 0:
        return {}
    grouped = data.group_by(columns).aggregate([(columns[0], "count")])
    keys = zip(*(grouped.column(c).to_pylist() for c in columns), strict=True)
    counts = grouped.column(f"{columns[0]}_count").to_pylist()
    return {
        "/".join(f"{c}={v}" for c, v in zip(columns, key, strict=True)): n
        for key, n in zip(keys, counts, strict=True)
    }


def _lateness(data: pa.Table) -> dict[str, int]:
    out = dict.fromkeys(LATENESS_LABELS, 0)
    if data.num_rows == 0:
        return out
    kafka_us = pc.cast(pc.cast(data.column("_kafka_ts"), pa.timestamp("us", tz="UTC")), pa.int64())
    event_us = pc.cast(data.column("_event_time"), pa.int64())
    late_s = pc.divide(pc.subtract(kafka_us, event_us), 1_000_000).to_pylist()
    for value in late_s:
        if value is None:
            continue
        for bound, label in LATENESS_BUCKETS:
            if value < bound:
                out[label] += 1
                break
        else:
            out["6-24h" if value < 86_400 else ">24h"] += 1
    return out


def _suite_expectations(cfg: PipelineConfig, committed_at: datetime) -> list[Any]:
    """The pipeline's expectations on the batch's rows: defaults, then the config's."""
    import great_expectations.expectations as gxe

    topic = load_topic_schema(cfg.schema_path, cfg.schema_text)
    schema = table_layout(cfg, "table")[0]
    quality = cfg.quality
    oldest = committed_at - timedelta(milliseconds=parse_duration_ms(quality.max_lateness))
    newest = committed_at + timedelta(milliseconds=parse_duration_ms(quality.max_skew))
    out: list[Any] = [gxe.ExpectTableColumnsToMatchSet(column_set=schema.names, exact_match=True)]
    for name in (*topic.required, *COORDINATES, "_event_time"):
        out.append(gxe.ExpectColumnValuesToNotBeNull(column=name))
    out.append(
        gxe.ExpectColumnValuesToBeBetween(column="_event_time", min_value=oldest, max_value=newest)
    )
    for column, rule in quality.ranges.items():
        out.append(
            gxe.ExpectColumnValuesToBeBetween(column=column, min_value=rule.min, max_value=rule.max)
        )
    for column, values in quality.value_sets.items():
        out.append(gxe.ExpectColumnValuesToBeInSet(column=column, value_set=values))
    for number, custom in enumerate(quality.expectations):
        class_name = "".join(part.capitalize() for part in custom.type.split("_"))
        kind = getattr(gxe, class_name, None)
        if kind is None:
            raise QualityError(
                f"quality.expectations[{number}].type {custom.type!r} is not an expectation of "
                "Great Expectations 1.x; see the expectation gallery for the names"
            )
        try:
            out.append(kind(**custom.kwargs))
        except Exception as exc:  # noqa: BLE001 - GX raises pydantic errors of its own
            raise QualityError(
                f"quality.expectations[{number}] ({custom.type}): its kwargs do not fit: "
                f"{str(exc).splitlines()[0]}"
            ) from None
    return out


def _expectations(
    cfg: PipelineConfig,
    batch: int,
    data: pa.Table,
    neighbours: pa.Table,
    committed_at: datetime,
    context_dir: Path,
) -> tuple[list[Check], str | None]:
    """Run the suite (and table-wide uniqueness) with Great Expectations.

    Returns:
        The checks, and the Data Docs page of the batch's rows, relative to the docs
        site built under `context_dir`.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import great_expectations as gx
        import great_expectations.expectations as gxe
    logging.getLogger("great_expectations").setLevel(logging.ERROR)

    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
    )

    # In memory, with no docs site of its own (GX's default one is a stray temp dir).
    context = gx.get_context(
        mode="ephemeral",
        project_config=DataContextConfig(
            store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False)
        ),
    )
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    context.add_data_docs_site(
        "strata",
        {
            "class_name": "SiteBuilder",
            "store_backend": {
                "class_name": "TupleFilesystemStoreBackend",
                "base_directory": str(context_dir / "docs"),
            },
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        },
    )
    source = context.data_sources.add_pandas("strata")
    rows_def = source.add_dataframe_asset("rows").add_batch_definition_whole_dataframe("batch")
    coords_def = source.add_dataframe_asset("table").add_batch_definition_whole_dataframe("batch")
    suite = context.suites.add(gx.ExpectationSuite(f"{cfg.name}"))
    for expectation in _suite_expectations(cfg, committed_at):
        suite.add_expectation(expectation)
    unique = context.suites.add(gx.ExpectationSuite(f"{cfg.name}_table"))
    unique.add_expectation(gxe.ExpectCompoundColumnsToBeUnique(column_list=COORDINATES))
    run_id = gx.RunIdentifier(run_name=f"batch-{batch:010d}")
    checks: list[Check] = []
    page = None
    # What the docs are built from: each suite's page and each validation result.
    documented: list[Any] = [ExpectationSuiteIdentifier(name=s.name) for s in (suite, unique)]
    for suite_, definition, frame in ((suite, rows_def, data), (unique, coords_def, neighbours)):
        validation = context.validation_definitions.add(
            gx.ValidationDefinition(data=definition, suite=suite_, name=f"{suite_.name}-{batch}")
        )
        # No UpdateDataDocsAction: it would render the stored result as it is, message
        # text included; the docs are built below from an escaped copy.
        checkpoint = context.checkpoints.add(
            gx.Checkpoint(
                name=f"{suite_.name}-{batch}",
                validation_definitions=[validation],
                result_format={"result_format": "SUMMARY"},
            )
        )
        outcome = checkpoint.run(batch_parameters={"dataframe": frame.to_pandas()}, run_id=run_id)
        for key, result in outcome.run_results.items():
            context.validation_results_store.set(key, _inert_for_docs(result))
            documented.append(key)
            if page is None:
                page = "validations/" + "/".join(key.to_tuple()) + ".html"
            for r in result.results:
                config = r.expectation_config
                assert config is not None  # every result of a suite run names its expectation
                kwargs = config.kwargs
                column = kwargs.get("column") or (
                    ",".join(kwargs["column_list"]) if "column_list" in kwargs else None
                )
                detail = ""
                unexpected = int(r.result.get("unexpected_count") or 0)
                if r.exception_info.get("raised_exception"):
                    detail = f"could not run: {r.exception_info.get('exception_message')}"
                elif not r.success:
                    sample = r.result.get("partial_unexpected_list") or r.result.get(
                        "observed_value"
                    )
                    detail = f"{unexpected:,} unexpected; e.g. {_short(sample)}"
                checks.append(Check(config.type, bool(r.success), column, detail, unexpected))
    context.build_data_docs(site_names=["strata"], resource_identifiers=documented)
    return checks, page


def _inert_for_docs(result: ExpectationSuiteValidationResult) -> ExpectationSuiteValidationResult:
    """A copy of a suite's validation result that Data Docs can render safely.

    GX 1.x puts unexpected values, observed values (and the tables some expectations
    draw from them) and exception tracebacks into its pages without escaping them; its
    Jinja templates are `.j2` files, which its `select_autoescape(["html", "xml"])`
    leaves unescaped. Those values come from the messages, so they are escaped here,
    once. Exception messages are left alone: GX passes them as sentence parameters,
    which it escapes itself.

    Args:
        result: A suite's validation result; it is left unchanged.

    Returns:
        The copy, for the validation results store that the docs are built from.
    """
    from great_expectations.util import convert_to_json_serializable

    inert = copy.deepcopy(result)
    for one in inert.results:
        # The store keeps results as JSON; converting first makes bytes, dates and
        # numpy values the strings and numbers the renderers will see.
        one.result = _escaped(convert_to_json_serializable(one.result))
        info = one.exception_info
        # Either one exception, or one per metric that raised (keyed by metric id).
        for raised in [info] if "exception_traceback" in info else list(info.values()):
            if isinstance(raised, dict) and raised.get("exception_traceback"):
                raised["exception_traceback"] = html.escape(str(raised["exception_traceback"]))
    return inert


def _escaped(value: Any) -> Any:  # noqa: ANN401 - any JSON value
    """`value` with every string in it (keys too) HTML-escaped; numbers are kept."""
    if isinstance(value, str):
        return html.escape(value, quote=True)
    if isinstance(value, dict):
        return {_escaped(k): _escaped(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_escaped(v) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return html.escape(str(value), quote=True)


def _short(sample: Any) -> str:  # noqa: ANN401 - GX's result values are untyped
    text = json.dumps(sample, default=str)
    return text if len(text) < 200 else text[:197] + "..."


def _publish_docs(cfg: PipelineConfig, context_dir: Path, page: str | None) -> str | None:
    """Copy the Data Docs site built for this batch under the quality location."""
    built = context_dir / "docs"
    if not built.is_dir():
        return None
    fs, root = filesystem(cfg.location("quality"), cfg.storage_options)
    for path in sorted(built.rglob("*")):
        if path.is_file():
            rel = path.relative_to(built).as_posix()
            write_bytes_atomically(fs, f"{root}/docs/{rel}", path.read_bytes())
    return None if page is None else f"docs/{page}"


class ResultStore:
    """One JSON result per batch under `<quality>/results/`."""

    def __init__(self, cfg: PipelineConfig) -> None:
        """Open the store of a pipeline."""
        self.fs, self.root = filesystem(cfg.location("quality"), cfg.storage_options)

    def _path(self, batch: int) -> str:
        return f"{self.root}/results/batch-{batch:010d}.json"

    def save(self, result: QualityResult) -> None:
        """Write (or replace) a batch's result."""
        body = json.dumps(asdict(result), indent=1, sort_keys=True, default=str)
        write_bytes_atomically(self.fs, self._path(result.batch), body.encode())

    def load(self, batch: int) -> dict[str, Any] | None:
        """A batch's result, if checked."""
        data = read_bytes(self.fs, self._path(batch))
        return None if data is None else json.loads(data)

    def recent(self, limit: int) -> list[dict[str, Any]]:
        """The newest `limit` results, oldest first."""
        directory = f"{self.root}/results"
        if self.fs.get_file_info(directory).type == pafs.FileType.NotFound:
            return []
        names = sorted(
            info.base_name
            for info in self.fs.get_file_info(pafs.FileSelector(directory))
            if re.match(r"^batch-\d{10}\.json$", info.base_name)
        )[-limit:]
        out = []
        for name in names:
            data = read_bytes(self.fs, f"{directory}/{name}")
            if data is not None:
                out.append(json.loads(data))
        return out

    def incomplete(self) -> dict[str, list[int]]:
        """Event-time partitions marked incomplete by any batch, with those batches."""
        return incomplete_marks(self.recent(10**9))


def incomplete_marks(results: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Event-time partitions the given results marked incomplete, with their batches."""
    marks: dict[str, list[int]] = {}
    for result in results:
        for partition in result.get("incomplete", []):
            marks.setdefault(partition, []).append(result["batch"])
    return marks


def render_quality(result: QualityResult) -> str:
    """The result as text for the terminal and the Airflow log."""
    verdict = "passed" if result.success else "FAILED"
    sample = f" (a sample of {result.validated_rows:,})" if result.sampled else ""
    lines = [
        f"pipeline {result.pipeline}: batch {result.batch} ({result.kind}) quality {verdict}: "
        f"{len(result.checks) - len(result.failed)} of {len(result.checks)} checks passed on "
        f"{result.rows:,} rows{sample}; gate {result.gate}"
    ]
    for check in result.failed:
        column = f" on {check.column}" if check.column else ""
        lines.append(f"  FAILED {check.name}{column}: {check.detail}")
    if result.incomplete:
        lines.append("partitions marked incomplete: " + ", ".join(result.incomplete))
    for lost in result.losses:
        lines.append(
            f"  LOSS: offsets [{lost['start_offset']}, {lost['end_offset']}) of partition "
            f"{lost['partition']} of `{lost['topic']}` were deleted by retention before they "
            f"were read; {lost['note']}"
        )
    if result.docs:
        lines.append(f"data docs: {result.docs}")
    return "\n".join(lines)
