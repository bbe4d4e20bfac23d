"""Which topics a pipeline reads, and where a topic new to it starts: through Apache Kafka.

A starting moment is resolved by Kafka (`offsets_for_times`: the first offset whose
timestamp is at or after it); how an answer lands a partition's start, the log moving
between requests included, is decided on literal offsets in tests/unit/test_plan.py.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
import yaml

from strata.edge import status_settings
from strata.errors import KafkaUnavailable
from strata.local.events import click_events
from strata.operations.status import pipeline_status
from strata.run import run_batch
from strata.store.ledger import read_ledger
from tests.conftest import START_MS, expected_offsets, produce_clicks


def _use_pattern(p, pattern: str, **extra: object) -> None:
    path = p.conf_dir / "pipelines" / f"{p.name}.yaml"
    body = yaml.safe_load(path.read_text())
    body.pop("topics")
    body.update(topics_pattern=pattern, **extra)
    path.write_text(yaml.safe_dump(body))


def _landed_by_topic(p) -> Counter[tuple[str, int, int]]:
    counts: Counter[tuple[str, int, int]] = Counter()
    for which in ("table", "quarantine"):
        t = p.table_rows(which, ["_topic", "_partition", "_offset"])
        counts.update(
            zip(
                t.column("_topic").to_pylist(),
                t.column("_partition").to_pylist(),
                t.column("_offset").to_pylist(),
                strict=True,
            )
        )
    return counts


def test_a_pattern_reads_a_topic_created_between_runs_and_reports_one_deleted(
    make_pipeline, broker, spark
):
    p = make_pipeline(partitions=2)
    views = f"{p.topic}.views"
    # The pattern matches the pipeline's topic and its `.`-suffixed siblings only, so the
    # other tests' topics on the same broker stay out.
    _use_pattern(p, rf"{re.escape(p.topic)}(\..+)?")
    first = produce_clicks(broker, p.topic, 2, 40)
    outcome = run_batch(p.cfg(), session=lambda _: spark)
    assert outcome.status == "committed"
    assert {r.topic for r in outcome.ranges} == {p.topic}

    broker.create_topic(views, 1)
    later = produce_clicks(broker, views, 1, 25)
    outcome = run_batch(p.cfg(), session=lambda _: spark)
    assert outcome.status == "committed" and outcome.new_partitions == [(views, 0)]
    expected = Counter({(p.topic, q, o): 1 for q, n in first.items() for o in range(n)})
    expected.update({(views, 0, o): 1 for o in range(later[0])})
    assert _landed_by_topic(p) == expected
    ledger = read_ledger(p.cfg().places()).to_pylist()
    began = [r for r in ledger if r["topic"] == views]
    assert [(r["start_offset"], r["end_offset"], r["note"]) for r in began] == [
        (0, later[0], "began at offset 0: starting_offsets earliest: the log start")
    ]

    # The matched topic is deleted: the next runs report it and go on with the rest.
    broker.delete_topic(views)
    more = produce_clicks(broker, p.topic, 2, 10, seed=11)
    outcome = run_batch(p.cfg(), session=lambda _: spark)
    assert outcome.status == "committed"
    assert {r.topic for r in outcome.ranges} == {p.topic}
    assert any(f"topic `{views}` matched topics_pattern" in w for w in outcome.warnings)
    for q, n in more.items():
        expected.update({(p.topic, q, o): 1 for o in range(first[q], first[q] + n)})
    assert _landed_by_topic(p) == expected
    status = pipeline_status(p.cfg().places(), status_settings(p.cfg()))
    assert any(f"`{views}`" in w and "no longer list it" in w for w in status["warnings"])
    assert run_batch(p.cfg(), session=lambda _: spark).status == "idle"

    # Created again and grown past its committed offset: the batch committed while it
    # was gone vouched only for the topics it read, so the ledger still knows the old
    # log's id, and the new log is not read from the old offset (its first 26 skipped).
    broker.create_topic(views, 1)
    again = produce_clicks(broker, views, 1, 60, seed=12)
    stopped = p.cli("run")
    assert stopped.returncode == 1 and f"topic `{views}` (id " in stopped.stderr, stopped.stderr
    assert (
        p.cli("ledger", "seek", "--topic", views, "--to", "earliest", "--reason", "x").returncode
        == 0
    )
    assert run_batch(p.cfg(), session=lambda _: spark).status == "committed"
    read = sorted(
        (r["batch"], r["kind"], r["start_offset"], r["end_offset"])
        for r in read_ledger(p.cfg().places()).to_pylist()
        if r["topic"] == views
    )
    assert read[-2:] == [(read[-2][0], "seek", 0, 0), (read[-2][0] + 1, "ingest", 0, again[0])]


def test_a_topic_listed_by_name_that_vanishes_still_stops_the_plan(make_pipeline, broker, spark):
    # Only a pattern's topics may come and go: a listed topic that disappears is the
    # wrong cluster or an accident, and nothing is read.
    p = make_pipeline(partitions=1)
    produce_clicks(broker, p.topic, 1, 5)
    assert run_batch(p.cfg(), session=lambda _: spark).status == "committed"
    broker.delete_topic(p.topic)
    with pytest.raises(KafkaUnavailable, match=rf"topic `{re.escape(p.topic)}` is not available"):
        run_batch(p.cfg(), session=lambda _: spark)


def test_a_starting_moment_is_resolved_by_the_brokers_and_noted_in_the_ledger(
    make_pipeline, broker, spark
):
    # 30 events over three hours from 10:00: the moment 11:30 falls inside each partition.
    moment = START_MS + 90 * 60_000
    p = make_pipeline(partitions=2, overrides={"starting_offsets": "2025-11-22T11:30:00Z"})
    produced = produce_clicks(broker, p.topic, 2, 30)
    # Kafka's answer: each partition's first offset whose timestamp is at or after it.
    stamps: dict[int, list[int]] = {0: [], 1: []}
    for i, m in enumerate(click_events(30, START_MS, 3, seed=7)):
        stamps[i % 2].append(m.timestamp_ms)
    first = {q: next(o for o, ts in enumerate(stamps[q]) if ts >= moment) for q in (0, 1)}
    assert 0 < first[0] < produced[0] and 0 < first[1] < produced[1]

    outcome = run_batch(p.cfg(), session=lambda _: spark)
    assert outcome.status == "committed"
    ledger = sorted(read_ledger(p.cfg().places()).to_pylist(), key=lambda r: r["partition"])
    assert [(r["partition"], r["start_offset"], r["end_offset"]) for r in ledger] == [
        (q, first[q], produced[q]) for q in range(2)
    ]
    assert {r["note"] for r in ledger} == {
        f"began at offset {first[q]}: starting_offsets 2025-11-22T11:30:00.000+00:00: the "
        "first message at or after it"
        for q in range(2)
    }
    assert p.landed() == expected_offsets(produced, first)
