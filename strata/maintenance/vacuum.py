"""Keeping a pipeline's tables small to open: log checkpoints, vacuum, health.

- **Checkpoints.** Every commit adds a file to a table's `_delta_log`, and opening a
  table replays the log from its last checkpoint. A checkpoint per maintenance run
  keeps that replay short, and log cleanup deletes the commits older than Delta's log
  retention (`delta.logRetentionDuration`, 30 days by default) that the checkpoint
  covers. Neither writes a commit, so neither can collide with a run's.
- **Vacuum.** Files a compaction, a backfill or a replay removed stay for readers that
  still use them until `maintenance.vacuum_retention` has passed (never less than its
  floor), then are deleted. Files the log never listed (a killed attempt's, a runner's
  that lost its lease) are deleted only when they provably can never be committed:
  their batch's number already stands in the table (a commit refuses a batch the table
  holds), or they are a compaction's. No live compaction is between writing and
  committing: vacuum holds the maintenance lock, and where that is a lease, it first
  fences each Delta table with its token, so a compaction paused past its lease can no
  longer commit (`strata.store.delta`). Any other file is left and counted.
  A plain Parquet partition that compaction moved keeps its old directory for the
  same retention, counted from when the marker that moved it was written, and for as
  long as the metastore still points the partition at it; a new directory no marker
  names is voided, then deleted at once (`sweep_moved`).
- **Health.** Per table: files, their mean size, how many are small, and the commits
  since the last checkpoint, for `strata status`.
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
from strata.errors import MetastoreError
from strata.log import get_logger
from strata.maintenance import _iceberg
from strata.maintenance.compact import MAINTAINED
from strata.store import iceberg
from strata.store.delta import committed_batch, fence_maintenance, newest_commit, open_table
from strata.store.files import read_bytes
from strata.store.ledger import COLUMNS_KEY, STATE_KEY, TOPIC_IDS_KEY, ledger_state
from strata.store.locations import (
    GENERATION,
    TableFile,
    current_files,
    generation_dir,
    marker_uri,
    read_markers,
    visible_files,
    void,
)
from strata.store.parquet import file_batch, is_compaction_file
from strata.store.places import Places

if TYPE_CHECKING:
    from strata.store.lock import RunLock

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


def checkpoint(places: Places) -> dict[str, Any]:
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
        was cleaned.
    """
    ledger_batch = committed_batch(places.ledger.uri, places.pipeline, places.options) or 0
    out: dict[str, Any] = {"pipeline": places.pipeline, "tables": {}}
    for which, table in delta_tables(places):
        before = _log_files(places, which)
        table.create_checkpoint()
        if which == "ledger":
            cleaned = _cleanup_allowed(table)
        else:
            cleaned = (table.transaction_version(places.pipeline) or 0) <= ledger_batch
        if cleaned:
            table.cleanup_metadata()
        out["tables"][which] = {
            "version": table.version(),
            "log_files_before": before,
            "log_files_after": _log_files(places, which),
            "log_cleaned": cleaned,
        }
    return out


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
) -> dict[str, Any]:
    """Delete removed files past the retention and files that can never be committed.

    Runs under the maintenance lock (no compaction in flight); ingest goes on beside it.
    Where the lock is a lease, each Delta table is first fenced with its token, so that
    a compaction that lost its lease can no longer commit the files deleted here.

    Args:
        places: The pipeline's places.
        retention: `maintenance.vacuum_retention`.
        metastore: The metastore the tables are registered in, if any: a directory
            it still points a partition at is kept.
        dry_run: List what would be deleted; delete nothing.

    Returns:
        Per table: removed files deleted, never-committed files deleted, and unknown
        files left.

    Raises:
        LeaseLost: If this vacuum lost its lease, or a later maintenance run fenced a
            table first.
    """
    from strata.store.lock import run_lock

    hours = retention_hours(retention)
    out: dict[str, Any] = {"pipeline": places.pipeline, "retention_hours": hours, "tables": {}}
    # A dry run deletes nothing: it needs no lock, and never waits on a compaction.
    with nullcontext(None) if dry_run else run_lock(places, "maintenance") as lock:
        for which, table in delta_tables(places):
            if lock is not None and lock.token is not None:
                # Before anything is listed: a file listed after the fence is one no
                # compaction holding an older token can still commit.
                fence_maintenance(table, places.pipeline, lock.token, "vacuum")
            removed = table.vacuum(
                retention_hours=hours,
                dry_run=dry_run,
                enforce_retention_duration=False,
                full=False,
            )
            figures: dict[str, Any] = {"removed_files": len(removed)}
            # The log forgets a removed file once `delta.deletedFileRetentionDuration` has
            # passed; past it, such a file looks never committed. Below the retention
            # asked for, it must not be swept as one.
            kept = _interval(table, "delta.deletedFileRetentionDuration", _TOMBSTONE_RETENTION)
            if kept is None or timedelta(hours=hours) > kept:
                figures["sweep"] = (
                    "skipped: vacuum_retention is longer than the table's "
                    f"delta.deletedFileRetentionDuration ({kept or 'not understood'}), past "
                    "which the log no longer tells a removed file from one never committed"
                )
            else:
                orphans, unknown = never_committed(places, which)
                if lock is not None:
                    fs, root = places.table(which).filesystem()
                    for path in orphans:
                        # A vacuum that lost its lease must stop: a compaction may hold
                        # it now, with files written and not yet committed.
                        lock.check()
                        fs.delete_file(f"{root}/{path}")
                figures |= {"never_committed": len(orphans), "unknown_left": unknown}
            out["tables"][which] = figures
        if places.format == "parquet":
            out["tables"]["table"] = sweep_moved(places, metastore, timedelta(hours=hours), lock)
        if places.format == "iceberg":
            ledger_batch = committed_batch(places.ledger.uri, places.pipeline, places.options)
            for which in ("table", "raw", "quarantine"):
                out["tables"][which] = _iceberg.vacuum_table(
                    places.table(which),
                    places.pipeline,
                    timedelta(hours=hours),
                    ledger_batch or 0,
                    lock,
                    dry_run,
                )
        if not dry_run:
            # The saved plans no committed batch got to forget: those of a pipeline that
            # kept every plan, or whose deletion failed after a commit.
            last = ledger_state(places).last_batch
            out["plans_deleted"] = len(PlanStore(places).forget_older(last))
    return out


def sweep_moved(
    places: Places, metastore: MetastoreConfig | None, grace: timedelta, lock: RunLock | None
) -> dict[str, Any]:
    """Delete what compaction left in a plain Parquet data table, once it is safe.

    - A directory a partition was moved away from (see `strata.store.locations`) goes once
      `grace` has passed since the marker that moved it away was written (the move
      became visible then, whenever the compaction planned it): a query that listed it
      before has finished. Its older markers go with it.
    - A new directory no marker names is a compaction's that was stopped before the
      move, or one paused past its lease. It is voided first, so that no marker can
      move the partition there any more, then deleted at once; if a marker won that
      race, the move stands and the directory is kept.
    - With `metastore.uri` set, a directory the metastore still points a partition at
      (a registration that failed after a move) is kept, with a warning naming the
      way out: `strata register`, which points the partition at its directory in use.

    Args:
        places: The pipeline's places.
        metastore: The metastore the tables are registered in, if any.
        grace: How long a directory stays after its partition was moved away.
        lock: The maintenance lock; None for a dry run, which deletes nothing.

    Returns:
        Files of left directories deleted, and of never-used ones; the directories kept
        because the metastore points at them; warnings.
    """
    ref = places.table("table")
    fs, root = ref.filesystem()
    markers = read_markers(fs, root)
    horizon = datetime.now(UTC) - grace

    def moved_before_horizon(partition: str, stamp: str) -> bool:
        # A store that gives no write time never lets the grace period pass.
        when = markers.written.get((partition, stamp))
        return when is not None and when <= horizon

    left: dict[str, list[TableFile]] = {}
    unused: dict[str, list[TableFile]] = {}
    for f in visible_files(fs, root):
        moves = markers.stamps.get(f.partition, [])
        if f.directory == f.partition:
            if moves and moved_before_horizon(f.partition, moves[0]):
                left.setdefault(f.directory, []).append(f)
            continue
        stamp = _stamp_of(f.directory)
        if stamp not in moves:
            unused.setdefault(f.directory, []).append(f)
        elif stamp != moves[-1] and moved_before_horizon(
            f.partition, moves[moves.index(stamp) + 1]
        ):
            left.setdefault(f.directory, []).append(f)
    warnings: list[str] = []
    partition_of = {d: files[0].partition for d, files in [*left.items(), *unused.items()]}
    pointed = _pointed_at(places, metastore, partition_of)
    if pointed is None:
        # Without the metastore's word, no directory a partition left is known unread.
        pointed = set(left)
        if left:
            warnings.append(
                f"the metastore could not be read: {len(left)} directories partitions were "
                "moved away from are kept; the next vacuum that can read it deletes them"
            )
    elif pointed:
        shown = ", ".join(sorted(pointed)[:5])
        warnings.append(
            f"{len(pointed)} directories kept: the metastore still points partitions at "
            f"them ({shown}); run `strata register --pipeline {places.pipeline}` to point them at "
            "their directories in use, and the next vacuum deletes them"
        )
    never_used: list[str] = []
    moved_meanwhile: list[str] = []
    for directory, files in sorted(unused.items()):
        if directory in pointed:
            continue
        partition, stamp = files[0].partition, _stamp_of(directory)
        if lock is not None and stamp not in markers.void.get(partition, set()):
            lock.check()
            note = f"voided by vacuum at {datetime.now(UTC).isoformat(timespec='seconds')}"
            if not void(ref.uri, ref.options, partition, stamp, note):
                moved_meanwhile.append(directory)
                continue
        never_used += [f.path for f in files]
    if moved_meanwhile:
        warnings.append(
            f"{len(moved_meanwhile)} partitions were moved while vacuum ran, by a compaction "
            f"that had lost its lease ({', '.join(moved_meanwhile[:5])}); their directories "
            "are kept"
        )
    left_paths = [f.path for d, files in left.items() if d not in pointed for f in files]
    # A marker goes once the move after it is past the grace period and its directory
    # goes; void markers stay, for a paused compaction may wake at any time.
    old_markers = [
        marker_uri(root, part, stamp)
        for part, moves in markers.stamps.items()
        for stamp, following in zip(moves, moves[1:], strict=False)
        if moved_before_horizon(part, following) and generation_dir(part, stamp) not in pointed
    ]
    if lock is not None:
        for path in [*left_paths, *never_used]:
            # A vacuum that lost its lease must stop: a compaction may hold it now.
            lock.check()
            fs.delete_file(f"{root}/{path}")
        for path in old_markers:
            lock.check()
            fs.delete_file(path)
    for warning in warnings:
        logger.warning("pipeline %s: vacuum: %s", places.pipeline, warning)
    return {
        "left_by_compaction": len(left_paths),
        "never_moved_to": len(never_used),
        "kept_for_metastore": sorted(pointed),
        "grace_hours": round(grace.total_seconds() / 3600, 1),
        "warnings": warnings,
    }


def _stamp_of(directory: str) -> str:
    """The stamp of a generation directory (`…/_c<stamp>`)."""
    return directory.rsplit("/", 1)[-1][len(GENERATION) :]


def _pointed_at(
    places: Places, metastore: MetastoreConfig | None, partitions: dict[str, str]
) -> set[str] | None:
    """Which of these directories (each with its partition) the metastore points at.

    Args:
        places: The pipeline's places.
        metastore: The metastore the tables are registered in, if any.
        partitions: Each directory's partition.

    Returns:
        The directories a registered partition's location names; none without
        `metastore.uri`; None if the metastore could not be read.
    """
    from strata.catalog.register import registered_locations

    # An unpartitioned table's location is the table's own, which compaction never moves.
    names = sorted({part for part in partitions.values() if part})
    if metastore is None or not metastore.uri or not names:
        return set()
    try:
        registered = registered_locations(metastore, places.table("table").name, names)
    except MetastoreError as exc:
        logger.warning("pipeline %s: vacuum could not read the metastore: %s", places.pipeline, exc)
        return None
    named = set()
    for partition, where in registered.items():
        path = where.rstrip("/")
        head, _, last = path.rpartition("/")
        # Compared by the end of the path: the metastore may spell the scheme its own
        # way (`file:/…`, `s3a://…`).
        if path.endswith(f"/{partition}"):
            named.add(partition)
        elif last.startswith(GENERATION) and head.endswith(f"/{partition}"):
            named.add(f"{partition}/{last}")
    return named & set(partitions)


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


def render_maintenance(title: str, report: dict[str, Any]) -> str:
    """A checkpoint or vacuum report as lines an operator reads."""
    lines = [f"pipeline {report['pipeline']}: {title}"]
    if "retention_hours" in report:
        lines[0] += f" (removed files kept {report['retention_hours']}h)"
    if not report["tables"]:
        lines.append("  no Delta table yet")
    for which, figures in report["tables"].items():
        shown = {
            k: len(v) if isinstance(v, list) else v for k, v in figures.items() if k != "warnings"
        }
        lines.append(
            f"  {which}: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in shown.items())
        )
        for path in figures.get("unknown_left", [])[:10]:
            lines.append(f"    left (not provably uncommitted): {path}")
        for warning in figures.get("warnings", []):
            lines.append(f"    warning: {warning}")
    if report.get("plans_deleted"):
        lines.append(f"  saved plans of old committed batches deleted: {report['plans_deleted']}")
    return "\n".join(lines)
