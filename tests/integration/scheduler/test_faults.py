"""Faults under the real scheduler: a killed task process, a failed quality gate.

`dag.test()` runs every task in the test's process, so it cannot show what the
scheduler makes of a task that dies: here the LocalExecutor runs each task in a
process of its own under a supervisor (one of the executor's worker processes), and
the test kills that process for real, alone or with its supervisor. A failed quality
gate fails a scheduled run; the next run must announce the hours the failed run
completed, once.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
from deltalake import DeltaTable

from strata.local.events import HOUR_MS, Message, produce
from strata.local.kafka import LocalKafka
from strata.store.ledger import read_ledger
from tests.conftest import Pipeline, expected_offsets, produce_clicks
from tests.integration.scheduler.conftest import Scheduled

# One scheduled run, created when the DAG is unpaused, and none after: a test's other
# runs are the ones it triggers, so it knows how many batches there are.
ONCE = "@once"


def ingest_dag(p: Pipeline) -> str:
    return f"strata_ingest_{p.name}"


def states(scheduled: Scheduled, dag_id: str, run_id: str) -> dict[str, str | None]:
    return {task: ti["state"] for task, ti in scheduled.tasks(dag_id, run_id).items()}


def poll(what: str, found: Callable[[], Any], timeout: float, every: float = 0.05) -> Any:  # noqa: ANN401
    """Poll faster than `Scheduled.wait`: a small batch writes its files within seconds."""
    deadline = time.monotonic() + timeout
    while not (value := found()):
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f}s for {what}")
        time.sleep(every)
    return value


def batch_files(p: Pipeline, batch: int) -> list[Path]:
    """The data files any attempt of the batch wrote so far, committed or not."""
    return list(p.warehouse.rglob(f"part-b{batch:010d}-*.parquet"))


def committed_files(p: Pipeline) -> set[str]:
    """The names of the files the data, quarantine and raw tables' logs hold."""
    cfg = p.cfg()
    return {
        Path(uri).name
        for which in ("table", "quarantine", "raw")
        for uri in DeltaTable(cfg.location(which)).file_uris()
    }


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def committed_batches(p: Pipeline) -> set[int]:
    return {row["batch"] for row in read_ledger(p.cfg().places(), ["batch"]).to_pylist()}


@pytest.mark.parametrize(
    "lost",
    [
        # The task process alone, as the OOM killer takes it: its supervisor ends the
        # workload, and the scheduler hears of it from the executor at once.
        "task",
        # Its supervisor (the LocalExecutor's worker) with it, as a lost host takes
        # both: nothing reports, and the scheduler finds the missing heartbeat.
        "worker",
    ],
)
def test_a_task_process_killed_mid_ingest_is_retried_by_the_scheduler_exactly_once(
    scheduled: Scheduled,
    scheduled_pipeline: Callable[..., Pipeline],
    broker: LocalKafka,
    lost: str,
) -> None:
    p = scheduled_pipeline(
        partitions=2,
        overrides={
            "airflow": {"schedule": ONCE, "retry_delay": "1s"},
            # The suite is not what this test is about, and takes seconds.
            "quality": {"gate": "off"},
            # Many small Spark tasks, two at a time: the batch writes its files for
            # seconds before it commits, and the kill lands among them.
            "limits": {"max_offsets_per_task": 20},
        },
    )
    per = produce_clicks(broker, p.topic, 2, 400, malformed=2)
    dag_id = ingest_dag(p)
    scheduled.unpause(dag_id)
    [run] = scheduled.wait("the scheduled run", lambda: scheduled.runs(dag_id), timeout=120)
    run_id = run["dag_run_id"]

    def running_ingest() -> dict[str, Any] | None:
        ti = scheduled.tasks(dag_id, run_id).get("ingest")
        return ti if ti and ti["state"] == "running" and ti["pid"] else None

    # Soon after it starts: its Spark job writes files seconds later, and commits.
    ti = poll("the ingest task to run", running_ingest, timeout=240, every=0.5)
    task = psutil.Process(ti["pid"])
    # The pid the API shows is the task's own process, forked by the LocalExecutor's
    # worker (its supervisor) into a process group of its own, with its Spark JVM.
    assert task.parent().pid != task.pid and os.getpgid(task.pid) == task.pid
    assert "airflow worker -- LocalExecutor" in " ".join(task.parent().cmdline())
    poll("batch 1's first data files", lambda: batch_files(p, 1), timeout=240)
    assert committed_batches(p) == set(), "the kill must land before the batch commits"
    # Past planning, files half written, nothing committed: the task, its JVM and its
    # Python workers die at once; the supervisor first, if it goes too, so that it
    # never sees its task die.
    if lost == "worker":
        task.parent().kill()
    os.killpg(task.pid, signal.SIGKILL)
    poll("the killed task's processes to be gone", lambda: not group_alive(task.pid), timeout=30)
    # What the killed attempt left: files of batch 1 that no commit names.
    strays = {f.name for f in batch_files(p, 1)}

    [run] = scheduled.finished_runs(dag_id, 1, timeout=300)
    assert run["state"] == "success", states(scheduled, dag_id, run_id)
    # A task lost alone: its supervisor saw it die of SIGKILL and ended the workload;
    # the scheduler, told so while the task instance still ran, failed the try. With
    # its worker: nothing told anyone, and the scheduler failed the try when its
    # heartbeat stopped (`HEARTBEAT_TIMEOUT_S`). Either way it retried the task.
    timed_out = scheduled.api("GET", f"eventLogs?dag_id={dag_id}&event=heartbeat%20timeout")
    assert [(e["task_id"], e["try_number"]) for e in timed_out["event_logs"]] == (
        [("ingest", 1)] if lost == "worker" else []
    )
    tries = scheduled.tries(dag_id, run_id, "ingest")
    assert [(t["try_number"], t["state"]) for t in tries] == [(1, "failed"), (2, "success")]
    assert scheduled.tasks(dag_id, run_id)["ingest"]["try_number"] == 2
    # The retry finished the batch the first attempt planned, exactly once.
    assert scheduled.xcom(dag_id, run_id, "plan")["batch"] == 1
    assert scheduled.xcom(dag_id, run_id, "ingest")["batch"] == 1
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)
    # The retry committed its own files, none of the killed attempt's beside them.
    assert strays and strays.isdisjoint(committed_files(p))
    ledger = read_ledger(p.cfg().places()).to_pylist()
    assert sorted(
        (r["batch"], r["partition"], r["start_offset"], r["end_offset"]) for r in ledger
    ) == [(1, q, 0, n) for q, n in sorted(per.items())]


def off_site_click(topic: str, event_ms: int) -> Message:
    """A click whose page is not a path: valid for the schema, failing the page check."""
    record = {
        "event_id": str(uuid.uuid4()),
        "user_id": 1,
        "page": "https://elsewhere.example/",
        "device": "desktop",
        "latency_ms": 20,
        "ts": event_ms,
    }
    return Message(topic.encode(), json.dumps(record).encode(), event_ms, "ok")


def partition_of(hour_ms: int) -> str:
    return datetime.fromtimestamp(hour_ms / 1000, UTC).strftime("dt=%Y-%m-%d/hr=%H")


def test_the_hour_a_run_with_a_failed_gate_completed_is_announced_once_by_the_next_run(
    scheduled: Scheduled, scheduled_pipeline: Callable[..., Pipeline], broker: LocalKafka
) -> None:
    # Recent hours, inside the suite's accepted event times.
    hour = (int(time.time() * 1000) // HOUR_MS - 4) * HOUR_MS
    count = 60
    p = scheduled_pipeline(
        partitions=1,
        overrides={
            "airflow": {"schedule": ONCE, "retry_delay": "1s"},
            "completeness": {"lateness": "30m"},
            # One batch per run of what is produced below, whatever the runs' timing.
            "limits": {"max_offsets_per_partition": count},
            "quality": {
                "gate": "fail",
                "expectations": [
                    {
                        "type": "expect_column_values_to_match_regex",
                        "kwargs": {"column": "page", "regex": "^/"},
                    }
                ],
            },
        },
    )
    # Batch 1: the hour's clicks; it completes nothing yet. Batch 2: clicks two hours
    # later, which complete the hour, and one off-site page that fails batch 2's gate.
    first = produce_clicks(broker, p.topic, 1, count, hours=1, start_ms=hour)
    produce(broker.bootstrap, p.topic, 1, iter([off_site_click(p.topic, hour + 2 * HOUR_MS)]))
    second = produce_clicks(broker, p.topic, 1, count - 1, hours=1, start_ms=hour + 2 * HOUR_MS)
    assert first[0] == second[0] + 1 == count
    dag_id = ingest_dag(p)
    scheduled.unpause(dag_id)
    # Three runs, one at a time (the schedule's and two triggered): batch 1, batch 2
    # (its gate fails), and one with nothing new to read.
    for _ in range(2):
        scheduled.trigger(dag_id)
    runs = sorted(scheduled.finished_runs(dag_id, 3), key=lambda r: r["start_date"])
    run_ids = [r["dag_run_id"] for r in runs]
    shown = {r: states(scheduled, dag_id, r) for r in run_ids}
    assert [r["state"] for r in runs] == ["success", "failed", "success"], shown
    assert [scheduled.xcom(dag_id, r, "plan")["batch"] for r in run_ids] == [1, 2, None]
    # The failed gate is not retried and stops its run before `complete`.
    assert shown[run_ids[1]]["quality_gate"] == "failed", shown
    assert shown[run_ids[1]]["complete"] == "upstream_failed", shown
    assert scheduled.tasks(dag_id, run_ids[1])["quality_gate"]["try_number"] == 1
    assert [shown[r]["complete"] for r in run_ids] == ["skipped", "upstream_failed", "success"]
    # The hour batch 2 completed is announced by the run after it, once.
    events = scheduled.asset_events(dag_id)
    assert [(e["uri"], e["source_run_id"], e["extra"]["batch"]) for e in events] == [
        (f"strata://{p.name}/{p.name}", run_ids[2], 2)
    ]
    announced = Counter(h for e in events for h in e["extra"]["completed"])
    assert announced == Counter({partition_of(hour): 1})
    # Quality never loses data: both batches are committed, each once.
    assert p.landed() == expected_offsets({0: first[0] + 1 + second[0]})
    assert committed_batches(p) == {1, 2}
