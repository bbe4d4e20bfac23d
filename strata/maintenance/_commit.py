"""A compacted Delta partition's commit: its merged files swapped for the new ones.

One transaction per partition, its removes and adds marked `dataChange=false`, so no
streaming reader takes them for new rows. Where the maintenance lock is a lease, the
commit carries its fencing token (`strata.store.delta`): once a vacuum took the lease
over and fenced the table, a compaction paused past its lease commits nothing.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import pyarrow as pa
from deltalake import CommitProperties
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction

from strata import faults
from strata.errors import MaintenanceError
from strata.log import get_logger
from strata.store.delta import (
    COMMIT_HOOKS,
    FENCE_INFO_KEY,
    add_actions,
    maintenance_transactions,
    open_table,
)
from strata.store.parquet import WrittenFile
from strata.store.places import TableRef

if TYPE_CHECKING:
    from strata.maintenance._bins import Picked
    from strata.store.lock import RunLock

logger = get_logger(__name__)

COMPACTION_KEY = "strata.compaction"
# A commit beaten by a schema change is retried this often on the new snapshot.
_COMMIT_TRIES = 5


def commit_partition(
    ref: TableRef,
    pipeline: str,
    picked: Picked,
    old: set[str],
    new: list[WrittenFile],
    lock: RunLock,
) -> str:
    """Swap a partition's merged files for the new ones in one transaction.

    Where the maintenance lock has a fencing token (a lease), the commit carries it: a
    vacuum that took the lease over fenced the table with a higher one, and then this
    commit fails, whether or not the fence is in the snapshot it is built on.

    Args:
        ref: The table's reference.
        pipeline: The pipeline (the Delta app id its fence is kept under).
        picked: The partition's plan.
        old: The files merged, to remove.
        new: The merged files written, to add.
        lock: The maintenance lock this compaction holds.

    Returns:
        `compacted`, or why not: a file to be removed is no longer in the table (only a
        run that broke the maintenance lock's rule could cause that; the partition is
        left as it is, its new files to vacuum).

    Raises:
        LeaseLost: If this compaction lost its lease, or a later maintenance run fenced
            the table.
    """
    uri = ref.uri
    info = {f["path"]: f for f in picked.files}
    for attempt in range(_COMMIT_TRIES):
        table = open_table(uri, ref.options)
        if table is None:
            raise MaintenanceError(f"{uri}: the table disappeared during compaction")
        active = set(pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist())
        if new and {f.path for f in new} <= active:
            # An attempt whose reply was lost landed after all.
            return "compacted"
        if not old <= active:
            return "left: files to merge were removed meanwhile"
        now = int(time.time() * 1000)
        values: dict[str, str | None] | None = dict(picked.values) or None
        actions: list[AddAction | RemoveAction] = [
            RemoveAction(path, False, now, info[path]["size_bytes"], values) for path in sorted(old)
        ]
        actions += add_actions(new, data_change=False)
        # A compaction that lost its lease must not commit: vacuum may run by now.
        lock.check()
        fence = lock.fence
        transactions = maintenance_transactions(table, pipeline, fence)
        faults.reached(faults.AFTER_COMPACT_CHECK)
        summary = {
            "partition": picked.name,
            "removed": len(old),
            "added": len(new),
        }
        recorded = {COMPACTION_KEY: json.dumps(summary)}
        if fence is not None:
            recorded[FENCE_INFO_KEY] = json.dumps(fence.record("compaction"))
        try:
            table.create_write_transaction(
                actions,
                mode="append",
                schema=table.schema(),
                partition_by=list(table.metadata().partition_columns) or None,
                commit_properties=CommitProperties(
                    custom_metadata=recorded, app_transactions=transactions
                ),
                post_commithook_properties=COMMIT_HOOKS,
            )
        except CommitFailedError as exc:
            # A schema change, or a vacuum's fence, landed after this snapshot: look
            # again on the new one, where a fence shows as a token above this run's.
            logger.info("%s: compaction commit retried (%s), attempt %s", uri, exc, attempt + 1)
            continue
        if fence is not None:
            fence.landed(table.table_uri)
        return "compacted"
    return f"left: {_COMMIT_TRIES} commits were beaten by concurrent changes"
