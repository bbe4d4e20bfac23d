"""Keeping a pipeline's tables small to open: log checkpoints, vacuum, health.

- **Checkpoints.** Every commit adds a file to a table's `_delta_log`, and opening a
  table replays the log from its last checkpoint. A checkpoint per maintenance run
  keeps that replay short, and log cleanup deletes the commits older than Delta's log
  retention (`delta.logRetentionDuration`, 30 days by default) that the checkpoint
  covers. Neither writes a commit, so neither can collide with a run's. Iceberg and
  plain Parquet tables have no log to checkpoint; their pipeline's ledger, a Delta
  table, has.
- **Vacuum.** Files a compaction, a backfill or a replay removed stay for readers that
  still use them until `maintenance.vacuum_retention` has passed (never less than its
  floor), then are deleted. Files the log never listed (a killed attempt's, a runner's
  that lost its lease) are deleted only when they provably can never be committed:
  their batch's number already stands in the table (a commit refuses a batch the table
  holds), or they are a compaction's. No live compaction is between writing and
  committing: vacuum holds the maintenance lock, and where that is a lease, it first
  fences each Delta table with its token, so a compaction paused past its lease can no
  longer commit (`strata.store.delta`). Any other file is left and listed. Nothing is
  deleted from a place that holds another table's files (`_ownership`). Iceberg tables
  are vacuumed by `_iceberg`; a plain Parquet data table's moved partitions by `_sweep`.
- **Health.** Per table: files, their mean size, how many are small, and the commits
  since the last checkpoint, for `strata status`.

Every table's figures have one shape, whatever its format (`strata.maintenance.report`).
"""

from __future__ import annotations

import json
import math
import re
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable

from strata.batch.plan import PlanStore
from strata.config import Location, MetastoreConfig
from strata.durations import parse_duration_ms
from strata.log import get_logger
from strata.maintenance import _iceberg
from strata.maintenance._fences import held_fence
from strata.maintenance._ownership import refuse_foreign
from strata.maintenance._sweep import sweep_moved
from strata.maintenance.compact import MAINTAINED
from strata.maintenance.report import CheckpointReport, TableCheckpoint, TableVacuum, VacuumReport
from strata.store import iceberg
from strata.store.delta import committed_batch, fence_maintenance, newest_commit, open_table
from strata.store.files import read_bytes
from strata.store.ledger import COLUMNS_KEY, STATE_KEY, TOPIC_IDS_KEY, ledger_state
from strata.store.locations import current_files
from strata.store.parquet import file_batch, is_compaction_file
from strata.store.places import Places

if TYPE_CHECKING:
    from strata.store.lock import RunLock

__all__ = [
    "checkpoint",
    "delta_tables",
    "never_committed",
    "sweep_moved",
    "table_health",
    "vacuum",
]

logger = get_logger(__name__)

# Delta's defaults of `delta.logRetentionDuration` and `delta.deletedFileRetentionDuration`.
_LOG_RETENTION = timedelta(days=30)
_TOMBSTONE_RETENTION = timedelta(days=7)
_INTERVAL = re.compile(r"^\s*interval\s+(\d+)\s+(second|minute|hour|day|week)s?\s*$", re.I)


def delta_tables(places: Places) -> list[tuple[Location, DeltaTable]]:
    """The pipeline's Delta tables that exist: the ledger always, the rest under Delta.

    Args:
        places: The pipeline's places.
    """
    found = []
    for which in MAINTAINED:
        if which != "ledger" and places.format != "delta":
            continue
        table = open_table(places.table(which).uri, places.options)
        if table is not None:
            found.append((which, table))
    return found


def log_since_checkpoint(places: Places, which: Location, table: DeltaTable) -> int:
    """Commits a reader replays on top of the last checkpoint (all of them without one).

    Args:
        places: The pipeline's places.
        which: Which of its tables.
        table: That table, opened.
    """
    fs, root = places.table(which).filesystem()
    last = read_bytes(fs, f"{root}/_delta_log/_last_checkpoint")
    version = table.version()
    if last is None:
        return version + 1
    return version - int(json.loads(last)["version"])


def _interval(table: DeltaTable, key: str, default: timedelta) -> timedelta | None:
    """A table property written as Delta writes durations (`interval 30 days`).

    Returns:
        The duration; `default` when the property is not set; None when it is set in a
        form not understood here, which callers take as the cautious answer.
    """
    text = table.metadata().configuration.get(key)
    if text is None:
        return default
    match = _INTERVAL.match(text)
    if match is None:
        return None
    return timedelta(**{f"{match.group(2).lower()}s": int(match.group(1))})


def checkpoint(places: Places) -> CheckpointReport:
    """Checkpoint every Delta table of the pipeline and clean up its expired log.

    Log cleanup deletes commits' records, and some are still needed:

    - a data, raw or quarantine table holding a batch the ledger does not (a batch
      left unfinished) keeps its log: finishing or dropping that batch reads the
      batch's commit;
    - the ledger keeps its log while the newest commit recording the data table's
      columns, the topics' ids or the ledger's state would expire: plans read them.

    Args:
        places: The pipeline's places.

    Returns:
        Per table: its version, the log files before and after, and whether the log
        was cleaned; a table without a log (Iceberg, plain Parquet), and one not made
        yet, as skipped, with why.
    """
    ledger_batch = committed_batch(places.ledger.uri, places.pipeline, places.options) or 0
    report = CheckpointReport(places.pipeline)
    found = dict(delta_tables(places))
    for which in MAINTAINED:
        table = found.get(which)
        if table is None:
            report.tables[which] = TableCheckpoint(skipped=_no_log(places, which))
            continue
        before = _log_files(places, which)
        table.create_checkpoint()
        if which == "ledger":
            cleaned = _cleanup_allowed(table)
        else:
            cleaned = (table.transaction_version(places.pipeline) or 0) <= ledger_batch
        if cleaned:
            table.cleanup_metadata()
        report.tables[which] = TableCheckpoint(
            table.version(), before, _log_files(places, which), cleaned
        )
    return report


def _no_log(places: Places, which: Location) -> str:
    """Why a table of the pipeline has no Delta log to checkpoint."""
    fmt = places.table(which).format
    if fmt == "iceberg":
        return "an Iceberg table has no log to checkpoint; vacuum expires its old snapshots"
    if fmt == "parquet":
        return "a plain Parquet table has no log to checkpoint"
    return "no table yet"


def _cleanup_allowed(ledger: DeltaTable) -> bool:
    retention = _interval(ledger, "delta.logRetentionDuration", _LOG_RETENTION)
    if retention is None:
        return False
    horizon = datetime.now(UTC) - retention + timedelta(days=1)
    for key in (COLUMNS_KEY, TOPIC_IDS_KEY, STATE_KEY):
        newest = newest_commit(ledger, partial(_records, key))
        if newest is not None:
            made = datetime.fromtimestamp(int(newest["timestamp"]) / 1000, UTC)
            if made <= horizon:
                return False
    return True


def _records(key: str, commit: dict[str, Any]) -> bool:
    return key in commit


def _log_files(places: Places, which: Location) -> int:
    fs, root = places.table(which).filesystem()
    selector = pafs.FileSelector(f"{root}/_delta_log", allow_not_found=True)
    return sum(1 for info in fs.get_file_info(selector) if info.type == pafs.FileType.File)


def retention_hours(retention: str) -> int:
    """`maintenance.vacuum_retention` in whole hours, rounded up (the floor is checked at load)."""
    return math.ceil(parse_duration_ms(retention) / 3_600_000)


def vacuum(
    places: Places,
    retention: str,
    metastore: MetastoreConfig | None = None,
    dry_run: bool = False,
) -> VacuumReport:
    """Delete removed files past the retention and files that can never be committed.

    Runs under the maintenance lock (no compaction in flight); ingest goes on beside it.
    Where the lock is a lease, its token is taken above every fence the tables hold,
    and each Delta and Iceberg table is first fenced with it, so that a compaction that
    lost its lease can no longer commit the files deleted here.

    Args:
        places: The pipeline's places.
        retention: `maintenance.vacuum_retention`.
        metastore: The metastore the tables are registered in, if any: a directory
            it still points a partition at is kept.
        dry_run: List what would be deleted; delete nothing.

    Returns:
        Per table, in one shape for every format: removed files deleted, never-committed
        files deleted, metadata deleted, snapshots expired, and files left.

    Raises:
        LeaseLost: If this vacuum lost its lease, or a later maintenance run fenced a
            table first.
        MaintenanceError: If a table's place holds another table's files; nothing was
            fenced or deleted.
    """
    from strata.store.lock import run_lock

    hours = retention_hours(retention)
    grace = timedelta(hours=hours)
    report = VacuumReport(places.pipeline, hours, dry_run)
    floor = partial(held_fence, places, MAINTAINED)
    # A dry run deletes nothing: it needs no lock, and never waits on a compaction.
    with nullcontext(None) if dry_run else run_lock(places, "maintenance", floor) as lock:
        opened = {which: _open(places, which) for which in MAINTAINED}
        # Before anything is fenced or deleted.
        refuse_foreign(places, opened)
        ledger_batch = committed_batch(places.ledger.uri, places.pipeline, places.options) or 0
        for which in MAINTAINED:
            ref = places.table(which)
            handle = opened[which]
            if ref.format == "delta":
                figures = _vacuum_delta(places, which, handle, hours, lock, dry_run)
            elif ref.format == "iceberg":
                figures = _iceberg.vacuum_table(
                    ref, handle, places.pipeline, grace, ledger_batch, lock, dry_run
                )
            elif which == "table":
                figures = sweep_moved(places, metastore, grace, lock)
            else:
                figures = TableVacuum(
                    skipped="unpartitioned plain Parquet: compaction leaves it as it is, and "
                    "no commit removes its files"
                )
            report.tables[which] = figures
        if not dry_run:
            # The saved plans no committed batch got to forget: those of a pipeline that
            # kept every plan, or whose deletion failed after a commit.
            last = ledger_state(places).last_batch
            report.plans_deleted = len(PlanStore(places).forget_older(last))
    return report


def _open(places: Places, which: Location) -> Any:  # noqa: ANN401 - a Delta or Iceberg table
    """One of the pipeline's tables, opened; None where there is none (or it is plain Parquet)."""
    ref = places.table(which)
    if ref.format == "delta":
        return open_table(ref.uri, ref.options)
    if ref.format == "iceberg":
        return iceberg.open_table(ref)
    return None


def _vacuum_delta(
    places: Places,
    which: Location,
    table: DeltaTable | None,
    hours: int,
    lock: RunLock | None,
    dry_run: bool,
) -> TableVacuum:
    """Fence a Delta table, then delete its removed files and its never-committed ones."""
    if table is None:
        return TableVacuum(skipped="no table yet")
    fence = None if lock is None else lock.fence
    if fence is not None:
        # Before anything is listed: a file listed after the fence is one no compaction
        # holding an older token can still commit.
        fence_maintenance(table, places.pipeline, fence, "vacuum")
    removed = table.vacuum(
        retention_hours=hours,
        dry_run=dry_run,
        enforce_retention_duration=False,
        full=False,
    )
    figures = TableVacuum(removed_files=len(removed))
    # The log forgets a removed file once `delta.deletedFileRetentionDuration` has
    # passed; past it, such a file looks never committed. Below the retention asked
    # for, it must not be swept as one.
    kept = _interval(table, "delta.deletedFileRetentionDuration", _TOMBSTONE_RETENTION)
    if kept is None or timedelta(hours=hours) > kept:
        figures.warnings.append(
            "files no commit lists were not swept: vacuum_retention is longer than the "
            f"table's delta.deletedFileRetentionDuration ({kept or 'not understood'}), past "
            "which the log no longer tells a removed file from one never committed"
        )
        return figures
    orphans, figures.unknown_left = never_committed(places, which)
    figures.never_committed = len(orphans)
    if lock is not None:
        fs, root = places.table(which).filesystem()
        for path in orphans:
            # A vacuum that lost its lease must stop: a compaction may hold it now,
            # with files written and not yet committed.
            lock.check()
            fs.delete_file(f"{root}/{path}")
    return figures


def never_committed(places: Places, which: Location) -> tuple[list[str], list[str]]:
    """Files in a table's folder its log does not list, split by whether that is final.

    The table's batch number is read before the folder is listed against the log, so a
    file committed meanwhile has a number above it and is never taken for an orphan.

    Args:
        places: The pipeline's places.
        which: Which of its tables.

    Returns:
        (paths that can never be committed, other paths the log does not list), relative
        to the table root.
    """
    table = open_table(places.table(which).uri, places.options)
    if table is None:
        return [], []
    stands = table.transaction_version(places.pipeline) or 0
    # Full mode at zero hours lists every file the log does not hold, and removed ones;
    # the plain mode lists the removed ones alone.
    untracked = set(table.vacuum(0, dry_run=True, enforce_retention_duration=False, full=True))
    untracked -= set(table.vacuum(0, dry_run=True, enforce_retention_duration=False))
    final, unknown = [], []
    for path in sorted(untracked):
        batch = file_batch(path)
        if (batch is not None and batch <= stands) or is_compaction_file(path):
            final.append(path)
        else:
            unknown.append(path)
    return final, unknown


def table_health(places: Places, small: int) -> dict[str, dict[str, Any]]:
    """Per table: files, mean file size, small files, and commits since the checkpoint.

    Args:
        places: The pipeline's places.
        small: Files under this many bytes count as small (`compact.small_bytes`).
    """
    out: dict[str, dict[str, Any]] = {}
    delta = dict(delta_tables(places))
    for which in MAINTAINED:
        if which in delta:
            table = delta[which]
            sizes = pa.table(table.get_add_actions(flatten=True)).column("size_bytes").to_pylist()
            log: int | None = log_since_checkpoint(places, which, table)
        elif which != "ledger" and places.format == "parquet":
            sizes = _parquet_sizes(places, which)
            log = None
        elif which != "ledger" and places.format == "iceberg":
            found = iceberg.open_table(places.table(which))
            if found is None:
                continue
            sizes, log = _iceberg.data_sizes(found), None
        else:
            continue
        out[which] = {
            "files": len(sizes),
            "mean_file_mb": round(sum(sizes) / len(sizes) / 1e6, 2) if sizes else 0.0,
            "small_files": sum(1 for s in sizes if s < small),
            "log_since_checkpoint": log,
        }
    return out


def _parquet_sizes(places: Places, which: Location) -> list[int]:
    fs, root = places.table(which).filesystem()
    return [f.size for f in current_files(fs, root) if f.path.endswith(".parquet")]
