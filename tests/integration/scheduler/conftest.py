"""The scheduler tier: a real Airflow schedules the project's DAGs (marker `scheduler`).

One Airflow for the session (`strata.local.airflow.LocalAirflow`: API server,
scheduler with the LocalExecutor, DAG processor, triggerer; SQLite), its DAG folder
the project's `airflow_dags/` plus this directory's `dags/` (DAGs a user writes
downstream of Strata's Assets), and one configuration directory, `STRATA_CONF_DIR`,
that every test adds its pipeline to: the DAG processor sees a new pipeline's DAG
within seconds. A pipeline's DAGs start paused, as Airflow creates them; a test
unpauses what it schedules, through the REST API, as an operator would. A task whose
heartbeat stops (its worker lost) is failed after `HEARTBEAT_TIMEOUT_S`, not
Airflow's five minutes.
"""

from __future__ import annotations

import os
import shutil
import time
import urllib.error
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from strata.local.airflow import LocalAirflow
from tests.conftest import ROOT, Pipeline, without_project_variables

HERE = Path(__file__).parent
FINISHED = {"success", "failed"}
# A task whose supervisor died with it (its worker lost) is found by its missing
# heartbeat; Airflow's default waits 300 s for it. A live supervisor heartbeats every
# 5 s (`[workers] min_heartbeat_interval`), far inside 30 s.
HEARTBEAT_TIMEOUT_S = 30
HEARTBEAT = {
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S),
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.scheduler)


@dataclass
class Scheduled:
    """The session's Airflow, and the configuration directory its DAGs read."""

    airflow: LocalAirflow
    conf_dir: Path

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:  # noqa: ANN401
        return self.airflow.api(method, path, body)

    def wait(self, what: str, found: Callable[[], Any], timeout: float = 300) -> Any:  # noqa: ANN401
        """Poll until `found()` is truthy; fail naming `what` and the scheduler's log tail."""
        deadline = time.monotonic() + timeout
        while True:
            value = found()
            if value:
                return value
            if time.monotonic() > deadline:
                tail = self.airflow.log("scheduler")[-3000:]
                raise AssertionError(
                    f"waited {timeout:.0f}s for {what}; the scheduler's log ends:\n{tail}"
                )
            time.sleep(2)

    def dag(self, dag_id: str, timeout: float = 120) -> dict[str, Any]:
        """The DAG once the DAG processor has serialized it."""

        def look() -> dict[str, Any] | None:
            try:
                return self.api("GET", f"dags/{dag_id}")
            except urllib.error.HTTPError as err:
                if err.code == 404:
                    return None
                raise

        return self.wait(f"DAG {dag_id} to be parsed", look, timeout)

    def unpause(self, dag_id: str) -> None:
        self.dag(dag_id)
        self.api("PATCH", f"dags/{dag_id}", {"is_paused": False})

    def pause(self, dag_id: str) -> None:
        self.api("PATCH", f"dags/{dag_id}", {"is_paused": True})

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        """The DAG's runs, oldest first."""
        body = self.api("GET", f"dags/{dag_id}/dagRuns?order_by=logical_date&limit=100")
        return sorted(body["dag_runs"], key=lambda r: r["queued_at"] or "")

    def finished_runs(self, dag_id: str, count: int, timeout: float = 600) -> list[dict[str, Any]]:
        """Wait until the DAG has at least `count` runs, all finished; returns them."""

        def look() -> list[dict[str, Any]] | None:
            runs = self.runs(dag_id)
            if len(runs) >= count and all(r["state"] in FINISHED for r in runs):
                return runs
            return None

        return self.wait(f"{count} finished runs of {dag_id}", look, timeout)

    def tasks(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        """The run's task instances by task id."""
        body = self.api("GET", f"dags/{dag_id}/dagRuns/{run_id}/taskInstances")
        return {ti["task_id"]: ti for ti in body["task_instances"]}

    def xcom(self, dag_id: str, run_id: str, task_id: str) -> Any:  # noqa: ANN401
        """A task's return value, as the API server hands it to another process."""
        path = f"dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value"
        return self.api("GET", path + "?deserialize=true")["value"]

    def trigger(self, dag_id: str) -> dict[str, Any]:
        """Queue a run now, as an operator's "Trigger" does; it waits for the run before it."""
        return self.api("POST", f"dags/{dag_id}/dagRuns", {"logical_date": None})

    def tries(self, dag_id: str, run_id: str, task_id: str) -> list[dict[str, Any]]:
        """Every try of one task instance, the first first, as the scheduler recorded them."""
        path = f"dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/tries"
        return sorted(self.api("GET", path)["task_instances"], key=lambda t: t["try_number"])

    def asset_events(self, dag_id: str) -> list[dict[str, Any]]:
        """The Asset events the DAG's tasks emitted, oldest first."""
        path = f"assets/events?source_dag_id={dag_id}&order_by=timestamp&limit=100"
        return self.api("GET", path)["asset_events"]


@pytest.fixture(scope="session")
def scheduled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scheduled]:
    """A real Airflow scheduling this project's DAGs over a configuration directory of its own."""
    root = tmp_path_factory.mktemp("scheduled")
    conf = root / "conf"
    (conf / "pipelines").mkdir(parents=True)
    shutil.copytree(ROOT / "schemas", root / "schemas")
    dags = root / "dags"
    dags.mkdir()
    for source in [
        *sorted((ROOT / "airflow_dags").glob("*.py")),
        *sorted((HERE / "dags").glob("*.py")),
    ]:
        (dags / source.name).symlink_to(source)
    env = {"STRATA_CONF_DIR": str(conf), **HEARTBEAT}
    airflow = LocalAirflow(
        root / "airflow", dags, env, base_env=without_project_variables(os.environ)
    )
    with airflow:
        yield Scheduled(airflow, conf)


@pytest.fixture
def scheduled_pipeline(
    make_pipeline: Callable[..., Pipeline], scheduled: Scheduled
) -> Callable[..., Pipeline]:
    """A pipeline (as `make_pipeline` makes it) in the scheduled Airflow's configuration."""

    def factory(partitions: int = 2, overrides: dict[str, Any] | None = None) -> Pipeline:
        made = make_pipeline(partitions=partitions, overrides=overrides)
        name = f"{made.name}.yaml"
        shutil.move(made.conf_dir / "pipelines" / name, scheduled.conf_dir / "pipelines" / name)
        return replace(made, conf_dir=scheduled.conf_dir)

    return factory
