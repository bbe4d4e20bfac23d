"""What a run did: the outcome its summary, metrics and Airflow's XCom are made from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from strata.batch.plan import (
    PartitionState,
)
from strata.batch.task import RangeResult
from strata.stages import Stages
from strata.store.ledger import (
    LedgerCommit,
    LedgerState,
)

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from strata.catalog.completeness import BatchFacts


@dataclass(frozen=True)
class Seen:
    """What a run knows of its ledger at its end, for its summary's view.

    Attributes:
        rows: The ledger's `RUN_COLUMNS`, of its newest batches at least
            (`strata.store.ledger.recent_ledger`), the run's own batch included.
        state: Where reading goes on.
        states: The partitions' watermarks on the brokers, when nothing was committed
            since they were asked; None: the view asks (lag after a commit).
    """

    rows: pa.Table
    state: LedgerState
    states: list[PartitionState] | None


@dataclass
class RunOutcome:
    """What a run did, for the summary.

    Attributes:
        pipeline: Pipeline name.
        status: `committed`, `resumed` (an unfinished batch was completed) or `idle`.
        batch: Batch number, or None when idle.
        ranges: Per-partition results of the batch.
        files: Files committed per table.
        new_partitions: Partitions read for the first time.
        lag: Messages behind the high watermark per (topic, partition), after the run.
        seconds: Wall time of the whole run.
        spark_seconds: Time to start Spark (0 when no JVM was needed).
        read_seconds: Time the tasks took, Spark start-up excluded.
        warnings: Things the operator should know that did not fail the run.
        registered: What registering the tables in the metastore changed, if configured.
        register_error: Why registering failed; the batch stands, the run exits non-zero.
        stages: The driver's wall and CPU seconds per stage.
        task_stages: The tasks' wall and CPU seconds per stage, summed over tasks.
        late_after_completion: Rows the batch landed per event-time partition that was
            already complete before it (see `strata.catalog.completeness`).
        seen: What the run read of the ledger (and, idle, of the brokers) and what its
            ledger commit recorded, which its summary's view takes instead of reading
            them again.
        recorded: The batch's ledger commit as it landed (`LedgerCommit`), for what
            follows it to read instead of the ledger.
        data_table: The Delta data table after the batch's commit, as the run read it
            back (a `DeltaTable`), for the batch's completeness to read without opening.
        facts: What the batch's completeness read of the tables
            (`strata.catalog.completeness.BatchFacts`), for working it out again after
            the quality gate.
    """

    pipeline: str
    status: str
    batch: int | None = None
    ranges: list[RangeResult] = field(default_factory=list)
    files: dict[str, int] = field(default_factory=dict)
    new_partitions: list[tuple[str, int]] = field(default_factory=list)
    lag: dict[tuple[str, int], int] = field(default_factory=dict)
    seconds: float = 0.0
    spark_seconds: float = 0.0
    read_seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)
    registered: str | None = None
    register_error: str | None = None
    stages: Stages = field(default_factory=Stages)
    task_stages: Stages = field(default_factory=Stages)
    late_after_completion: dict[str, int] = field(default_factory=dict)
    seen: Seen | None = field(default=None, repr=False, compare=False)
    recorded: LedgerCommit | None = field(default=None, repr=False, compare=False)
    data_table: DeltaTable | None = field(default=None, repr=False, compare=False)
    facts: BatchFacts | None = field(default=None, repr=False, compare=False)
