"""The driver's checks before it commits: task pieces tile the plan, files hold what was read."""

from __future__ import annotations

import pytest

from strata.batch.plan import BatchPlan
from strata.batch.reconcile import batch_results, reconcile_files
from strata.batch.task import RangeResult, SplitResult
from strata.errors import ReconcileError
from strata.store.parquet import WrittenFile
from strata.store.ranges import OffsetRange

PLAN = BatchPlan(
    "clicks",
    4,
    [OffsetRange("t", 0, 100, 200), OffsetRange("t", 1, 50, 50), OffsetRange("t", 2, 0, 30)],
    [],
)


def piece(partition: int, start: int, end: int, gaps: int = 0, **counts) -> RangeResult:
    messages = end - start - gaps
    offsets = sum(range(start, end)) if not gaps else counts.pop("offset_sum")
    base = {"messages": messages, "gaps": gaps, "rows": messages, "offset_sum": offsets}
    return RangeResult("t", partition, start, end, **{**base, **counts})


def split(*ranges: RangeResult) -> SplitResult:
    return SplitResult(0, list(ranges), {}, 0.0)


def test_pieces_cut_across_tasks_merge_into_one_result_per_planned_range():
    results = batch_results(
        PLAN, [split(piece(0, 100, 160), piece(2, 0, 30)), split(piece(0, 160, 200))]
    )
    assert [(r.partition, r.start, r.end, r.messages) for r in results] == [
        (0, 100, 200, 100),
        (1, 50, 50, 0),  # the empty range leaves its start, with no task reading it
        (2, 0, 30, 30),
    ]
    assert results[0].offset_sum == sum(range(100, 200))


@pytest.mark.parametrize(
    ("pieces", "problem"),
    [
        # A task's result was lost: the counts alone would call 40 offsets gaps.
        ([piece(0, 100, 160), piece(2, 0, 30)], "the tasks reported offsets up to 160 only"),
        # The same piece twice: every count of it doubled.
        (
            [piece(0, 100, 200), piece(0, 100, 200), piece(2, 0, 30)],
            "a task reported [100, 200) where [200, ...) was due",
        ),
        # Offsets the plan does not hold.
        (
            [piece(0, 100, 200), piece(2, 0, 30), piece(3, 0, 5)],
            "a task reported [0, 5), which the plan does not hold",
        ),
    ],
)
def test_pieces_that_do_not_tile_the_plan_commit_nothing(pieces, problem):
    with pytest.raises(ReconcileError, match="nothing was committed") as caught:
        batch_results(PLAN, [split(*pieces)])
    assert problem in str(caught.value)


def written(counts: dict[str, list[int]]) -> WrittenFile:
    return WrittenFile("x.parquet", 1, {}, sum(c[0] for c in counts.values()), "{}", counts)


def test_files_that_hold_every_offset_read_once_reconcile():
    [r] = batch_results(
        BatchPlan("c", 1, [OffsetRange("t", 0, 0, 10)], []), [split(piece(0, 0, 10))]
    )
    r.rows, r.quarantined = 8, 2
    files = {
        "table": [written({"t:0": [8, 40]})],
        "quarantine": [written({"t:0": [2, 5]})],
        "raw": [written({"t:0": [10, 45]})],
    }
    reconcile_files(PLAN, [r], files, ("table", "quarantine", "raw"))


@pytest.mark.parametrize(
    ("table", "quarantine", "raw", "problem"),
    [
        # A row written twice and another never: the counts agree, the sums do not.
        ([8, 41], [2, 5], [10, 45], "the data and quarantine files hold other offsets"),
        ([9, 49], [2, 5], [10, 45], "the table files hold 9 rows of it, 8 expected"),
        ([8, 40], [2, 5], [9, 45], "the raw files hold 9 rows of it, 10 expected"),
        ([8, 40], [2, 5], [10, 44], "the raw files hold other offsets than were read"),
    ],
)
def test_files_that_do_not_hold_what_was_read_commit_nothing(table, quarantine, raw, problem):
    [r] = batch_results(
        BatchPlan("c", 1, [OffsetRange("t", 0, 0, 10)], []), [split(piece(0, 0, 10))]
    )
    r.rows, r.quarantined = 8, 2
    files = {
        "table": [written({"t:0": table})],
        "quarantine": [written({"t:0": quarantine})],
        "raw": [written({"t:0": raw})],
    }
    with pytest.raises(ReconcileError, match="nothing was committed") as caught:
        reconcile_files(PLAN, [r], files, ("table", "quarantine", "raw"))
    assert problem in str(caught.value)


def test_decoded_rows_must_account_for_every_message_read():
    [r] = batch_results(
        BatchPlan("c", 1, [OffsetRange("t", 0, 0, 10)], []), [split(piece(0, 0, 10))]
    )
    r.rows, r.quarantined = 7, 2
    with pytest.raises(ReconcileError, match="read 10 messages but decoded 7 rows and 2"):
        reconcile_files(PLAN, [r], {"table": [], "quarantine": [], "raw": []}, ())


def test_a_resumed_batch_must_decide_as_the_attempt_whose_commit_stands(tmp_path):
    from strata.batch.reconcile import RANGES_KEY, reconcile_resumed
    from strata.schema.avro import RAW_SCHEMA
    from strata.store.delta import commit_files, ensure_table
    from strata.store.places import TableRef

    ref = TableRef(str(tmp_path / "clicks_raw"), "delta")
    plan = BatchPlan("clicks", 1, [OffsetRange("t", 0, 0, 10)], [])
    [then] = batch_results(plan, [split(piece(0, 0, 10))])
    then.rows, then.quarantined = 8, 2
    # The raw copy's commit of batch 1 stands, with what its attempt read and decoded.
    raw = ensure_table(ref.uri, RAW_SCHEMA, [], {}, "clicks_raw")
    commit_files(raw, RAW_SCHEMA, [], [], "clicks", 1, {RANGES_KEY: [vars(then)]})
    [now] = batch_results(plan, [split(piece(0, 0, 10))])
    now.rows, now.quarantined = 8, 2
    reconcile_resumed("clicks", plan, [now], "raw", ref)
    # The resumed attempt quarantines one message fewer (an upgrade changed a rule).
    now.rows, now.quarantined = 9, 1
    with pytest.raises(ReconcileError, match="does not decide as the attempt whose raw commit"):
        reconcile_resumed("clicks", plan, [now], "raw", ref)


def test_a_batch_is_counted_from_the_files_that_can_hold_it_alone(tmp_path, monkeypatch):
    from strata.schema.avro import RAW_SCHEMA
    from strata.store.delta import commit_files, ensure_table
    from strata.store.places import TableRef
    from strata.store.tables import batch_counts
    from tests.unit.test_delta_handles import raw_files

    uri = str(tmp_path / "clicks_raw")
    table = ensure_table(uri, RAW_SCHEMA, [], {}, "clicks_raw")
    written = {}
    for batch, partitions in ((1, [0, 1, 1]), (2, [0, 0, 1, 1, 1])):
        # A file per two rows: a batch's rows lie in several files.
        written[batch] = raw_files(uri, batch, partitions)
        commit_files(table, RAW_SCHEMA, [], written[batch], "clicks", batch, {})
        table.update_incremental()
    assert [len(written[1]), len(written[2])] == [2, 3]
    ref = TableRef(uri, "delta")
    # Files are read a group at a time; the groups' counts add up.
    monkeypatch.setattr("strata.store.tables._FILES_AT_ONCE", 1)
    assert batch_counts(ref, 1) == {("t", 0): 1, ("t", 1): 2}
    # Batch 1's files are gone from storage: batch 2 is still counted, from its own
    # files, which their statistics tell apart without opening the others.
    for f in written[1]:
        (tmp_path / "clicks_raw" / f.path).unlink()
    assert batch_counts(ref, 2) == {("t", 0): 2, ("t", 1): 3}
