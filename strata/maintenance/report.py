"""What a checkpoint or a vacuum did, in one shape for every table format.

A Delta table, an Iceberg table and a plain Parquet directory are kept small in
different ways (a log's tombstones, expired snapshots, partitions moved by markers), but
an operator asks the same of each: what was deleted, what was left and why, what to
know. So every table's figures are the same fields, zero where a format has nothing of
the kind, and the lines printed are the same on every format.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# How many of a table's files left a report names.
_NAMED = 10


@dataclass
class TableVacuum:
    """What vacuum did (in a dry run, would do) to one table.

    Attributes:
        removed_files: Files a commit removed (compaction, a backfill, a replay, a
            snapshot expired) or a plain Parquet partition was moved away from, deleted
            once `maintenance.vacuum_retention` had passed.
        never_committed: Files no commit holds or can ever hold (a killed attempt's, a
            compaction's that lost its lease, a directory no partition was moved to),
            deleted.
        metadata_files: Metadata no snapshot or log holds any more (Iceberg manifests
            and metadata files, plain Parquet markers), deleted.
        snapshots_expired: Iceberg snapshots older than the retention, expired.
        unknown_left: Files no commit holds that were left (relative to the table): they
            may still be committed (a batch in flight), or cannot be told to be the
            table's own.
        kept_for_metastore: Plain Parquet directories kept because the metastore still
            points a partition at them.
        skipped: Why the table was left alone, or empty.
        warnings: What the operator should know, each with its way out.
    """

    removed_files: int = 0
    never_committed: int = 0
    metadata_files: int = 0
    snapshots_expired: int = 0
    unknown_left: list[str] = field(default_factory=list)
    kept_for_metastore: list[str] = field(default_factory=list)
    skipped: str = ""
    warnings: list[str] = field(default_factory=list)


@dataclass
class VacuumReport:
    """What a vacuum run did, per table.

    Attributes:
        pipeline: The pipeline.
        retention_hours: How long removed files were kept (`maintenance.vacuum_retention`).
        dry_run: Whether nothing was deleted.
        tables: Per table (`table`, `raw`, `quarantine`, `ledger`), its figures.
        plans_deleted: Saved plans of committed batches deleted.
    """

    pipeline: str
    retention_hours: int
    dry_run: bool = False
    tables: dict[str, TableVacuum] = field(default_factory=dict)
    plans_deleted: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values."""
        return asdict(self)


@dataclass
class TableCheckpoint:
    """What a checkpoint did to one table's log.

    Attributes:
        version: The table's version checkpointed; None where it was skipped.
        log_files_before: Files in its log before.
        log_files_after: Files in its log after.
        log_cleaned: Whether commits older than the log retention were deleted.
        skipped: Why the table was left alone (it has no log, or no table yet), or empty.
    """

    version: int | None = None
    log_files_before: int = 0
    log_files_after: int = 0
    log_cleaned: bool = False
    skipped: str = ""


@dataclass
class CheckpointReport:
    """What a checkpoint run did, per table.

    Attributes:
        pipeline: The pipeline.
        tables: Per table (`table`, `raw`, `quarantine`, `ledger`), its figures.
    """

    pipeline: str
    tables: dict[str, TableCheckpoint] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values."""
        return asdict(self)


def render_vacuum(report: VacuumReport) -> str:
    """A vacuum report as lines an operator reads."""
    lines = [
        f"pipeline {report.pipeline}: vacuum{' (dry run)' if report.dry_run else ''} "
        f"(removed files kept {report.retention_hours}h)"
    ]
    verb = "would delete" if report.dry_run else "deleted"
    for which, t in report.tables.items():
        if t.skipped:
            lines.append(f"  {which}: skipped, {t.skipped}")
            continue
        lines.append(
            f"  {which}: {verb} {t.removed_files} removed files, {t.never_committed} never "
            f"committed, {t.metadata_files} metadata files; {t.snapshots_expired} snapshots "
            f"expired; {len(t.unknown_left)} files left"
        )
        for path in t.unknown_left[:_NAMED]:
            lines.append(f"    left (may still be committed, or not provably its own): {path}")
        if len(t.unknown_left) > _NAMED:
            lines.append(f"    … and {len(t.unknown_left) - _NAMED} more left")
        for directory in t.kept_for_metastore[:_NAMED]:
            lines.append(f"    kept (the metastore points a partition at it): {directory}")
        for warning in t.warnings:
            lines.append(f"    warning: {warning}")
    if report.plans_deleted:
        lines.append(f"  saved plans of old committed batches deleted: {report.plans_deleted}")
    return "\n".join(lines)


def render_checkpoint(report: CheckpointReport) -> str:
    """A checkpoint report as lines an operator reads."""
    lines = [f"pipeline {report.pipeline}: checkpoint"]
    for which, t in report.tables.items():
        if t.skipped:
            lines.append(f"  {which}: skipped, {t.skipped}")
            continue
        cleaned = "expired commits deleted" if t.log_cleaned else "log kept whole"
        lines.append(
            f"  {which}: checkpoint at version {t.version}; log files {t.log_files_before} -> "
            f"{t.log_files_after}, {cleaned}"
        )
    return "\n".join(lines)
