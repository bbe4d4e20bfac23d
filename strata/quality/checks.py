"""What a batch's quality is made of, computed from figures already read: no I/O.

The reconciliation checks restate, after the fact, the rules `strata.batch.reconcile` holds
a batch to before its commit, over the ledger's rows and the rows counted in each
table. The rest summarizes a batch's rows (per event-time partition, per late-arrival
bucket) and renders a result for the terminal. Everything here takes plain values
and Arrow tables, so it is tested with small inline data.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from strata.batch.reconcile import EXPECTED, count_problems, ledger_continuity, span_problems
from strata.store.ledger import READ_KINDS
from strata.store.parquet import partition_path

if TYPE_CHECKING:
    from strata.config import TableName
    from strata.store.tables import Counts

COORDINATES = ["_topic", "_partition", "_offset"]
"""The columns that name a message: unique across the whole data table."""

# Upper bounds of the late-arrival buckets (Kafka time minus event time), in seconds.
LATENESS_BUCKETS = [(60, "<1m"), (600, "1-10m"), (3600, "10m-1h"), (6 * 3600, "1-6h")]
LATENESS_LABELS = [label for _, label in LATENESS_BUCKETS] + ["6-24h", ">24h"]

TABLE_LABELS: dict[TableName, str] = {
    "table": "data table",
    "quarantine": "quarantine",
    "raw": "raw copy",
}
"""How each table is named in its check: `reconcile: <label> rows = ledger`."""


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
        docs: The batch's Data Docs page, relative to the quality location (what the
            summary page links to).
        docs_location: The same page as a user opens it: an absolute local path, or
            its object-store URI (`s3://...`).
        incomplete: Partitions marked incomplete because the gate failed.
        losses: Ranges this batch recorded as deleted by retention before read.
        check: This check's id, in the marks it writes too: marks a check did not get
            to settle are decided by its result (`strata.quality.store`).
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
    docs_location: str | None = None
    incomplete: list[str] = field(default_factory=list)
    losses: list[dict[str, Any]] = field(default_factory=list)
    check: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def failed(self) -> list[Check]:
        """The checks that failed."""
        return [c for c in self.checks if not c.success]


QUALITY_SCHEMA = pa.schema(
    [
        pa.field("pipeline", pa.string(), nullable=False),
        pa.field("batch", pa.int64(), nullable=False),
        pa.field("scope", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("gate", pa.string(), nullable=False),
        pa.field("checked_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("committed_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("success", pa.bool_(), nullable=False),
        pa.field("check_name", pa.string()),
        pa.field("check_column", pa.string()),
        pa.field("unexpected", pa.int64()),
        pa.field("detail", pa.string()),
        pa.field("event_partition", pa.string()),
        pa.field("dt", pa.string()),
        pa.field("hr", pa.string()),
        pa.field("rows", pa.int64()),
        pa.field("incomplete", pa.bool_()),
    ]
)
"""The quality table's rows: one per check of a batch (`scope` = `check`), one per
event-time partition it wrote (`scope` = `partition`). A partition row's `success` is
its batch's verdict; `incomplete` says whether the gate marked the partition."""


def quality_rows(result: QualityResult) -> pa.Table:
    """A batch's result as rows of the quality table (`QUALITY_SCHEMA`).

    Args:
        result: The batch's result.

    Returns:
        A row per check, in the result's order, then a row per event-time partition,
        in path order.
    """
    batch = {
        "pipeline": result.pipeline,
        "batch": result.batch,
        "kind": result.kind,
        "gate": result.gate,
        "checked_at": datetime.fromisoformat(result.checked_at),
        "committed_at": datetime.fromisoformat(result.committed_at),
    }
    rows: list[dict[str, Any]] = [
        {
            **batch,
            "scope": "check",
            "success": c.success,
            "check_name": c.name,
            "check_column": c.column,
            "unexpected": c.unexpected,
            "detail": c.detail or None,
        }
        for c in result.checks
    ]
    incomplete = set(result.incomplete)
    for path in sorted(result.partitions):
        values = {key: value for key, _, value in (p.partition("=") for p in path.split("/"))}
        rows.append(
            {
                **batch,
                "scope": "partition",
                "success": result.success,
                "event_partition": path,
                "dt": values.get("dt"),
                "hr": values.get("hr"),
                "rows": result.partitions[path],
                "incomplete": path in incomplete,
            }
        )
    return pa.Table.from_pylist(rows, schema=QUALITY_SCHEMA)


def _check(name: str, problems: list[str], unexpected: int | None = None) -> Check:
    """A check that passed if there are no problems, else names each one.

    Args:
        name: The check's name.
        problems: A sentence per problem found.
        unexpected: How many things failed it; by default, one per problem.
    """
    count = len(problems) if unexpected is None else unexpected
    return Check(name, not problems, None, "; ".join(problems), count)


def reconcile_checks(
    ledger: pa.Table, batch: int, counted: Mapping[TableName, Counts], missing: list[str]
) -> list[Check]:
    """A committed batch's offsets, tables and ledger still account for each other.

    Per partition read by the batch: offsets = messages + gaps and messages = rows +
    quarantined (`strata.batch.reconcile.span_problems`), and each table holds as many of
    the batch's rows as the ledger says (`strata.batch.reconcile.count_problems`). Over the
    whole ledger: no batch overlaps another, and no hole lies between them unless a
    loss or a seek explains it.

    Args:
        ledger: Every ledger row.
        batch: The batch checked.
        counted: The batch's rows per (topic, partition) in each table counted; a table
            left out is not checked (the raw copy of a batch read from the raw copy).
        missing: Data files the data table lists but that are gone.

    Returns:
        The reconciliation checks, passed or not, in a fixed order.
    """
    rows = [r for r in ledger.to_pylist() if r["batch"] == batch and r["kind"] in READ_KINDS]
    spans, bad_ranges = [], 0
    for r in rows:
        t, p, lo, hi = r["topic"], r["partition"], r["start_offset"], r["end_offset"]
        broken = span_problems(
            hi - lo, r["messages"], r["gaps"], r["rows"], r["quarantined"], r.get("skipped") or 0
        )
        spans += [f"partition {p} of `{t}` [{lo}, {hi}): {problem}" for problem in broken]
        bad_ranges += bool(broken)
    checks = [
        # A range can break both rules; `unexpected` counts ranges, as the ledger's rows.
        _check("reconcile: offsets = rows + quarantined + gaps", spans, bad_ranges),
        _check(
            "reconcile: data files present",
            [
                f"the table lists {len(missing)} data file(s) that are gone: "
                + ", ".join(missing[:5])
            ]
            if missing
            else [],
            unexpected=len(missing),
        ),
    ]
    for name in EXPECTED:
        if name not in counted:
            continue
        expected: Counts = {}
        for r in rows:
            key = (r["topic"], r["partition"])
            expected[key] = expected.get(key, 0) + r[EXPECTED[name]]
        wrong = count_problems(expected, counted[name], "{have} rows, the ledger says {want}")
        checks.append(_check(f"reconcile: {TABLE_LABELS[name]} rows = ledger", wrong))
    overlaps, holes = ledger_continuity(ledger)
    checks.append(_check("reconcile: no overlapping batches", overlaps))
    checks.append(_check("reconcile: no unexplained holes", holes))
    return checks


def incomplete_marks(results: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Event-time partitions the given results marked incomplete, with their batches."""
    marks: dict[str, list[int]] = {}
    for result in results:
        for partition in result.get("incomplete", []):
            marks.setdefault(partition, []).append(result["batch"])
    return marks


def recent_batches(ledger: list[dict[str, Any]], history: int) -> list[int]:
    """The newest `history` batch numbers in the ledger rows, oldest first."""
    return sorted({r["batch"] for r in ledger})[-history:]


def spread_sample(data: pa.Table, limit: int) -> pa.Table:
    """`data` itself if it has at most `limit` rows, else `limit` rows evenly spread."""
    if data.num_rows <= limit:
        return data
    step = data.num_rows / limit
    return data.take([int(i * step) for i in range(limit)])


def partition_counts(data: pa.Table, columns: list[str]) -> dict[str, int]:
    """Rows per event-time partition, keyed by its path (`dt=.../hr=...`).

    Args:
        data: Rows holding the partition columns.
        columns: The partition columns, outermost first.
    """
    if data.num_rows == 0:
        return {}
    grouped = data.group_by(columns).aggregate([(columns[0], "count")])
    keys = zip(*(grouped.column(c).to_pylist() for c in columns), strict=True)
    counts = grouped.column(f"{columns[0]}_count").to_pylist()
    return {partition_path(columns, key): n for key, n in zip(keys, counts, strict=True)}


def lateness_bucket(seconds: float) -> str:
    """The late-arrival bucket of a row that reached Kafka `seconds` after its event."""
    for bound, label in LATENESS_BUCKETS:
        if seconds < bound:
            return label
    return "6-24h" if seconds < 86_400 else ">24h"


def lateness_counts(data: pa.Table) -> dict[str, int]:
    """Rows per late-arrival bucket (every bucket present), from `_kafka_ts` and `_event_time`.

    Rows without either time are left out.
    """
    out = dict.fromkeys(LATENESS_LABELS, 0)
    if data.num_rows == 0:
        return out
    kafka_us = pc.cast(pc.cast(data.column("_kafka_ts"), pa.timestamp("us", tz="UTC")), pa.int64())
    event_us = pc.cast(data.column("_event_time"), pa.int64())
    late_s = pc.divide(pc.subtract(kafka_us, event_us), 1_000_000).to_pylist()
    for value in late_s:
        if value is not None:
            out[lateness_bucket(value)] += 1
    return out


# The variable parts of a quarantine reason, in the order they are replaced: values
# quoted by `repr` (closed, or cut short with `...` by the decoder), moments, then
# numbers (with a duration's unit; a type's width, `(32 bits)`, names the rule). Field
# names, quoted in backticks, are kept apart beforehand: they name the rule too.
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|['\"].*?\.\.\.(?=\s|$)")
_MOMENT = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?(?:Z|[+-]\d{2}:\d{2})?"
)
_NUMBER = re.compile(
    r"(?<![\w+\-.])-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?:ms|[smhdw])?(?!\w|\.\d| bits)"
)
_FIELD = re.compile(r"(`[^`]*`)")


def reason_class(reason: str) -> str:
    """A quarantine reason with its variable parts replaced by placeholders.

    Reasons quote what they reject: a value (`'abc'`), a moment, a number, a schema id.
    Two messages broken the same way differ only there, so their reasons share a class;
    messages broken in different fields or by different rules do not.

    Args:
        reason: A reason as the decoder wrote it.

    Returns:
        The reason with quoted values as `<value>`, moments as `<time>` and numbers
        (with a duration's unit) as `<n>`; backtick-quoted field names are kept.
    """
    parts = _FIELD.split(reason)
    for i in range(0, len(parts), 2):
        text = _QUOTED.sub("<value>", parts[i])
        text = _MOMENT.sub("<time>", text)
        parts[i] = _NUMBER.sub("<n>", text)
    return "".join(parts)


def reason_counts(reasons: pa.Array | pa.ChunkedArray, top: int = 8) -> dict[str, int]:
    """Quarantined rows per reason class (`reason_class`), the `top` most common first."""
    classes = Counter(reason_class(r) for r in reasons.to_pylist() if r is not None)
    return dict(classes.most_common(top))


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
    if result.docs_location:
        lines.append(f"data docs: {result.docs_location}")
    return "\n".join(lines)
