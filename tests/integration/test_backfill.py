"""Backfill: a committed range re-ingested and replaced exactly, from Kafka or the raw copy."""

from __future__ import annotations

import json
import signal

import pytest

from strata import faults
from strata.errors import BackfillError
from strata.run import reprocess, run_batch
from strata.store.ledger import ledger_state, read_ledger
from strata.store.ranges import OffsetRange
from tests.conftest import expected_offsets, produce_clicks
from tests.faults import armed


def rows_by_offset(p) -> dict[tuple[int, int], tuple[int, str]]:
    t = p.table_rows("table", ["_partition", "_offset", "_batch", "event_id"]).to_pylist()
    return {(r["_partition"], r["_offset"]): (r["_batch"], r["event_id"]) for r in t}


def test_a_backfill_from_kafka_replaces_exactly_the_range(make_pipeline, broker, spark):
    p = make_pipeline(partitions=2)
    per = produce_clicks(broker, p.topic, 2, 2000, malformed=4)
    run_batch(p.cfg(), session=lambda _: spark)
    before = rows_by_offset(p)

    outcome = reprocess(
        p.cfg(),
        "backfill",
        [OffsetRange(p.topic, 0, 100, 600)],
        "decoder fix",
        session=lambda _: spark,
    )
    assert outcome.status == "backfilled" and outcome.batch == 2 and not outcome.warnings
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)
    after = rows_by_offset(p)
    assert after.keys() == before.keys()
    for key, (batch, event_id) in after.items():
        inside = key[0] == 0 and 100 <= key[1] < 600
        assert batch == (2 if inside else 1), key
        assert event_id == before[key][1]
    [row] = [r for r in read_ledger(p.cfg().places()).to_pylist() if r["batch"] == 2]
    assert (row["kind"], row["note"], row["partition"], row["start_offset"], row["end_offset"]) == (
        "backfill",
        "decoder fix",
        0,
        100,
        600,
    )
    assert row["rows"] + row["quarantined"] + row["gaps"] == 500
    assert ledger_state(p.cfg().places()).committed == {(p.topic, 0): per[0], (p.topic, 1): per[1]}
    assert run_batch(p.cfg(), session=lambda _: spark).status == "idle"


def test_a_range_kafka_no_longer_holds_is_read_from_the_raw_copy(make_pipeline, broker, spark):
    p = make_pipeline(partitions=1)
    per = produce_clicks(broker, p.topic, 1, 1500, malformed=2)
    run_batch(p.cfg(), session=lambda _: spark)
    broker.delete_topic(p.topic)
    broker.create_topic(p.topic, 1)
    # The new topic has grown past the range: by its watermarks Kafka "holds" it, but
    # its offsets are other messages. Its id tells, and the raw copy is read.
    produce_clicks(broker, p.topic, 1, 1300, seed=9)

    outcome = reprocess(
        p.cfg(), "backfill", [OffsetRange(p.topic, 0, 200, 1200)], "replay", session=lambda _: spark
    )
    assert outcome.warnings == [
        f"offsets [200, 1200) of partition 0 of `{p.topic}` are no longer in Kafka; "
        "they were read from the raw copy"
    ]
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)
    batches = {b for (part, off), (b, _) in rows_by_offset(p).items() if 200 <= off < 1200}
    assert batches == {2}


def test_backfills_that_cannot_be_done_say_why_and_change_nothing(make_pipeline, broker, spark):
    p = make_pipeline(partitions=1, overrides={"starting_offsets": "latest"})
    first = produce_clicks(broker, p.topic, 1, 100)
    run_batch(p.cfg(), session=lambda _: spark)  # records where reading starts
    more = produce_clicks(broker, p.topic, 1, 100, seed=4)
    run_batch(p.cfg(), session=lambda _: spark)
    committed = first[0] + more[0]
    broker.delete_topic(p.topic)
    broker.create_topic(p.topic, 1)
    ledger_before = read_ledger(p.cfg().places()).num_rows

    with pytest.raises(
        BackfillError,
        match=r"offsets \[0, 50\) of partition 0 of .* are held by neither Kafka "
        r"\(`.*` was created again since \(id .*, now .*\)\) nor the raw copy",
    ):
        reprocess(
            p.cfg(), "backfill", [OffsetRange(p.topic, 0, 0, 50)], "x", session=lambda _: spark
        )
    with pytest.raises(
        BackfillError, match=rf"has committed offsets below {committed}; only a committed range"
    ):
        reprocess(
            p.cfg(),
            "backfill",
            [OffsetRange(p.topic, 0, 150, committed + 5)],
            "x",
            session=lambda _: spark,
        )
    with pytest.raises(BackfillError, match="not a range"):
        reprocess(p.cfg(), "backfill", [OffsetRange(p.topic, 0, 9, 9)], "x")
    with pytest.raises(BackfillError, match="is not read by pipeline"):
        reprocess(p.cfg(), "backfill", [OffsetRange("other", 0, 0, 9)], "x")
    assert read_ledger(p.cfg().places()).num_rows == ledger_before


def test_a_backfill_killed_midway_finishes_exactly_once_when_run_again(
    make_pipeline, broker, spark
):
    p = make_pipeline(partitions=2)
    per = produce_clicks(broker, p.topic, 2, 1500, malformed=3)
    assert run_batch(p.cfg(), session=lambda _: spark).batch == 1
    args = [
        "backfill",
        "--topic",
        p.topic,
        "--partition",
        "1",
        "--from",
        "10",
        "--to",
        "700",
        "--reason",
        "incident 42",
    ]
    crashed = p.cli(*args, env=p.env(**armed(crash_at=faults.AFTER_QUARANTINE_COMMIT)))
    assert crashed.returncode == -signal.SIGKILL
    again = p.cli(*args, "--json")
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout.strip().splitlines()[-1])
    assert summary["status"] == "backfilled" and summary["batch"] == 2
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)
    assert [r["note"] for r in read_ledger(p.cfg().places()).to_pylist() if r["batch"] == 2] == [
        "incident 42"
    ]


def group_offsets(p) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    cfg = p.cfg()
    consumer = Consumer({"bootstrap.servers": p.bootstrap, "group.id": cfg.group_id})
    try:
        parts = [TopicPartition(p.topic, q) for q in range(2)]
        return {tp.partition: tp.offset for tp in consumer.committed(parts, timeout=10)}
    finally:
        consumer.close()


@pytest.mark.parametrize("kind", ["backfill", "replay"])
def test_an_interrupted_backfill_or_replay_is_finished_as_such_by_the_scheduled_run(
    make_pipeline, broker, spark, kind
):
    # The on-call engineer's backfill dies after its files are written; the next
    # scheduled `strata run` finds its saved plan. It must finish it as a backfill
    # (replacing the range's rows), not append the re-read rows as a new ingest batch
    # and move the committed offsets and the consumer group back.
    p = make_pipeline(partitions=2)
    per = produce_clicks(broker, p.topic, 2, 1500, malformed=3)
    assert run_batch(p.cfg(), session=lambda _: spark).batch == 1
    committed = ledger_state(p.cfg().places()).committed
    assert group_offsets(p) == {q: per[q] for q in range(2)}
    if kind == "backfill":
        args = ["backfill", "--topic", p.topic, "--partition", "1", "--from", "10", "--to", "700"]
    else:
        args = ["replay", "--from-batch", "1"]
    crashed = p.cli(*args, "--reason", "INC-7", env=p.env(**armed(crash_at=faults.AFTER_FILES)))
    assert crashed.returncode == -signal.SIGKILL

    scheduled = p.cli("run", "--json")
    assert scheduled.returncode == 0, scheduled.stderr
    summary = json.loads(scheduled.stdout.strip().splitlines()[-1])
    assert summary["status"] == ("backfilled" if kind == "backfill" else "replayed")
    assert f"batch 2 is a {kind}" in summary["warnings"][0]
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)
    rows = read_ledger(p.cfg().places()).to_pylist()
    assert {r["kind"] for r in rows if r["batch"] == 2} == {kind}
    assert all(r["note"] == "INC-7" for r in rows if r["batch"] == 2)
    assert ledger_state(p.cfg().places()).committed == committed
    assert group_offsets(p) == {q: per[q] for q in range(2)}
    # The schedule goes on from where the ingests ended.
    more = produce_clicks(broker, p.topic, 2, 200, seed=5)
    assert run_batch(p.cfg(), session=lambda _: spark).batch == 3
    total = {q: per[q] + more[q] for q in range(2)}
    assert p.landed() == expected_offsets(total)
