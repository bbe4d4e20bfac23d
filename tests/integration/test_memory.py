"""A Spark worker runs task after task: what one task used must not stay with the next."""

from __future__ import annotations

import ctypes

import psutil

from strata.batch.task import SplitJob, run_split
from strata.run import batch_work
from strata.store.ranges import OffsetRange
from tests.conftest import produce_clicks


def test_a_worker_running_task_after_task_keeps_its_memory_flat(make_pipeline, broker):
    p = make_pipeline(partitions=1)
    per = produce_clicks(broker, p.topic, 1, 500_000)
    spec = batch_work(p.cfg()).task
    resident = []
    kept = []
    trim = ctypes.CDLL(None).malloc_trim
    # As a reused Python worker runs them: one process, one task after another.
    for k in range(4):
        job = SplitJob(
            spec,
            k + 1,
            0,
            [OffsetRange(p.topic, 0, 0, per[0])],
            frozenset({"raw", "table", "quarantine"}),
            run_id=f"memory{k}",
        )
        result = run_split(job)
        assert sum(r.messages for r in result.ranges) == per[0]
        resident.append(psutil.Process().memory_info().rss)
        # What the C library still held of what the task freed: a further trim hands
        # it back. Without the task's own trim this was 170-200 MB after every task.
        trim(0)
        kept.append((resident[-1] - psutil.Process().memory_info().rss) >> 20)
    assert max(kept) < 32, f"MB the C library kept after each task: {kept}"
    # Resident memory also moves with Arrow's pool and the interpreter's heap, by a
    # hundred MB either way between runs, so the bound on growth itself is loose.
    grown = [(r - resident[0]) >> 20 for r in resident]
    assert max(grown) < 250, f"resident memory after each task, MB over the first: {grown}"
