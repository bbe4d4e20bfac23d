"""The ingest DAG on its schedule, run by a real scheduler, and what its Asset drives.

`dag.test()` (tests/integration/test_airflow.py) runs one run of a DAG, whatever its
schedule, every task in the test's own process; the Asset events it records start
no other DAG. Here the scheduler creates the runs from the DAG's timetable, the
LocalExecutor runs each task as a process of its own, XCom and Asset events go
through the API server, and a DAG downstream of the table's Asset
(dags/hourly_report.py, written as the docs tell users to) is started by the
scheduler from the event alone.
"""

from __future__ import annotations

import os
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from strata.catalog.completeness import completeness
from strata.local.events import HOUR_MS
from strata.store.ledger import read_ledger
from tests.conftest import START_MS, expected_offsets, produce_clicks
from tests.integration.quality.test_quality import CHROMIUM, chromium

pytestmark = pytest.mark.integration

TASKS = ("plan", "ingest", "register", "quality_gate", "complete")
# Runs start at least this far apart: under the minute a cron expression allows.
EVERY = timedelta(seconds=20)
# The check mark the UI's grid draws in the cell of a task instance that succeeded.
TICK = '<path d="M20 6 9 17l-5-5"></path>'


def _when(moment: str) -> datetime:
    return datetime.fromisoformat(moment.replace("Z", "+00:00"))


def _ranges(rows: list[dict[str, Any]]) -> list[tuple[int, int, int]]:
    return sorted((r["partition"], r["start_offset"], r["end_offset"]) for r in rows)


def _first_run_planned(scheduled, dag_id: str) -> dict[str, Any] | None:
    """The DAG's first run, once its `plan` task has succeeded."""
    runs = scheduled.runs(dag_id)
    if not runs:
        return None
    plan = scheduled.tasks(dag_id, runs[0]["dag_run_id"]).get("plan")
    return runs[0] if plan and plan["state"] == "success" else None


def _first_finished(scheduled, dag_id: str, count: int) -> list[dict[str, Any]] | None:
    """The DAG's first `count` runs, once they have all finished (later ones aside)."""
    runs = scheduled.runs(dag_id)[:count]
    if len(runs) == count and all(r["state"] in ("success", "failed") for r in runs):
        return runs
    return None


def _warnings(scheduled, dag_id: str) -> list[str]:
    """What Airflow warns of about the DAG (an Asset conflict among them)."""
    found = scheduled.api("GET", f"dagWarnings?dag_id={dag_id}")["dag_warnings"]
    return [f"{w['warning_type']}: {w['message']}" for w in found]


def _grid_screenshot(scheduled, dag_id: str, folder: Path) -> tuple[Path, str]:
    """The DAG's page in Airflow's UI (its grid of runs and tasks): a PNG and the DOM.

    The UI is a single-page app drawn from the REST API: Chromium is given virtual time
    to fetch and draw it. It enters through the simple auth manager's login for
    all-admins, which sets the UI's token cookie and redirects to the page.
    """
    assert os.path.exists(CHROMIUM), "`make test` installs Debian's chromium (make chromium)"
    page = f"{scheduled.airflow.url}/auth/token/login?next=/dags/{dag_id}"

    def shown(*args: str) -> str:
        done = chromium(
            "--window-size=1600,1000", "--virtual-time-budget=15000", *args, page, cwd=folder
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    shot = folder / "grid.png"
    shown(f"--screenshot={shot}")
    dom = shown("--dump-dom")
    (folder / "grid.html").write_text(dom)
    return shot, dom


def test_the_scheduler_runs_the_ingest_dag_every_20s_and_its_asset_starts_the_report(
    scheduled, scheduled_pipeline, broker, tmp_path
):
    p = scheduled_pipeline(partitions=2, overrides={"airflow": {"schedule": "20s"}})
    dag_id, report_id = f"strata_ingest_{p.name}", f"hourly_report_{p.name}"
    # Three hours of events: the first batch completes the first hour (lateness 1h).
    first = produce_clicks(broker, p.topic, 2, 60)
    scheduled.unpause(report_id)
    scheduled.unpause(dag_id)

    # Whatever is produced once the first run has planned is the next run's batch:
    # events of the last hour only, which the watermark has reached, so it completes none.
    scheduled.wait("the first run's plan", lambda: _first_run_planned(scheduled, dag_id))
    second = produce_clicks(
        broker, p.topic, 2, 20, start_ms=START_MS + 2 * HOUR_MS, hours=1, seed=3
    )
    one, two = scheduled.wait(
        "the first two runs to finish", lambda: _first_finished(scheduled, dag_id, 2)
    )
    # No more runs: the next one would find nothing new. (One the scheduler created
    # since stays where it is, as does every run of a paused DAG.)
    scheduled.pause(dag_id)

    # The scheduler made both runs from the timetable, at least the schedule apart.
    assert [r["run_type"] for r in (one, two)] == ["scheduled", "scheduled"]
    assert [r["state"] for r in (one, two)] == ["success", "success"]
    assert _when(two["run_after"]) - _when(one["run_after"]) >= EVERY

    # Two batches, each offset landed exactly once.
    both = {q: first[q] + second[q] for q in first}
    assert p.landed() == expected_offsets(both)
    ledger = read_ledger(p.cfg().places()).to_pylist()
    assert _ranges([r for r in ledger if r["batch"] == 1]) == [
        (q, 0, n) for q, n in sorted(first.items())
    ]
    assert _ranges([r for r in ledger if r["batch"] == 2]) == [
        (q, first[q], both[q]) for q in sorted(first)
    ]

    for batch, run in ((1, one), (2, two)):
        tasks = scheduled.tasks(dag_id, run["dag_run_id"])
        # Each task ran as a process of its own: not the test's, not another task's.
        pids = [tasks[t]["pid"] for t in TASKS]
        assert all(isinstance(pid, int) for pid in pids), tasks
        assert len(set(pids)) == len(pids) and os.getpid() not in pids

        # What crossed the process boundaries through XCom: the plan to `quality_gate`
        # and `complete`, the summary of the batch as the ledger recorded it.
        xcom = {t: scheduled.xcom(dag_id, run["dag_run_id"], t) for t in TASKS[:4]}
        recorded = [r for r in ledger if r["batch"] == batch]
        assert xcom["plan"]["batch"] == batch
        assert xcom["ingest"]["batch"] == batch
        assert sorted((r["partition"], r["start"], r["end"]) for r in xcom["ingest"]["ranges"]) == (
            _ranges(recorded)
        )
        assert xcom["ingest"]["messages"] == sum(r["messages"] for r in recorded)
        assert xcom["quality_gate"]["batch"] == batch

    # The first batch completed the first hour: `complete` emitted the Asset's event ...
    cfg = p.cfg()
    found = completeness(
        cfg.places(), cfg.completeness, cfg.partitioning, cfg.quality.gate, cfg.asset_uri
    )
    by_batch = {
        b: sorted(s.partition for s in found.partitions if s.completed_batch == b) for b in (1, 2)
    }
    assert by_batch[1] and not by_batch[2], found
    assert scheduled.tasks(dag_id, one["dag_run_id"])["complete"]["state"] == "success"
    completed = scheduled.xcom(dag_id, one["dag_run_id"], "complete")
    assert (completed["batch"], completed["completed"]) == (1, by_batch[1])
    # ... and the second, which completed none, emitted none: its `complete` was skipped.
    assert scheduled.tasks(dag_id, two["dag_run_id"])["complete"]["state"] == "skipped"

    # The scheduler started the report once, from that event, with its `extra`.
    try:
        reports = scheduled.finished_runs(report_id, 1, timeout=180)
    except AssertionError as exc:
        # An Asset the report names differently (by name or URI) than the ingest DAG
        # does is a warning on the report's DAG, and no run: say so.
        raise AssertionError(f"{_warnings(scheduled, report_id)}\n{exc}") from None
    assert [(r["run_type"], r["state"]) for r in reports] == [("asset_triggered", "success")]
    extras = scheduled.xcom(report_id, reports[0]["dag_run_id"], "report")
    watermark = next(s.watermark for s in found.partitions if s.completed_batch == 1)
    assert [(e["batch"], e["completed"], e["watermark"]) for e in extras] == [
        (1, by_batch[1], watermark)
    ]
    events = scheduled.api("GET", f"assets/events?source_dag_id={dag_id}")["asset_events"]
    assert [
        (e["source_run_id"], e["uri"], [r["run_id"] for r in e["created_dagruns"]]) for e in events
    ] == [(one["dag_run_id"], cfg.asset_uri, [reports[0]["dag_run_id"]])]
    assert _warnings(scheduled, dag_id) == _warnings(scheduled, report_id) == []

    # The UI's grid of the two runs, kept beside the test's files: a cell per run and
    # task, linking to the task instance, with Airflow's tick where it succeeded.
    shot, dom = _grid_screenshot(scheduled, dag_id, tmp_path)
    assert shot.stat().st_size > 10_000
    for run in (one, two):
        for task_id, ti in scheduled.tasks(dag_id, run["dag_run_id"]).items():
            cell = re.search(
                f'<a data-testid="grid-{re.escape(run["dag_run_id"])}-{task_id}".*?</a>', dom
            )
            assert cell, (run["dag_run_id"], task_id)
            assert (TICK in cell.group()) == (ti["state"] == "success"), (task_id, ti["state"])
