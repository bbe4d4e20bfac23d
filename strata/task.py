"""One Spark task: read a split's ranges, decode, and write the three tables' files.

The task runs in a Python worker. Its rows never pass through the JVM: bytes go
from the consumer to Arrow to the Parquet writer, and only file metadata and counts
go back to the driver.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from strata.config import PipelineConfig
from strata.decode import DecodeRules, decode_chunk, partition_stats
from strata.kafka import client_conf
from strata.plan import OffsetRange
from strata.read import RangeProgress, read_ranges
from strata.schema import QUARANTINE_SCHEMA, RAW_SCHEMA, partition_columns
from strata.storage import filesystem
from strata.write import PartitionedWriter, WrittenFile


@dataclass(frozen=True)
class SplitJob:
    """What a task needs; pickled to the worker.

    Attributes:
        cfg: Pipeline configuration.
        batch: Batch number.
        task: Task number within the batch (part of every file name).
        ranges: Ranges this task reads.
        write: Tables whose files this task writes (`raw`, `quarantine`, `table`).
            On resume, tables whose commit already stands are not rewritten.
    """

    cfg: PipelineConfig
    batch: int
    task: int
    ranges: list[OffsetRange]
    write: frozenset[str]


@dataclass
class RangeResult:
    """What one range produced; the unit of reconciliation.

    Attributes:
        topic: Topic.
        partition: Partition.
        start: Range start.
        end: Range end.
        messages: Messages read.
        gaps: Offsets with no message.
        rows: Rows decoded into the table.
        quarantined: Messages sent to quarantine.
        bytes: Key and value bytes read.
        late_rows: Rows later than the lateness threshold.
        max_lateness_ms: Largest lateness seen.
        min_event_us: Earliest event time, or None.
        max_event_us: Latest event time, or None.
    """

    topic: str
    partition: int
    start: int
    end: int
    messages: int = 0
    gaps: int = 0
    rows: int = 0
    quarantined: int = 0
    bytes: int = 0
    late_rows: int = 0
    max_lateness_ms: int = 0
    min_event_us: int | None = None
    max_event_us: int | None = None


@dataclass
class SplitResult:
    """A task's outcome, sent back to the driver.

    Attributes:
        task: Task number.
        ranges: Per-range counts.
        files: Files written, per table.
        seconds: Wall time of the task.
    """

    task: int
    ranges: list[RangeResult]
    files: dict[str, list[WrittenFile]]
    seconds: float


def run_split(job: SplitJob) -> SplitResult:
    """Read, decode and write one split.

    Args:
        job: The split and its context.

    Returns:
        Counts per range and the files written.
    """
    began = time.monotonic()
    cfg = job.cfg
    rules = DecodeRules.from_config(cfg)
    limits = cfg.limits
    writers: dict[str, PartitionedWriter] = {}
    layouts = {
        "table": (rules.out_schema, partition_columns(cfg.partitioning)),
        "raw": (RAW_SCHEMA, []),
        "quarantine": (QUARANTINE_SCHEMA, []),
    }
    for name in job.write:
        fs, root = filesystem(cfg.location(name), cfg.storage_options)  # type: ignore[arg-type]
        schema, partition_by = layouts[name]
        writers[name] = PartitionedWriter(
            fs,
            root,
            schema,
            partition_by,
            job.batch,
            job.task,
            limits.target_file_mb << 20,
            limits.row_group_rows,
            limits.write_buffer_mb << 20,
        )

    results = {
        (r.topic, r.partition, r.start): RangeResult(r.topic, r.partition, r.start, r.end)
        for r in job.ranges
    }
    by_partition = {
        (r.topic, r.partition): results[(r.topic, r.partition, r.start)] for r in job.ranges
    }
    progress: dict[tuple[str, int, int], RangeProgress] = {}
    conf = client_conf(cfg, **{"group.id": cfg.group_id})
    for raw in read_ranges(conf, job.ranges, job.batch, progress, stall_s=limits.read_stall_s):
        if "raw" in writers:
            writers["raw"].write(raw)
        decoded = decode_chunk(raw, rules)
        if "table" in writers:
            writers["table"].write(decoded.rows)
        if "quarantine" in writers:
            writers["quarantine"].write(decoded.quarantine)
        for (topic, partition), stats in partition_stats(decoded.rows, rules.late_after_ms).items():
            res = by_partition[(topic, partition)]
            res.rows += stats["rows"]
            res.late_rows += stats["late_rows"]
            res.max_lateness_ms = max(res.max_lateness_ms, stats["max_lateness_ms"])
            res.min_event_us = _min(res.min_event_us, stats["min_event_us"])
            res.max_event_us = _max(res.max_event_us, stats["max_event_us"])
        if decoded.quarantine.num_rows:
            q = decoded.quarantine
            for topic, partition in zip(
                q.column("_topic").to_pylist(), q.column("_partition").to_pylist(), strict=True
            ):
                by_partition[(topic, partition)].quarantined += 1

    for key, p in progress.items():
        res = results[key]
        res.messages, res.bytes, res.gaps = p.messages, p.bytes, p.gaps
    files = {name: w.close() for name, w in writers.items()}
    return SplitResult(job.task, list(results.values()), files, time.monotonic() - began)


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def result_to_dict(result: RangeResult) -> dict[str, int | str | None]:
    """A range result as plain JSON-ready values."""
    return asdict(result)
