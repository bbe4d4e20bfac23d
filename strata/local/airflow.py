"""A local Airflow that schedules the DAGs for real: API server, scheduler, DAG processor.

`airflow standalone` in parts, from the project's own dependencies: the metadata
database is SQLite (as `airflow standalone` uses; production runs PostgreSQL), the
executor is the LocalExecutor (each task a process of its own, supervised, talking to
the API server's execution API), and the API server, the scheduler, the DAG processor
and the triggerer are processes of their own on loopback. The UI needs no login
(Airflow's simple auth manager, every user an admin): it is for a laptop and tests.

Every component runs in a session of its own, so that stopping it stops what it
started (the API server's workers, the executor's worker processes) with it. Detached
(`strata-local up --airflow`), the components outlive the process that started them:
`start` hands them over (`pids`) to whoever records them, and `stop` leaves them be.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from strata.local.processes import process_command, stop_recorded
from strata.local.service import Supervised, free_port

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
# Their log servers would listen on every interface, on fixed ports two Airflows
# collide on; the API server reads the task logs from the shared log folder instead.
_ARGUMENTS = {"scheduler": ["--skip-serve-logs"], "triggerer": ["--skip-serve-logs"]}


class LocalAirflow(Supervised):
    """Airflow's API server, scheduler, DAG processor and triggerer; a context manager.

    Attributes:
        pids: Each component's process id, once `start` has returned.
    """

    def __init__(
        self,
        home: Path,
        dags_folder: Path,
        env: dict[str, str] | None = None,
        port: int | None = None,
        base_env: Mapping[str, str] | None = None,
        *,
        detached: bool = False,
    ) -> None:
        """Choose where Airflow keeps its state, which DAGs it schedules, and the port.

        Args:
            home: `AIRFLOW_HOME`: its configuration, SQLite database and logs.
            dags_folder: The folder of DAG files to parse and schedule.
            env: Variables for every component (and so every task), such as
                `STRATA_CONF_DIR`; over this process's environment.
            port: The API server's (and UI's) port; a free one if None.
            base_env: The environment `env` is laid over; this process's if None.
            detached: Leave the components running once started: they are then the
                caller's to stop, by the pids `start` records. Until `start` returns
                they are this object's, so a start that fails stops what it started.
        """
        self.home = home.resolve()
        self.dags_folder = dags_folder.resolve()
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._extra = dict(env or {})
        self._base = dict(os.environ if base_env is None else base_env)
        self.detached = detached
        self.pids: dict[str, int] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._token: str | None = None

    def environment(self) -> dict[str, str]:
        """The variables every component runs with: one configuration for all of them."""
        home = str(self.home)
        return {
            **self._base,
            "AIRFLOW_HOME": home,
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            # Two cores: more task processes at once would only queue on the CPU.
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            # Every component signs and checks the same tokens: one secret for all.
            "AIRFLOW__API_AUTH__JWT_SECRET": self._secret(),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            # New and changed DAG files are seen within seconds, not minutes.
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5",
            **self._extra,
        }

    def _secret(self) -> str:
        path = self.home / "jwt-secret"
        if not path.exists():
            self.home.mkdir(parents=True, exist_ok=True)
            path.write_text(secrets.token_urlsafe(32))
            path.chmod(0o600)
        return path.read_text()

    def start(self, timeout: float = 180.0) -> Self:
        """Migrate the database, start every component, and wait for the API server."""
        env = self.environment()
        airflow = str(Path(sys.executable).parent / "airflow")
        logs = self.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        try:
            done = subprocess.run(
                [airflow, "db", "migrate"], capture_output=True, text=True, env=env, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"airflow db migrate did not finish within {timeout:.0f}s") from None
        if done.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed:\n{done.stderr[-3000:]}")
        for component in COMPONENTS:
            with (logs / f"{component}.log").open("ab") as log:
                self._procs[component] = subprocess.Popen(
                    [airflow, component, *_ARGUMENTS.get(component, [])],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                )
        deadline = time.monotonic() + timeout
        while not self._healthy():
            for component, proc in self._procs.items():
                if proc.poll() is not None:
                    self._fail(f"airflow {component} exited with {proc.returncode}")
            if time.monotonic() > deadline:
                self._fail(f"the API server did not answer within {timeout:.0f}s")
            time.sleep(0.5)
        self.pids = {component: proc.pid for component, proc in self._procs.items()}
        if self.detached:
            # Handed over: `stop` no longer knows them, whoever recorded `pids` does.
            self._procs = {}
        return self

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=2) as r:
                body = json.loads(r.read())
        except (OSError, ValueError):
            return False
        return bool(body.get("metadatabase", {}).get("status") == "healthy")

    def _fail(self, reason: str) -> None:
        tails = []
        for component in COMPONENTS:
            log = self.home / "logs" / f"{component}.log"
            if log.exists():
                tails.append(f"--- {component}:\n{log.read_text(errors='replace')[-1500:]}")
        self.stop()
        raise RuntimeError(f"{reason}; the logs end with:\n" + "\n".join(tails))

    def log(self, component: str) -> str:
        """What one component has written so far."""
        return (self.home / "logs" / f"{component}.log").read_text(errors="replace")

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:  # noqa: ANN401 - JSON
        """Call Airflow's REST API (`/api/v2/...`) as a user with a token would.

        Args:
            method: `GET`, `POST`, `PATCH`...
            path: The path after `/api/v2/`.
            body: The JSON body, if any.

        Returns:
            The decoded JSON answer (None for an empty one).

        Raises:
            urllib.error.HTTPError: On an error status; its body says why.
        """
        request = urllib.request.Request(
            f"{self.url}/api/v2/{path.lstrip('/')}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token()}"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            data = answer.read()
        return json.loads(data) if data else None

    def token(self) -> str:
        """A token for the REST API (every user is an admin here)."""
        if self._token is None:
            # Without credentials: Airflow gives one only while every user is an admin.
            with urllib.request.urlopen(f"{self.url}/auth/token", timeout=30) as answer:
                self._token = str(json.loads(answer.read())["access_token"])
        return self._token

    def stop(self) -> None:
        """Stop every component and whatever it started: politely, then firmly.

        What they started includes the executor's task processes, each in a process
        group of its own, so the components' groups alone would leave them running.
        """
        procs, self._procs = self._procs, {}
        recorded = [(p.pid, process_command(p.pid)) for p in procs.values()]
        stop_recorded([(pid, command) for pid, command in recorded if command])
        for proc in procs.values():
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass  # the group is gone
