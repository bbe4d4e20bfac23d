"""The named points where a test may break a process, and the seam it installs into.

Exactly once rests on the order of a batch's steps: files, then each table's commit,
then the ledger. The crash tests prove it by breaking real processes (the `strata`
command, Spark's Python workers, a cluster's executors) between those steps. The
product only names the points and calls `reached` at each; what happens there (a
SIGKILL, a freeze, a failure) is the test's to `install`. The read also hands each
chunk of consumed messages to `delivered`, so that a test can lose one on the way, as
a faulty consumer would, and see gap verification catch it.

With nothing installed, which is always the case outside the tests, a call returns at
once: no environment, file or setting is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import pyarrow as pa

# A task (`strata.batch`): its first messages read, the rest of its ranges still on the
# broker; then its files complete, before it returns them to the driver.
MID_READ: Final = "mid_read"
TASK_FILES_CLOSED: Final = "task_files_closed"

# The run (`strata.run`): every task's files written, nothing committed; each table
# just before and just after its commit of the batch; the ledger's commit, which ends it.
AFTER_FILES: Final = "after_files"
BEFORE_RAW_COMMIT: Final = "before_raw_commit"
AFTER_RAW_COMMIT: Final = "after_raw_commit"
BEFORE_QUARANTINE_COMMIT: Final = "before_quarantine_commit"
AFTER_QUARANTINE_COMMIT: Final = "after_quarantine_commit"
BEFORE_DATA_COMMIT: Final = "before_data_commit"
AFTER_DATA_COMMIT: Final = "after_data_commit"
AFTER_LEDGER: Final = "after_ledger"

# The same points, by the table committed (`raw`, `quarantine`, `table`).
BEFORE_COMMIT: Final[Mapping[str, str]] = MappingProxyType(
    {"raw": BEFORE_RAW_COMMIT, "quarantine": BEFORE_QUARANTINE_COMMIT, "table": BEFORE_DATA_COMMIT}
)
AFTER_COMMIT: Final[Mapping[str, str]] = MappingProxyType(
    {"raw": AFTER_RAW_COMMIT, "quarantine": AFTER_QUARANTINE_COMMIT, "table": AFTER_DATA_COMMIT}
)

# An Iceberg commit (`strata.store.iceberg`): inside the metastore's table lock, the new
# metadata file written, the table's entry not yet pointed at it.
ICEBERG_METADATA_WRITTEN: Final = "iceberg_metadata_written"

# A batch's quality check (`strata.quality.store`): the partitions a failed gate marks
# written, the result not yet; the result written, the marks not yet settled.
QUALITY_MARKS_WRITTEN: Final = "quality_marks_written"
QUALITY_RESULT_WRITTEN: Final = "quality_result_written"

# A compaction (`strata.maintenance.compact`): merged files written, none committed; a
# partition's commit (Delta) or move (plain Parquet); its last lease check before it acts.
AFTER_COMPACT_FILES: Final = "after_compact_files"
AFTER_COMPACT_COMMIT: Final = "after_compact_commit"
AFTER_COMPACT_MOVE: Final = "after_compact_move"
AFTER_COMPACT_CHECK: Final = "after_compact_check"

POINTS: Final = frozenset(
    {
        MID_READ,
        TASK_FILES_CLOSED,
        AFTER_FILES,
        *BEFORE_COMMIT.values(),
        *AFTER_COMMIT.values(),
        AFTER_LEDGER,
        ICEBERG_METADATA_WRITTEN,
        QUALITY_MARKS_WRITTEN,
        QUALITY_RESULT_WRITTEN,
        AFTER_COMPACT_FILES,
        AFTER_COMPACT_COMMIT,
        AFTER_COMPACT_MOVE,
        AFTER_COMPACT_CHECK,
    }
)


class Handler:
    """What a test does at the seams. This one does nothing; a test overrides what it needs."""

    def reached(self, point: str) -> None:
        """Act when the process reaches a named point (one of `POINTS`).

        Args:
            point: The point reached.
        """

    def delivered(self, messages: pa.Table) -> pa.Array | pa.ChunkedArray | None:
        """Choose which of a chunk of consumed messages the read goes on with.

        Args:
            messages: The chunk, in the raw table's schema (`_topic`, `_partition`,
                `_offset`, ...).

        Returns:
            A boolean mask of the messages to keep, or None to keep them all.
        """
        return None


_installed: Handler | None = None


def install(handler: Handler | None) -> Handler | None:
    """Install the handler of this process's seams, replacing any; None removes it.

    Args:
        handler: What happens at the points and to the messages read.

    Returns:
        The handler installed before, for a test to put back.
    """
    global _installed
    previous, _installed = _installed, handler
    return previous


def reached(point: str) -> None:
    """Say that the process is at a named point, where an installed handler may act.

    Args:
        point: One of `POINTS`.
    """
    if _installed is not None:
        _installed.reached(point)


def delivered(messages: pa.Table) -> pa.Array | pa.ChunkedArray | None:
    """Which of a chunk of consumed messages the read goes on with.

    Args:
        messages: The chunk, in the raw table's schema.

    Returns:
        A boolean mask of the messages to keep, or None (nothing installed, or the
        handler keeps them all).
    """
    if _installed is None:
        return None
    return _installed.delivered(messages)
