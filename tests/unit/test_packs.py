"""The splits of many small batches packed into few Spark tasks, evenly by cost."""

from __future__ import annotations

from collections import Counter

from strata.batch.task import SPLIT_COST_OFFSETS, SPLITS_PER_SLOT, SplitJob, _packs
from strata.store.ranges import OffsetRange


def _job(task: int, offsets: int) -> SplitJob:
    # Only the ranges matter to the packing; the spec is never read.
    return SplitJob(None, 1, task, [OffsetRange(f"t{task}", 0, 0, offsets)], frozenset())  # type: ignore[arg-type]


def test_few_splits_run_a_task_each():
    jobs = [_job(i, 100) for i in range(2 * SPLITS_PER_SLOT)]
    assert _packs(jobs, slots=2) == []


def test_many_small_splits_are_packed_each_once_and_evenly():
    jobs = [_job(i, 2_000) for i in range(200)]
    packs = _packs(jobs, slots=2)
    assert len(packs) == 2 * SPLITS_PER_SLOT
    assert Counter(i for p in packs for i in p) == Counter(range(200))
    assert all(p == sorted(p) for p in packs)
    sizes = [len(p) for p in packs]
    assert max(sizes) - min(sizes) <= 1


def test_a_large_split_is_not_packed_with_the_small_ones():
    big = _job(0, 50 * (SPLIT_COST_OFFSETS + 2_000))
    jobs = [big, *(_job(i, 2_000) for i in range(1, 41))]
    packs = _packs(jobs, slots=1)
    assert [0] in packs
    loads = [sum(SPLIT_COST_OFFSETS + jobs[i].ranges[0].count for i in p) for p in packs]
    small = [load for p, load in zip(packs, loads, strict=True) if p != [0]]
    assert max(small) - min(small) <= SPLIT_COST_OFFSETS + 2_000
