"""One Spark task: read a split's ranges, decode, and write the three tables' files.

`execute` runs a batch's tasks on the session. A task runs in a Python worker. Its
rows never pass through the JVM: bytes go from the consumer to Arrow to the Parquet
writer, and only file metadata and counts go back to the driver.
"""

from __future__ import annotations

import ctypes
import heapq
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from strata import faults
from strata.batch.decode import Decoded, DecodeRules, decode_chunk, partition_stats
from strata.batch.kafka import client_conf
from strata.batch.read import RangeProgress, RawChunk, read_ranges, read_raw_copy
from strata.batch.write import PartitionedWriter, split_by
from strata.config import Decoding, KafkaConfig, LimitsConfig, TableName
from strata.log import configure as configure_logging
from strata.schema.avro import partition_columns, table_layout
from strata.stages import BACKGROUND, Stages
from strata.store.files import delta_options
from strata.store.locations import current_locations
from strata.store.parquet import WrittenFile
from strata.store.places import Places
from strata.store.ranges import OffsetRange

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class TaskSpec:
    """What every task of a pipeline's batches needs; built once by the conductor.

    Attributes:
        places: Where the tables are written.
        decoding: How messages are decoded, the schema read with included.
        kafka: How to reach the brokers.
        group_id: The consumer group the task's consumer names (it commits nothing).
        limits: The bounds on reading and writing.
    """

    places: Places
    decoding: Decoding
    kafka: KafkaConfig
    group_id: str
    limits: LimitsConfig


@dataclass(frozen=True)
class SplitJob:
    """What a task needs; pickled to the worker.

    Attributes:
        spec: What every task of the pipeline's batches needs.
        batch: Batch number.
        task: Task number within the batch (part of every file name).
        ranges: Ranges this task reads.
        write: Tables whose files this task writes (`raw`, `quarantine`, `table`).
            On resume, tables whose commit already stands are not rewritten.
        source: `kafka`, or `raw` to read the raw copy (a backfill of offsets
            Kafka no longer holds).
        run_id: The run's id, part of every file name (with the task's attempt
            number), so no two runs or attempts ever write the same file.
        raw_batch: With `raw`, read only the raw rows this batch wrote (a batch
            resumed from its own committed raw copy); None reads every batch's.
        raw_files: With `raw`, for a raw copy that is not Delta (Iceberg), the files
            of its current snapshot to read, relative to its root: the driver, which
            reaches the catalog, lists them; the tasks read no catalog.
    """

    spec: TaskSpec
    batch: int
    task: int
    ranges: list[OffsetRange]
    write: frozenset[TableName]
    source: str = "kafka"
    run_id: str = ""
    raw_batch: int | None = None
    raw_files: tuple[str, ...] | None = None


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
        offset_sum: Sum of the distinct offsets read: a checksum of which offsets
            were kept, to compare with the files' `offsets`.
        redelivered: Messages delivered again at or below an offset already kept,
            and dropped.
        gap_runs: Runs of consecutive offsets that held no message.
        gap_runs_verified: Of those, the runs the broker confirmed hold no message
            (at most `strata.batch.read.GAP_RUNS_VERIFIED` per range; 0 when read from the
            raw copy, which has no broker).
        skipped: Tombstones left out of the data and quarantine tables and counted
            (`on_tombstone: skip`); the raw copy keeps them.
        skipped_offset_sum: Sum of their offsets, for the files' offset check.
        refused: Tombstones met under `on_tombstone: fail`: the batch stops before
            anything is committed.
        first_refused: The lowest offset of those, for the stop's message.
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
    offset_sum: int = 0
    redelivered: int = 0
    gap_runs: int = 0
    gap_runs_verified: int = 0
    skipped: int = 0
    skipped_offset_sum: int = 0
    refused: int = 0
    first_refused: int | None = None


@dataclass
class SplitResult:
    """A task's outcome, sent back to the driver.

    Attributes:
        task: Task number.
        ranges: Per-range counts.
        files: Files written, per table.
        seconds: Wall time of the task.
        stages: Wall and CPU seconds per stage of the task (see `strata.stages`).
    """

    task: int
    ranges: list[RangeResult]
    files: dict[TableName, list[WrittenFile]]
    seconds: float
    stages: dict[str, dict[str, float]] = field(default_factory=dict)


def task_attempt() -> int:
    """The running task attempt's id, unique within the Spark application; 0 outside one.

    Spark's per-task attempt number starts again at 0 when a whole stage is retried (a
    lost shuffle reducer's stage), so two attempts could share it; the attempt id
    cannot.
    """
    from pyspark import TaskContext

    context = TaskContext.get()
    return 0 if context is None else int(context.taskAttemptId())


def _writer(
    spec: TaskSpec, name: TableName, batch: int, tag: str, run_id: str
) -> PartitionedWriter:
    """A writer for one table's files of one task attempt."""
    schema, partition_by = table_layout(spec.decoding.schemas, name)
    fs, root = spec.places.table(name).filesystem()
    limits = spec.limits
    # A compacted plain Parquet partition takes late rows in its directory in use; no
    # compaction moves one while a run holds the run lock, so one look per task is enough.
    current = current_locations(fs, root) if spec.places.format == "parquet" else {}
    return PartitionedWriter(
        fs,
        root,
        schema,
        partition_by,
        batch,
        tag,
        limits.target_file_mb << 20,
        limits.row_group_rows,
        limits.write_buffer_mb << 20,
        max_open_files=limits.max_open_files,
        attempt=task_attempt(),
        run_id=run_id,
        locations=current,
    )


def _process(job: SplitJob, shuffle_rows: bool) -> Iterator[pa.Table | SplitResult]:
    """Read, decode and write a split; yield decoded rows instead of writing them if asked.

    Yields:
        With `shuffle_rows`, each chunk's decoded rows (for the data table); last, the
        split's result.
    """
    # A Spark worker is a process of its own: its progress lines need their handler.
    configure_logging()
    began, began_cpu = time.monotonic(), time.process_time()
    stages = Stages()
    spec = job.spec
    rules = DecodeRules.of_decoding(spec.decoding)
    tag = f"t{job.task:05d}"
    with stages.timed("open"):
        writers = {
            name: _writer(spec, name, job.batch, tag, job.run_id)
            for name in sorted(job.write)
            if not (shuffle_rows and name == "table")
        }
    results = {
        (r.topic, r.partition, r.start): RangeResult(r.topic, r.partition, r.start, r.end)
        for r in job.ranges
    }
    by_partition = {
        (r.topic, r.partition): results[(r.topic, r.partition, r.start)] for r in job.ranges
    }
    progress: dict[tuple[str, int, int], RangeProgress] = {}
    chunks: Iterator[RawChunk]
    if job.source == "raw":
        raw = spec.places.table("raw")
        chunks = read_raw_copy(
            raw.uri,
            delta_options(raw.uri, raw.options),
            job.ranges,
            job.batch,
            progress,
            job.raw_batch,
            job.raw_files,
        )
    else:
        conf = client_conf(spec.kafka, **{"group.id": spec.group_id})
        chunks = read_ranges(
            conf,
            job.ranges,
            job.batch,
            progress,
            stall_s=spec.limits.read_stall_s,
            chunk_bytes=spec.limits.read_chunk_mb << 20,
        )
    while True:
        # Fetching from Kafka and building the chunk's Arrow columns.
        with stages.timed("fetch"):
            chunk = next(chunks, None)
        if chunk is None:
            break
        raw = chunk.table
        if "raw" in writers:
            with stages.timed("write_raw"):
                writers["raw"].write(raw)
        with stages.timed("decode"):
            decoded = decode_chunk(raw, rules, chunk.rejected, spec.decoding.tombstones)
        # Decoded rows are copies: the raw chunk can go before they are written.
        del raw, chunk
        if "table" in writers:
            with stages.timed("write_data"):
                writers["table"].write(decoded.rows)
        elif shuffle_rows and "table" in job.write and decoded.rows.num_rows:
            yield decoded.rows
        if "quarantine" in writers:
            with stages.timed("write_quarantine"):
                writers["quarantine"].write(decoded.quarantine)
        with stages.timed("statistics"):
            _tally(decoded, rules, by_partition)
            _tally_tombstones(decoded.tombstones, spec.decoding.tombstones, by_partition)

    for key, p in progress.items():
        res = results[key]
        res.messages, res.bytes, res.gaps = p.messages, p.bytes, p.gaps
        res.offset_sum, res.redelivered = p.offset_sum, p.redelivered
        res.gap_runs, res.gap_runs_verified = p.gap_runs, p.gap_runs_verified
    with stages.timed("close"):
        files = {name: w.close() for name, w in writers.items()}
        _return_freed_memory()
    faults.reached(faults.TASK_FILES_CLOSED)
    staged = sum(stages.cpu.values())
    stages.add(BACKGROUND, 0.0, max(time.process_time() - began_cpu - staged, 0.0))
    yield SplitResult(
        job.task, list(results.values()), files, time.monotonic() - began, stages.as_dict()
    )


def _return_freed_memory() -> None:
    """Hand what the task freed back to the system, where the C library can (glibc).

    A Spark worker runs task after task (`spark.python.worker.reuse`). glibc keeps what
    the Kafka client's threads free (fetch buffers of tens of MB) in per-thread arenas
    rather than returning it, so a worker's resident memory grew with every task it
    ran: from 0.5 GB to 1 GB over five tasks of 500k messages, and a batch split into
    more tasks than cores took more memory the larger it was.
    """
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


def _tally(
    decoded: Decoded, rules: DecodeRules, by_partition: dict[tuple[str, int], RangeResult]
) -> None:
    """Add a chunk's rows, lateness, event-time span and quarantined rows to its ranges."""
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


def _tally_tombstones(
    tombstones: pa.Table, rule: str, by_partition: dict[tuple[str, int], RangeResult]
) -> None:
    """Count the tombstones a chunk handed back: skipped, or refused (`on_tombstone: fail`).

    A refused tombstone does not fail the task: Spark would retry it, and every retry
    would fail the same way. The driver stops the batch, naming the first one.
    """
    if not tombstones.num_rows:
        return
    for topic, partition, offset in zip(
        tombstones.column("_topic").to_pylist(),
        tombstones.column("_partition").to_pylist(),
        tombstones.column("_offset").to_pylist(),
        strict=True,
    ):
        res = by_partition[(topic, partition)]
        if rule == "fail":
            res.refused += 1
            res.first_refused = _min(res.first_refused, offset)
        else:
            res.skipped += 1
            res.skipped_offset_sum += offset


def run_split(job: SplitJob) -> SplitResult:
    """Read, decode and write one split: the `per_task` layout.

    Args:
        job: The split and its context.

    Returns:
        Counts per range and the files written.
    """
    for item in _process(job, shuffle_rows=False):
        if isinstance(item, SplitResult):
            return item
    raise AssertionError("a split always ends with its result")


def run_splits(jobs: list[SplitJob]) -> list[SplitResult]:
    """Several splits, one after another, in one task (`execute` with `pack`).

    A Spark task costs tens of milliseconds before it reads anything (scheduling, a
    Python worker's round trip): for hundreds of small tables' splits, more than the
    reading itself. Each split still closes its files before the next begins.
    """
    return [run_split(job) for job in jobs]


# Up to this many splits per core run a task each; more are packed into this many per core.
SPLITS_PER_SLOT = 4
# What a split costs beyond its offsets (a consumer, three writers, their files), counted
# in offsets, so that many small splits and a few large ones are spread evenly.
SPLIT_COST_OFFSETS = 20_000


def _packs(jobs: list[SplitJob], slots: int) -> list[list[int]]:
    """The splits (by index) packed into `SPLITS_PER_SLOT` tasks per core, evenly by cost.

    Returns:
        The packs, each in the splits' order; none when the splits are few enough to
        run a task each.
    """
    count = max(slots, 1) * SPLITS_PER_SLOT
    if len(jobs) <= count:
        return []
    cost = [SPLIT_COST_OFFSETS + sum(r.count for r in job.ranges) for job in jobs]
    # The largest first, each onto the least loaded pack (longest processing time first).
    loads = [(0, n) for n in range(count)]
    packs: list[list[int]] = [[] for _ in range(count)]
    for i in sorted(range(len(jobs)), key=lambda i: -cost[i]):
        load, n = heapq.heappop(loads)
        packs[n].append(i)
        heapq.heappush(loads, (load + cost[i], n))
    return [sorted(p) for p in packs if p]


META = ""


def map_split(job: SplitJob) -> Iterator[tuple[str, Any]]:
    """The map side of the `shuffle` layout: rows keyed by event-time partition.

    Rows travel as Arrow IPC bytes, opaque to the JVM, so the shuffle moves bytes
    and never converts rows. Raw and quarantine files are written here as usual.
    The run id travels with the rows, for the reducers' file names.

    Yields:
        (partition key, (run id, IPC bytes)) per chunk and event-time partition;
        last, (META, the split's result).
    """
    columns = partition_columns(job.spec.decoding.schemas.partitioning)
    for item in _process(job, shuffle_rows=True):
        if isinstance(item, SplitResult):
            yield META, item
            continue
        for key, part in split_by(item, columns):
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, part.schema) as stream:
                stream.write_table(part)
            yield "/".join(key), (job.run_id, sink.getvalue().to_pybytes())


def reduce_rows(
    spec: TaskSpec, batch: int, index: int, records: Iterator[tuple[str, Any]]
) -> Iterator[tuple[str, Any]]:
    """The reduce side of the `shuffle` layout: one writer for the partitions it owns.

    Yields:
        ("meta", SplitResult) passed through from the map side, and
        ("files", written files) once at the end.
    """
    writer: PartitionedWriter | None = None
    for key, payload in records:
        if key == META:
            yield "meta", payload
            continue
        run_id, rows = payload
        if writer is None:
            writer = _writer(spec, "table", batch, f"r{index:05d}", run_id)
        writer.write(pa.ipc.open_stream(rows).read_all())
    if writer is not None:
        yield "files", writer.close()


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def execute(
    spark: SparkSession, jobs: list[SplitJob], label: str, reducers: int = 0, pack: bool = False
) -> list[SplitResult]:
    """Run one task per split and collect their metadata.

    Args:
        spark: The session.
        jobs: The splits.
        label: Printed with progress lines.
        reducers: 0 for the `per_task` layout; otherwise the `shuffle` layout with
            this many writing tasks.
        pack: The splits are of many batches (the tables of a routed pipeline): beyond
            `SPLITS_PER_SLOT` per core, they run packed into that many tasks per core.

    Returns:
        Each split's result, in order (with `shuffle`, plus one holding the reducers'
        files).
    """
    from strata.spark.session import progress, run_each

    if not reducers:
        packs = _packs(jobs, spark.sparkContext.defaultParallelism) if pack else []
        if not packs:
            return run_each(spark, run_split, jobs, label)
        ran = run_each(spark, run_splits, [[jobs[i] for i in p] for p in packs], label)
        by_index: dict[int, SplitResult] = {}
        for indices, each in zip(packs, ran, strict=True):
            by_index.update(zip(indices, each, strict=True))
        return [by_index[i] for i in range(len(jobs))]
    sc = spark.sparkContext
    sc.setJobDescription(label)
    with progress(sc, label, len(jobs)):
        spec, batch = jobs[0].spec, jobs[0].batch
        out = (
            sc.parallelize(jobs, len(jobs))
            .flatMap(map_split)
            .partitionBy(reducers)
            .mapPartitionsWithIndex(partial(reduce_rows, spec, batch))
            .collect()
        )
    results: list[SplitResult] = [payload for kind, payload in out if kind == "meta"]
    files = [f for kind, payload in out if kind == "files" for f in payload]
    results.append(SplitResult(task=-1, ranges=[], files={"table": files}, seconds=0.0))
    return results
