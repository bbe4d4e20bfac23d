"""Kafka's traps, end to end on the real local broker.

The local broker cannot raise a log start (no DeleteRecords, no retention in memory)
or add partitions to a topic (no CreatePartitions). Those decisions are proven on
literal watermarks in test_plan; here the wiring is proven with the states the broker
does reach: a topic deleted and re-created restarts its offsets at 0, and may come
back with more partitions.
"""

from __future__ import annotations

from collections import Counter

import pytest

from strata.ledger import read_ledger
from strata.plan import PlanStore
from strata.run import run_batch
from tests.conftest import expected_offsets, produce_clicks

pytestmark = pytest.mark.integration


def test_a_recreated_topic_whose_offsets_went_backwards_stops_the_run(make_pipeline, broker):
    p = make_pipeline(partitions=2)
    first = produce_clicks(broker, p.topic, 2, 400)
    assert p.cli("run").returncode == 0
    before = read_ledger(p.cfg()).num_rows
    broker.delete_topic(p.topic)
    broker.create_topic(p.topic, 2)
    produce_clicks(broker, p.topic, 2, 40, seed=3)

    rerun = p.cli("run")
    assert rerun.returncode == 1
    error = rerun.stderr.strip()
    assert error.startswith(
        f"strata: error: partition 0 of `{p.topic}`: the high watermark 21 is below the "
        f"committed offset {first[0]}. The log went backwards"
    ), error
    assert "Nothing was read" in error and "Traceback" not in error
    # Nothing was planned, read or committed: the ledger and tables are as they were.
    assert read_ledger(p.cfg()).num_rows == before
    assert PlanStore(p.cfg()).load(2) is None
    assert p.landed() == expected_offsets(first)


def test_a_partition_added_between_runs_is_picked_up_from_its_log_start(
    make_pipeline, broker, spark
):
    # `latest` would skip partition 1's messages; an added partition starts at its log
    # start whatever the starting policy, and the summary says so.
    p = make_pipeline(partitions=1, overrides={"starting_offsets": "latest"})
    first = run_batch(p.cfg(), session=lambda _: spark)
    assert first.new_partitions == [(p.topic, 0)]
    assert [(r.start, r.end) for r in first.ranges] == [(0, 0)]
    # The topic grows to two partitions (re-created: the broker has no CreatePartitions).
    broker.delete_topic(p.topic)
    broker.create_topic(p.topic, 2)
    per = produce_clicks(broker, p.topic, 2, 300)

    done = p.cli("run")
    assert done.returncode == 0, done.stderr
    assert f"new partitions, read from: {p.topic}:1 offset 0" in done.stdout
    assert p.landed() == expected_offsets(per)
    ledger = [r for r in read_ledger(p.cfg()).to_pylist() if r["batch"] == 2]
    assert sorted((r["partition"], r["start_offset"], r["end_offset"]) for r in ledger) == [
        (0, 0, per[0]),
        (1, 0, per[1]),
    ]
    assert Counter(p.raw_copies().values()) == Counter({1: sum(per.values())})
