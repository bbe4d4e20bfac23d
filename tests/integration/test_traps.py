"""Kafka's traps, end to end on Apache Kafka: a topic deleted and created again (its
offsets restart at 0), partitions added to a topic (CreatePartitions), a topic joining a
pipeline, and every unread message deleted before it was read (DeleteRecords, as
retention deletes them). The planner's decisions are also checked on literal
watermarks in tests/unit/test_plan.py.
"""

from __future__ import annotations

from collections import Counter

import yaml
from deltalake import DeltaTable

from strata.batch.plan import PlanStore
from strata.run import run_batch
from strata.store.ledger import ledger_state, read_ledger
from tests.conftest import expected_offsets, produce_clicks


def test_a_recreated_topic_whose_offsets_went_backwards_stops_the_run(make_pipeline, broker):
    p = make_pipeline(partitions=2)
    first = produce_clicks(broker, p.topic, 2, 400)
    assert p.cli("run").returncode == 0
    before = read_ledger(p.cfg().places()).num_rows
    broker.delete_topic(p.topic)
    broker.create_topic(p.topic, 2)
    produce_clicks(broker, p.topic, 2, 40, seed=3)

    rerun = p.cli("run")
    assert rerun.returncode == 1
    error = rerun.stderr.strip()
    assert error.startswith(
        f"strata: error: partition 0 of `{p.topic}`: the high watermark 20 is below the "
        f"committed offset {first[0]}. The log went backwards"
    ), error
    assert "Nothing was read" in error and "Traceback" not in error
    # Nothing was planned, read or committed: the ledger and tables are as they were.
    assert read_ledger(p.cfg().places()).num_rows == before
    assert PlanStore(p.cfg().places()).load(2) is None
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
    # The topic grows to two partitions (CreatePartitions); it keeps its id and its log.
    broker.create_partitions(p.topic, 2)
    per = produce_clicks(broker, p.topic, 2, 300)

    done = p.cli("run")
    assert done.returncode == 0, done.stderr
    assert f"new partitions, read from: {p.topic}:1 offset 0" in done.stdout
    assert p.landed() == expected_offsets(per)
    ledger = [r for r in read_ledger(p.cfg().places()).to_pylist() if r["batch"] == 2]
    assert sorted((r["partition"], r["start_offset"], r["end_offset"]) for r in ledger) == [
        (0, 0, per[0]),
        (1, 0, per[1]),
    ]
    assert Counter(p.raw_copies().values()) == Counter({1: sum(per.values())})


def test_a_topic_added_with_latest_while_others_have_data_loses_nothing_after_its_start(
    make_pipeline, broker, spark
):
    # `views` joins a pipeline that reads `clicks`, with starting_offsets: latest. Its
    # first range is empty while `clicks` has data; the ledger must record where it
    # starts, or every later batch restarts it at the then high watermark and
    # everything produced to it meanwhile is lost.
    p = make_pipeline(partitions=1)
    clicks = produce_clicks(broker, p.topic, 1, 300)
    assert run_batch(p.cfg(), session=lambda _: spark).batch == 1
    views = p.topic + "-views"
    broker.create_topic(views, 1)
    before = produce_clicks(broker, views, 1, 50, seed=2)  # older than the pipeline's start
    conf = p.conf_dir / "pipelines" / f"{p.name}.yaml"
    body = yaml.safe_load(conf.read_text())
    body.update(topics=[p.topic, views], starting_offsets="latest")
    conf.write_text(yaml.safe_dump(body))
    more = produce_clicks(broker, p.topic, 1, 200, seed=3)

    second = run_batch(p.cfg(), session=lambda _: spark)
    assert second.new_partitions == [(views, 0)]
    assert [(r.topic, r.start, r.end) for r in second.ranges] == [
        (p.topic, clicks[0], clicks[0] + more[0]),
        (views, before[0], before[0]),
    ]
    produced = produce_clicks(broker, views, 1, 120, seed=4)
    produce_clicks(broker, p.topic, 1, 10, seed=5)
    third = run_batch(p.cfg(), session=lambda _: spark)
    assert [(r.topic, r.start, r.end) for r in third.ranges if r.topic == views] == [
        (views, before[0], before[0] + produced[0])
    ]
    landed = read_ledger(p.cfg().places()).to_pylist()
    assert sorted(
        (r["batch"], r["start_offset"], r["end_offset"]) for r in landed if r["topic"] == views
    ) == [
        (2, before[0], before[0]),
        (3, before[0], before[0] + produced[0]),
    ]
    views_rows = DeltaTable(p.cfg().location("table")).to_pyarrow_table(
        filters=[("_topic", "=", views)], columns=["_offset"]
    )
    assert sorted(views_rows.column("_offset").to_pylist()) == list(
        range(before[0], before[0] + produced[0])
    )


def test_an_accepted_loss_on_an_emptied_partition_is_recorded_once(make_pipeline, broker, spark):
    # Every unread message is deleted (DeleteRecords, as retention deletes them): the
    # log start is the high watermark. The accepted loss is recorded once, and the next
    # run finds nothing to do and no second loss.
    p = make_pipeline(partitions=1)
    first = produce_clicks(broker, p.topic, 1, 99)
    run_batch(p.cfg(), session=lambda _: spark)
    unread = produce_clicks(broker, p.topic, 1, 401, seed=2)
    end = first[0] + unread[0]
    assert broker.delete_records(p.topic, {0: end}) == {0: end}
    cfg = p.cfg()

    outcome = run_batch(cfg, session=lambda _: spark, accept_loss="oncall@host: INC-9")
    assert outcome.batch == 2 and f"{unread[0]} messages were deleted" in outcome.warnings[0]
    rows = [r for r in read_ledger(cfg.places()).to_pylist() if r["batch"] == 2]
    assert sorted((r["kind"], r["start_offset"], r["end_offset"]) for r in rows) == [
        ("ingest", end, end),
        ("loss", first[0], end),
    ]
    assert ledger_state(cfg.places()).committed == {(p.topic, 0): end}
    assert run_batch(cfg, session=lambda _: spark).status == "idle"
    assert read_ledger(cfg.places()).num_rows == 1 + 2
    assert p.landed() == expected_offsets(first)
