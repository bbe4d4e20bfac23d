"""Backfill and replay triggered through Airflow's REST API, as an operator would from the UI.

Each run is created by `POST /api/v2/dags/{dag_id}/dagRuns` with a typed `conf` and
run by the scheduler's executor in a task process of its own; its summary is read
back as XCom through the API. A bad param is refused: at trigger time by Airflow,
where the params' JSON schema says it (the answer's status and message), or else by
the task, which fails the run at once naming the param, and changes no table.
"""

from __future__ import annotations

import json
import urllib.error
from typing import Any

import pytest

from strata.run import run_batch
from strata.store.ledger import read_ledger
from tests.conftest import Pipeline, expected_offsets, produce_clicks
from tests.integration.scheduler.conftest import FINISHED, Scheduled

BACKFILL = "strata_backfill"
REPLAY = "strata_replay"


def offered(scheduled: Scheduled, dag_id: str, pipeline: str) -> None:
    """Wait until the DAG's `pipeline` param offers this pipeline (the file was parsed
    again after the pipeline was configured), and unpause the DAG."""

    def look() -> bool:
        params = scheduled.api("GET", f"dags/{dag_id}/details")["params"]
        return pipeline in params["pipeline"]["schema"].get("enum", [])

    scheduled.dag(dag_id)
    scheduled.wait(f"{dag_id} to offer pipeline {pipeline}", look)
    scheduled.unpause(dag_id)


def trigger(scheduled: Scheduled, dag_id: str, conf: dict[str, Any]) -> str:
    """Trigger a run with `conf`, as the UI's trigger form does; returns its run id."""
    run = scheduled.api("POST", f"dags/{dag_id}/dagRuns", {"conf": conf, "logical_date": None})
    assert run["conf"] == conf
    return str(run["dag_run_id"])


def refused(scheduled: Scheduled, dag_id: str, conf: dict[str, Any]) -> tuple[int, str]:
    """Trigger a run that Airflow must refuse; returns the answer's status and message."""
    with pytest.raises(urllib.error.HTTPError) as answer:
        scheduled.api("POST", f"dags/{dag_id}/dagRuns", {"conf": conf, "logical_date": None})
    return answer.value.code, json.loads(answer.value.read())["detail"]


def finished(scheduled: Scheduled, dag_id: str, run_id: str) -> dict[str, Any]:
    """The run once it has finished."""

    def look() -> dict[str, Any] | None:
        run = scheduled.api("GET", f"dags/{dag_id}/dagRuns/{run_id}")
        return run if run["state"] in FINISHED else None

    return scheduled.wait(f"run {run_id} of {dag_id} to finish", look)


def task_log(scheduled: Scheduled, dag_id: str, run_id: str, task_id: str) -> str:
    """The task's first (and only) try's log, as the UI shows it."""
    path = f"dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/1?full_content=true"
    return json.dumps(scheduled.api("GET", path)["content"])


def ledger(p: Pipeline) -> list[tuple[Any, ...]]:
    return sorted(
        (r["batch"], r["kind"], r["note"], r["partition"], r["start_offset"], r["end_offset"])
        for r in read_ledger(p.cfg().places()).to_pylist()
    )


def test_a_backfill_triggered_through_the_api_replaces_its_range_exactly_once(
    scheduled, scheduled_pipeline, broker, spark
):
    p = scheduled_pipeline(partitions=1)
    per = produce_clicks(broker, p.topic, 1, 600, malformed=2)
    run_batch(p.cfg(), session=lambda _: spark)
    offered(scheduled, BACKFILL, p.name)
    conf = {
        "pipeline": p.name,
        "topic": p.topic,
        "partition": 0,
        "from_offset": 100,
        "to_offset": 400,
        "reason": "INC-7 decoder fix",
    }

    run_id = trigger(scheduled, BACKFILL, conf)
    run = finished(scheduled, BACKFILL, run_id)
    assert run["state"] == "success", scheduled.tasks(BACKFILL, run_id)
    rows = [r for r in ledger(p) if r[0] == 2]
    assert rows == [(2, "backfill", "INC-7 decoder fix", 0, 100, 400)]
    assert p.landed() == expected_offsets(per)
    shown = scheduled.xcom(BACKFILL, run_id, "backfill")
    assert (shown["status"], shown["batch"], shown["messages"]) == ("backfilled", 2, 300)
    assert [(r["partition"], r["start"], r["end"]) for r in shown["ranges"]] == [(0, 100, 400)]


def test_a_replay_triggered_through_the_api_replays_a_batch_from_the_raw_copy(
    scheduled, scheduled_pipeline, broker, spark
):
    p = scheduled_pipeline(partitions=2)
    per = produce_clicks(broker, p.topic, 2, 300, malformed=2)
    run_batch(p.cfg(), session=lambda _: spark)
    offered(scheduled, REPLAY, p.name)

    run_id = trigger(scheduled, REPLAY, {"pipeline": p.name, "from_batch": 1, "reason": "fix"})
    run = finished(scheduled, REPLAY, run_id)
    assert run["state"] == "success", scheduled.tasks(REPLAY, run_id)
    shown = scheduled.xcom(REPLAY, run_id, "replay")
    assert (shown["status"], shown["batch"]) == ("replayed", 2)
    rows = read_ledger(p.cfg().places()).to_pylist()
    first = [r for r in rows if r["batch"] == 1]
    assert shown["messages"] == sum(per.values())
    assert shown["quarantined"] == sum(r["quarantined"] for r in first) > 0
    assert [r[1:] for r in ledger(p) if r[0] == 2] == [
        ("replay", "fix", q, 0, n) for q, n in sorted(per.items())
    ]
    assert p.landed() == expected_offsets(per)


def test_airflow_refuses_a_trigger_whose_params_break_their_schema(scheduled, scheduled_pipeline):
    p = scheduled_pipeline(partitions=1)
    offered(scheduled, BACKFILL, p.name)
    offered(scheduled, REPLAY, p.name)
    good = {
        "pipeline": p.name,
        "topic": p.topic,
        "partition": 0,
        "from_offset": 0,
        "to_offset": 10,
        "reason": "INC-8",
    }
    before = {dag_id: len(scheduled.runs(dag_id)) for dag_id in (BACKFILL, REPLAY)}
    no_offset = {k: v for k, v in good.items() if k != "to_offset"}
    cases = [
        (BACKFILL, {**good, "partition": "0"}, "param partition: '0' is not of type 'integer'"),
        (BACKFILL, no_offset, "param to_offset: No value passed"),
        (BACKFILL, {**good, "pipeline": "nope"}, "param pipeline: 'nope' is not one of ["),
        (BACKFILL, {**good, "from_offset": -1}, "param from_offset: -1 is less than the minimum"),
        (BACKFILL, {**good, "reason": ""}, "param reason: '' is too short"),
        (REPLAY, {"pipeline": p.name, "from_batch": 1}, "param reason: No value passed"),
        (REPLAY, {"from_batch": 1, "reason": "fix"}, "param pipeline: No value passed"),
        (
            REPLAY,
            {"pipeline": p.name, "from_batch": 0, "reason": "fix"},
            "param from_batch: 0 is less than the minimum of 1",
        ),
    ]
    for dag_id, conf, message in cases:
        status, detail = refused(scheduled, dag_id, conf)
        assert status == 400 and detail.startswith(f"Invalid input for {message}"), detail
    assert {dag_id: len(scheduled.runs(dag_id)) for dag_id in before} == before


def test_the_task_refuses_what_no_schema_can_say_and_changes_nothing(
    scheduled, scheduled_pipeline, broker, spark
):
    p = scheduled_pipeline(partitions=1)
    produce_clicks(broker, p.topic, 1, 200)
    run_batch(p.cfg(), session=lambda _: spark)
    landed, rows = p.landed(), ledger(p)
    committed = max(end for *_, end in rows)
    offered(scheduled, BACKFILL, p.name)
    offered(scheduled, REPLAY, p.name)
    backfill = {"pipeline": p.name, "topic": p.topic, "partition": 0, "reason": "INC-9"}
    replay = {"pipeline": p.name, "reason": "INC-9"}
    cases = [
        (
            BACKFILL,
            {**backfill, "from_offset": 150, "to_offset": 50},
            "to_offset 50 is not above from_offset 150",
        ),
        (
            BACKFILL,
            {**backfill, "from_offset": 150, "to_offset": committed + 1},
            f"partition 0 of `{p.topic}` has committed offsets below {committed}",
        ),
        (REPLAY, {**replay, "from_batch": 1, "to_batches": 3}, "unknown param `to_batches`"),
        (REPLAY, {**replay, "from_batch": 7}, "batches 7 to 7 of pipeline"),
    ]
    runs = [(dag_id, trigger(scheduled, dag_id, conf), message) for dag_id, conf, message in cases]
    for dag_id, run_id, message in runs:
        assert finished(scheduled, dag_id, run_id)["state"] == "failed", message
        task_id = "backfill" if dag_id == BACKFILL else "replay"
        ti = scheduled.tasks(dag_id, run_id)[task_id]
        assert (ti["state"], ti["try_number"]) == ("failed", 1)
        log = task_log(scheduled, dag_id, run_id, task_id)
        # Failed for good: Airflow retries no task that raises this, whatever its retries.
        assert message in log and "AirflowFailException" in log
    assert ledger(p) == rows
    assert p.landed() == landed
