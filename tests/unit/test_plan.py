"""Planning decisions, on literal watermarks and committed offsets."""

from __future__ import annotations

import pytest

from strata.batch.plan import BatchPlan, PartitionState, PlanStore, plan_ranges, split_ranges
from strata.config import EventTimeConfig, PipelineConfig
from strata.errors import PlanError
from strata.store.ranges import OffsetRange
from tests.conftest import ROOT


def test_new_partitions_start_per_policy_and_are_capped():
    states = [PartitionState("t", 0, 10, 500, None), PartitionState("t", 1, 0, 40, None)]
    ranges, new, _ = plan_ranges(states, "earliest", 100)
    assert ranges == [OffsetRange("t", 0, 10, 110), OffsetRange("t", 1, 0, 40)]
    assert new == [("t", 0), ("t", 1)]
    ranges, _, _ = plan_ranges(states, "latest", 100)
    assert ranges == [OffsetRange("t", 0, 500, 500), OffsetRange("t", 1, 40, 40)]


def test_committed_partitions_continue_where_they_ended():
    states = [PartitionState("t", 0, 0, 900, 700), PartitionState("t", 1, 0, 50, 50)]
    ranges, new, _ = plan_ranges(states, "earliest", 1000)
    assert ranges == [OffsetRange("t", 0, 700, 900), OffsetRange("t", 1, 50, 50)]
    assert new == []


def test_high_watermark_below_committed_stops_with_the_reason():
    with pytest.raises(
        PlanError,
        match=r"partition 2 of `t`: the high watermark 10 is below the committed offset 300",
    ):
        plan_ranges([PartitionState("t", 2, 0, 10, 300)], "earliest", 100)


def test_offsets_deleted_before_read_fail_closed_with_the_count():
    with pytest.raises(
        PlanError,
        match=r"partition 3 of `clicks`: committed offset 1200 is below the log start 5000; "
        r"3800 messages were deleted by retention before they were read\. Nothing was read\. "
        r"Re-run with --accept-loss",
    ):
        plan_ranges([PartitionState("clicks", 3, 5000, 9000, 1200)], "earliest", 100)


def test_a_loss_names_every_partition_that_lost_offsets_so_accepting_it_is_informed():
    states = [
        PartitionState("clicks", 1, 0, 90, 40),
        PartitionState("clicks", 3, 5000, 9000, 1200),
        PartitionState("views", 0, 70, 80, 10),
    ]
    with pytest.raises(PlanError) as err:
        plan_ranges(states, "earliest", 100)
    text = str(err.value)
    assert "partition 3 of `clicks`: committed offset 1200" in text
    assert (
        "partition 0 of `views`: committed offset 10 is below the log start 70; 60 messages" in text
    )
    assert "partition 1 of `clicks`" not in text and "record the losses" in text


def test_an_accepted_loss_goes_on_from_the_log_start_and_names_the_lost_range():
    states = [PartitionState("clicks", 3, 5000, 9000, 1200), PartitionState("clicks", 4, 0, 70, 50)]
    ranges, new, losses = plan_ranges(states, "earliest", 100, accept_loss=True)
    assert ranges == [OffsetRange("clicks", 3, 5000, 5100), OffsetRange("clicks", 4, 50, 70)]
    assert losses == [OffsetRange("clicks", 3, 1200, 5000)] and new == []
    # Going backwards is never accepted: that is not retention.
    with pytest.raises(PlanError, match="went backwards"):
        plan_ranges([PartitionState("clicks", 3, 0, 10, 300)], "earliest", 100, accept_loss=True)


def test_a_partition_added_between_runs_is_read_from_its_log_start():
    # Batch 1 read partitions 0 and 1 of `clicks`; then the topic grew to 3 partitions.
    # Partition 2 holds messages produced since it was created: even under `latest`,
    # skipping them would be silent loss, so it starts at its log start.
    committed = {("clicks", 0): 700, ("clicks", 1): 650}
    states = [
        PartitionState("clicks", 0, 0, 900, 700),
        PartitionState("clicks", 1, 0, 800, 650),
        PartitionState("clicks", 2, 0, 40, None),
        PartitionState("views", 0, 100, 300, None),
    ]
    for policy in ("earliest", "latest"):
        ranges, new, losses = plan_ranges(states, policy, 1000, committed=committed)
        assert new == [("clicks", 2), ("views", 0)]
        assert OffsetRange("clicks", 2, 0, 40) in ranges
        assert OffsetRange("clicks", 0, 700, 900) in ranges and losses == []
    # A topic new to the pipeline (`views`) still follows the starting policy.
    ranges, _, _ = plan_ranges(states, "latest", 1000, committed=committed)
    assert OffsetRange("views", 0, 300, 300) in ranges
    ranges, _, _ = plan_ranges(states, "earliest", 1000, committed=committed)
    assert OffsetRange("views", 0, 100, 300) in ranges


def test_a_committed_partition_the_broker_no_longer_lists_stops_the_plan():
    committed = {("clicks", 0): 700, ("clicks", 1): 650, ("clicks", 2): 10}
    states = [PartitionState("clicks", 0, 0, 900, 700), PartitionState("clicks", 1, 0, 800, 650)]
    with pytest.raises(
        PlanError, match=r"partition 2 of `clicks`: the ledger has committed offsets for it but"
    ):
        plan_ranges(states, "earliest", 1000, committed=committed)


def test_split_covers_every_offset_once_in_balanced_tasks():
    ranges = [OffsetRange("t", p, 100 * p, 100 * p + 250) for p in range(4)] + [
        OffsetRange("t", 9, 5, 5)
    ]
    splits = split_ranges(ranges, tasks=2, max_per_task=10_000)
    assert len(splits) == 2
    assert [sum(r.count for r in s) for s in splits] == [500, 500]
    covered = sorted((r.partition, o) for s in splits for r in s for o in range(r.start, r.end))
    assert covered == sorted((p, o) for p in range(4) for o in range(100 * p, 100 * p + 250))


def test_split_respects_max_offsets_per_task():
    splits = split_ranges([OffsetRange("t", 0, 0, 1001)], tasks=1, max_per_task=100)
    assert len(splits) == 11
    assert max(sum(r.count for r in s) for s in splits) <= 100
    assert splits[0][0].start == 0 and splits[-1][-1].end == 1001
    assert split_ranges([OffsetRange("t", 0, 7, 7)], tasks=2, max_per_task=100) == []


def test_plan_round_trips_through_json():
    ranges = [OffsetRange("t", 0, 1, 9)]
    plan = BatchPlan("p", 3, ranges, [ranges], [("t", 0)], "abc", "now", {"t:0": 12})
    assert BatchPlan.from_json(plan.to_json()) == plan


def _cfg(**over):
    from strata.config import EventTimeConfig, PipelineConfig
    from tests.conftest import ROOT

    return PipelineConfig(
        name="clicks",
        topics=["clicks", "views"],
        schema_file="clicks.avsc",
        schemas_dir=str(ROOT / "schemas"),
        event_time=EventTimeConfig(field="ts"),
        **over,
    )


def test_every_range_that_moves_where_reading_goes_on_is_planned_even_when_empty():
    from strata.batch.planning import new_plan
    from strata.run import plan_settings

    # `views` is new to the pipeline and starts at its end (`latest`) while `clicks`
    # has data: its empty first range must still be planned, or its start is never
    # recorded and every later plan starts it at the then high watermark.
    committed = {("clicks", 0): 100}
    states = [PartitionState("clicks", 0, 0, 250, 100), PartitionState("views", 0, 0, 40, None)]
    plan = new_plan(
        plan_settings(_cfg(starting_offsets="latest")), 7, states, None, None, committed
    )
    assert plan is not None
    assert plan.ranges == [OffsetRange("clicks", 0, 100, 250), OffsetRange("views", 0, 40, 40)]
    assert plan.new_partitions == [("views", 0)]
    # A partition idle since its last batch is left out: the ledger has its start.
    idle = [PartitionState("clicks", 0, 0, 100, 100), PartitionState("views", 0, 0, 90, 40)]
    committed = {("clicks", 0): 100, ("views", 0): 40}
    plan = new_plan(plan_settings(_cfg()), 8, idle, None, None, committed)
    assert plan is not None and plan.ranges == [OffsetRange("views", 0, 40, 90)]


def test_an_accepted_loss_on_an_emptied_partition_moves_reading_to_the_log_start_once():
    from strata.batch.planning import new_plan
    from strata.run import plan_settings

    # Retention deleted every unread message of partition 0 and nothing new arrived:
    # the loss is recorded once, with an empty range at the log start, so the next
    # plan starts there and records no second loss.
    states = [PartitionState("clicks", 0, 500, 500, 100)]
    plan = new_plan(
        plan_settings(_cfg()), 3, states, None, "oncall@host: INC-9", {("clicks", 0): 100}
    )
    assert plan is not None
    assert plan.losses == [OffsetRange("clicks", 0, 100, 500)]
    assert plan.ranges == [OffsetRange("clicks", 0, 500, 500)]
    assert plan.splits == []
    after = [PartitionState("clicks", 0, 500, 500, 500)]
    assert (
        new_plan(plan_settings(_cfg()), 4, after, None, "oncall@host: INC-9", {("clicks", 0): 500})
        is None
    )


def test_a_topic_taken_out_of_the_pipeline_does_not_stop_the_plan():
    from strata.batch.planning import new_plan
    from strata.run import plan_settings

    # `gone` was read once and then removed from `topics`: its ledger rows stay, but it
    # is not a committed partition the brokers stopped listing.
    committed = {("clicks", 0): 100, ("gone", 0): 7}
    plan = new_plan(
        plan_settings(_cfg()), 2, [PartitionState("clicks", 0, 0, 150, 100)], None, None, committed
    )
    assert plan is not None and plan.ranges == [OffsetRange("clicks", 0, 100, 150)]
    # A configured topic's partition that vanished still stops it.
    with pytest.raises(PlanError, match="partition 0 of `views`"):
        new_plan(plan_settings(_cfg()), 2, [PartitionState("clicks", 0, 0, 150, 100)], None, None,
                 {**committed, ("views", 0): 3})  # fmt: skip


def test_a_new_topic_starts_at_the_offsets_found_at_the_starting_moment():
    # The offsets a broker gives: the first offset at or after the moment, or the high
    # watermark when every message is older (found by kafka.py; Kafka's own answers
    # are used end to end in tests/integration/test_topics.py).
    moment = "2026-01-31T00:00:00.000+00:00"
    states = [
        PartitionState("clicks", 0, 100, 900, None, at_start=420),
        PartitionState("clicks", 1, 0, 300, None, at_start=300),
        # The log start moved past the answer between the two requests.
        PartitionState("clicks", 2, 50, 80, None, at_start=10),
    ]
    ranges, new, _ = plan_ranges(states, moment, 1000)
    assert ranges == [
        OffsetRange("clicks", 0, 420, 900),
        OffsetRange("clicks", 1, 300, 300),
        OffsetRange("clicks", 2, 50, 80),
    ]
    assert new == [("clicks", 0), ("clicks", 1), ("clicks", 2)]
    # A partition added to a topic already read starts at its log start, as always.
    committed = {("clicks", 0): 900}
    grown = [
        PartitionState("clicks", 0, 100, 900, 900),
        PartitionState("clicks", 3, 0, 70, None, at_start=60),
    ]
    ranges, _, _ = plan_ranges(grown, moment, 1000, committed=committed)
    assert ranges[1] == OffsetRange("clicks", 3, 0, 70)


def test_a_starting_moment_the_brokers_gave_no_offset_for_stops_the_plan():
    states = [PartitionState("clicks", 0, 0, 900, None, at_start=None)]
    with pytest.raises(
        PlanError,
        match=r"partition 0 of `clicks`: the brokers gave no offset for starting_offsets "
        r"2026-01-31T00:00:00\.000\+00:00 .*Nothing was read",
    ):
        plan_ranges(states, "2026-01-31T00:00:00.000+00:00", 1000)


def test_the_plan_says_why_each_new_partition_starts_where_it_does():
    from strata.batch.planning import new_plan
    from strata.run import plan_settings

    committed = {("clicks", 0): 100}
    states = [
        PartitionState("clicks", 0, 0, 250, 100),
        PartitionState("clicks", 1, 5, 90, None, at_start=40),
        PartitionState("views", 0, 0, 40, None, at_start=12),
    ]
    cfg = _cfg(starting_offsets="2026-01-31T00:00:00Z")
    plan = new_plan(plan_settings(cfg), 7, states, None, None, committed)
    assert plan is not None
    assert plan.ranges[1:] == [OffsetRange("clicks", 1, 5, 90), OffsetRange("views", 0, 12, 40)]
    assert plan.began == {
        "clicks:1": "a partition added to a topic already read starts at its log start",
        "views:0": "starting_offsets 2026-01-31T00:00:00.000+00:00: the first message at or "
        "after it",
    }
    assert BatchPlan.from_json(plan.to_json()).began == plan.began


def _store(tmp_path) -> PlanStore:
    cfg = PipelineConfig(
        name="p",
        topics=["t"],
        format="json",
        schema_file="clicks.avsc",
        schemas_dir=str(ROOT / "schemas"),
        warehouse=str(tmp_path),
        event_time=EventTimeConfig(field="ts"),
    )
    return PlanStore(cfg.places())


def _saved(store: PlanStore, batch: int, kind: str = "ingest") -> None:
    ranges = [OffsetRange("t", 0, batch * 10, batch * 10 + 10)]
    store.create(BatchPlan("p", batch, ranges, [ranges], kind=kind))


def test_a_committed_ingest_batch_forgets_its_plan_and_any_other_kind_keeps_it(tmp_path):
    store = _store(tmp_path)
    _saved(store, 1)
    _saved(store, 2, kind="replay")
    _saved(store, 3, kind="backfill")
    assert store.forget(1) and store.load(1) is None
    assert not store.forget(2) and store.load(2) is not None
    assert not store.forget(3) and store.load(3) is not None
    assert not store.forget(4)  # never saved


def test_an_unreadable_plan_is_left_for_a_person_to_see(tmp_path):
    store = _store(tmp_path)
    _saved(store, 1)
    path = next(tmp_path.rglob("batch-0000000001.json"))
    path.write_text("{cut sh")
    assert not store.forget(1)
    assert path.exists()


def test_plans_older_than_the_kept_tail_are_forgotten_at_once(tmp_path):
    store = _store(tmp_path)
    for batch in range(1, 13):
        _saved(store, batch, kind="replay" if batch == 4 else "ingest")
    gone = store.forget_older(12, keep=5)
    assert gone == [1, 2, 3, 5, 6, 7]
    kept = [b for b in range(1, 13) if store.load(b) is not None]
    assert kept == [4, 8, 9, 10, 11, 12]
    assert store.forget_older(12, keep=5) == []
