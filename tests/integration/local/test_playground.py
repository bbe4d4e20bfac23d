"""The playground (`strata-local up|events|status|down`): the tour, run as a newcomer runs it,
and the Airflow `up --airflow` starts beside it.

Every command is the installed console script in a process of its own, in a copy of
the project's `conf/` and `schemas/` (so the real `conf/local` is never written), with
the playground's data in a temporary directory and its services on free loopback
ports. Whatever a test starts is stopped at its end, failed or not.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from strata.catalog.metastore import MetastoreClient
from strata.local.playground import AIRFLOW, STATE_FILE, process_command
from tests.conftest import ROOT, without_project_variables

BIN = Path(sys.executable).parent
FREE_PORTS = ["--broker-port", "0", "--metastore-port", "0"]


@dataclass
class Project:
    """A copy of the project's configuration, and the playground's directory beside it."""

    root: Path
    data: Path
    # Every service any `up` reported, to stop whatever `down` did not.
    started: dict[int, str] = field(default_factory=dict)
    # Every command run, as a user types it: the tour in docs/playground.md is checked on it.
    said: list[tuple[str, list[str]]] = field(default_factory=list)

    @property
    def settings(self) -> Path:
        return self.root / "conf" / "local" / "playground.yaml"

    def run(
        self, command: str, *args: str, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        """Run `strata` or `strata-local` in the project, as a user types it."""
        self.said.append(typed(command, list(args)))
        done = subprocess.run(
            [str(BIN / command), *args],
            cwd=self.root,
            capture_output=True,
            text=True,
            env=without_project_variables(os.environ),
            timeout=timeout,
        )
        if command == "strata-local" and args[0] == "up" and done.returncode == 0:
            # Every `up` here asks for the JSON line, which names what runs.
            body = last_json(done)
            self.started.update({s["pid"]: s["command"] for s in body["services"].values()})
        return done

    def local(self, action: str, *args: str) -> subprocess.CompletedProcess[str]:
        """`strata-local ACTION --dir DATA ...`."""
        return self.run("strata-local", action, "--dir", str(self.data), *args)

    def strata(self, action: str, *args: str) -> subprocess.CompletedProcess[str]:
        """`strata ACTION --pipeline clicks ... --json`, in the project's copy of conf/."""
        return self.run("strata", action, "--pipeline", "clicks", *args, "--json")

    def leftovers(self) -> list[int]:
        """The services ever started that still run."""
        return [pid for pid, command in self.started.items() if process_command(pid) == command]


# What only a test adds to a command: its own directory, free ports and machine-readable output.
TEST_ONLY = {
    "--dir": 1,
    "--json": 0,
    "--broker-port": 1,
    "--metastore-port": 1,
    "--airflow-port": 1,
    "--format": 1,
}


def typed(command: str, args: list[str]) -> tuple[str, list[str]]:
    """A command as the docs write it: without the test's own options, in any order."""
    kept: list[str] = []
    rest = iter(args)
    for arg in rest:
        if arg in TEST_ONLY:
            for _ in range(TEST_ONLY[arg]):
                next(rest)
        else:
            kept.append(arg)
    return command, sorted(kept)


def docs_tour() -> list[tuple[str, list[str]]]:
    """The commands of the tour in docs/playground.md, in order."""
    page = (ROOT / "docs" / "playground.md").read_text()
    block = page.split("## The five-minute tour", 1)[1].split("```bash\n", 1)[1].split("```")[0]
    lines = [shlex.split(line, comments=True) for line in block.splitlines()]
    return [typed(words[0], words[1:]) for words in lines if words]


def last_json(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.stdout.strip(), done.stderr[-3000:]
    body: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return body


def ok(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The JSON line of a command that must succeed."""
    assert done.returncode == 0, (
        f"exit {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return last_json(done)


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    root = tmp_path / "project"
    # A developer's own conf/local stays out: the playground's settings must be what counts.
    shutil.copytree(ROOT / "conf", root / "conf", ignore=shutil.ignore_patterns("local"))
    shutil.copytree(ROOT / "schemas", root / "schemas")
    found = Project(root, tmp_path / "playground")
    try:
        yield found
    finally:
        found.local("down")
        for pid in found.leftovers():
            # Each service leads a process group of its own: what it started goes with it.
            os.killpg(pid, signal.SIGKILL)


def test_the_tour_lands_queries_and_outlives_down(project: Project) -> None:
    # up: a broker and a metastore, `clicks` seeded, and the settings for `strata`.
    up = ok(project.local("up", *FREE_PORTS, "--json"))
    assert up["started"] == ["broker", "metastore"]
    seeded = sum(up["seeded"].values())
    assert seeded > 5_000 and up["seeded"]["malformed"] > 0
    settings = yaml.safe_load(project.settings.read_text())
    assert settings["kafka"]["bootstrap_servers"] == up["services"]["broker"]["address"]
    assert settings["metastore"]["uri"] == up["services"]["metastore"]["address"]
    assert Path(settings["warehouse"]).is_relative_to(project.data)
    # up again: nothing new starts, the same processes serve.
    again = ok(project.local("up", "--json"))
    assert again["started"] == [] and again["services"] == up["services"]

    first = ok(project.strata("run"))
    # The seeded events and a sealing message per partition.
    assert (first["batch"], first["messages"]) == (1, seeded + 4)
    assert first["rows"] + first["quarantined"] == seeded + 4 and first["quarantined"] > 0

    more = ok(
        project.local(
            "events", "--count", "1000", "--hours", "2", "--late", "3", "--malformed", "2", "--json"
        )
    )
    assert more["produced"] == {"ok": 1000, "late": 3, "malformed": 2}
    second = ok(project.strata("run"))
    # The new events and their sealing messages.
    assert (second["batch"], second["messages"]) == (2, 1005 + 4)
    assert second["rows"] + second["quarantined"] == 1005 + 4 and second["quarantined"] >= 2

    status = ok(project.strata("status"))
    assert [b["batch"] for b in status["batches"]] == [2, 1]
    assert all(b["kind"] == "ingest" for b in status["batches"])
    assert all(p["lag"] == 0 for p in status["partitions"])
    ledger_rows = sum(b["rows"] for b in status["batches"])

    # Backfill partition 0's range of the first batch: its rows are replaced, not added.
    range0 = next(r for r in first["ranges"] if r["partition"] == 0)
    assert (range0["start"], range0["end"]) == (0, 1259)  # as docs/playground.md's tour has it
    where = f"--topic clicks --partition 0 --from {range0['start']} --to {range0['end']}"
    backfill = ok(project.strata("backfill", *where.split(), "--reason", "playground tour"))
    assert (backfill["batch"], backfill["rows"]) == (3, range0["rows"])

    def rows_per_hour() -> int:
        done = project.strata("sql", "query", "rows_per_hour", "--format", "json")
        assert done.returncode == 0, done.stderr[-3000:]
        # The JSON list is the output; `--json` ends it with the command's body.
        lines = done.stdout.strip().splitlines()
        return sum(row["row_count"] for row in json.loads("\n".join(lines[:-1])))

    assert rows_per_hour() == ledger_rows
    compacted = ok(project.strata("compact"))
    assert any(p["outcome"] == "compacted" for p in compacted["partitions"])
    assert rows_per_hour() == ledger_rows

    # down: every process gone, the settings removed, the data kept.
    down = ok(project.local("down", "--json"))
    assert sorted(down["stopped"]) == ["broker", "metastore"]
    assert project.leftovers() == [] and not project.settings.exists()
    assert ok(project.local("down", "--json"))["stopped"] == []

    # up again: the tables, the ledger and the metastore are still there; the broker's
    # topic is new (it kept its log in memory), and a recorded seek reads it.
    back = project.local("up", *FREE_PORTS, "--json")
    reup = ok(back)
    assert reup["started"] == ["broker", "metastore"]
    assert "strata ledger seek --pipeline clicks --topic clicks --to earliest" in back.stdout
    kept = ok(project.strata("status"))
    assert [b["batch"] for b in kept["batches"]] == [3, 2, 1]
    assert rows_per_hour() == ledger_rows
    with MetastoreClient(reup["services"]["metastore"]["address"], 30) as client:
        table = client.get_table("strata", "clicks")
    # Registered before `down`, in the Derby database that outlived it.
    assert table is not None and str(project.data / "warehouse") in table.sd.location
    seek = "--topic clicks --to earliest --reason".split()
    ok(project.strata("ledger", "seek", *seek, "new playground broker"))
    third = ok(project.strata("run"))
    assert (third["batch"], third["messages"]) == (5, sum(reup["seeded"].values()) + 4)
    assert rows_per_hour() == ledger_rows + third["rows"]

    purged = ok(project.local("down", "--purge", "--json"))
    assert sorted(purged["stopped"]) == ["broker", "metastore"]
    assert project.leftovers() == [] and not project.data.exists()
    # The page's tour is what ran here, command for command.
    assert project.said == docs_tour()


def test_the_playground_says_what_to_do_when_it_is_not_as_expected(project: Project) -> None:
    # Down: status and events name the fix, with the configuration's exit code.
    for action in ("status", "events"):
        done = project.local(action)
        assert done.returncode == 2
        assert f"strata-local up --dir {project.data}" in done.stderr

    # A port something else listens on.
    with socket_listening() as port:
        taken = project.local("up", "--broker-port", str(port), "--metastore-port", "0")
    assert taken.returncode == 2
    assert f"port {port}" in taken.stderr and "--broker-port" in taken.stderr
    assert not (project.data / STATE_FILE).exists() and not project.settings.exists()

    # With the Schema Registry, which the settings point `strata` at too.
    up = ok(project.local("up", *FREE_PORTS, "--registry", "--registry-port", "0", "--json"))
    assert up["started"] == ["broker", "metastore", "schema_registry"]
    registry = up["services"]["schema_registry"]["address"]
    assert yaml.safe_load(project.settings.read_text())["schema_registry"] == {"url": registry}
    with urllib.request.urlopen(f"{registry}/subjects", timeout=10) as answer:
        assert json.load(answer) == []

    # A service that died: status reports it, up starts it again where it was.
    broker = up["services"]["broker"]
    os.kill(broker["pid"], signal.SIGKILL)
    wait_gone(broker["pid"])
    status = project.local("status")
    assert status.returncode == 2
    assert f"broker: down at {broker['address']}" in status.stderr
    assert "metastore: up" in status.stderr
    again = ok(project.local("up", "--json"))
    assert again["started"] == ["broker"]
    assert again["services"]["broker"]["port"] == broker["port"]
    assert again["services"]["metastore"] == up["services"]["metastore"]
    assert again["services"]["schema_registry"] == up["services"]["schema_registry"]
    assert ok(project.local("status", "--json"))["status"] == "up"

    # A recorded pid the system has given to another process is not killed.
    state = json.loads((project.data / STATE_FILE).read_text())
    stranger = subprocess.Popen(["sleep", "300"])
    try:
        state["services"]["broker"]["pid"] = stranger.pid
        (project.data / STATE_FILE).write_text(json.dumps(state))
        down = ok(project.local("down", "--json"))
        assert down["stopped"] == ["metastore", "schema_registry"]
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
    # The real broker, whose record was overwritten above, is the fixture's to stop.
    os.kill(again["services"]["broker"]["pid"], signal.SIGTERM)
    wait_gone(again["services"]["broker"]["pid"])
    assert project.leftovers() == []


def test_airflow_schedules_the_projects_dags_and_goes_down_with_the_playground(
    project: Project,
) -> None:
    # The project's DAG files, as `up --airflow` finds them in the project's root.
    shutil.copytree(ROOT / "airflow_dags", project.root / "airflow_dags")
    with socket_listening() as port:
        taken = project.local("up", *FREE_PORTS, "--airflow", "--airflow-port", str(port))
    assert taken.returncode == 2
    assert f"port {port}" in taken.stderr and "--airflow-port" in taken.stderr
    assert not (project.data / STATE_FILE).exists() and not project.settings.exists()

    done = project.local("up", *FREE_PORTS, "--airflow", "--airflow-port", "0", "--json")
    up = ok(done)
    assert up["started"] == ["broker", "metastore", *AIRFLOW.values()]
    url = up["services"]["airflow_api_server"]["address"]
    assert up["airflow"] == url and f"Airflow's UI: {url}" in done.stdout
    token = get(f"{url}/auth/token")["access_token"]
    # Parsed by the DAG processor, from the project's airflow_dags/ over its conf/.
    dag = wait_for(lambda: get(f"{url}/api/v2/dags/strata_ingest_clicks", token))
    assert dag["is_paused"] is True and "clicks" in {t["name"] for t in dag["tags"]}
    assert get(f"{url}/api/v2/importErrors", token)["total_entries"] == 0
    assert all(s["up"] for s in ok(project.local("status", "--json"))["services"].values())

    # A component killed (the scheduler): status names it, and what it started runs on.
    leaders = [up["services"][name]["pid"] for name in AIRFLOW.values()]
    scheduler = up["services"]["airflow_scheduler"]["pid"]
    # The executor's workers, in the scheduler's group.
    assert [pid for pid, group in in_groups(leaders).items() if group == scheduler != pid]
    os.kill(scheduler, signal.SIGKILL)
    wait_gone(scheduler)
    status = project.local("status")
    assert status.returncode == 2 and f"Airflow scheduler: down (pid {scheduler})" in status.stderr

    # down: every component stopped, and every process they started, the killed one's too.
    stopping = project.local("down", "--json")
    down = ok(stopping)
    assert down["stopped"] == [
        "broker",
        "metastore",
        "airflow_api_server",
        "airflow_dag_processor",
        "airflow_triggerer",
    ]
    assert f"Airflow scheduler (pid {scheduler}) had stopped already" in stopping.stdout
    assert project.leftovers() == [] and in_groups(leaders) == {}
    assert ok(project.local("down", "--json"))["stopped"] == []


def get(url: str, token: str | None = None) -> Any:
    """A JSON answer of Airflow's API server."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
        return json.load(r)


def wait_for(found: Callable[[], Any], timeout: float = 120) -> Any:
    """Poll until `found()` answers (an HTTP 404 is "not yet"); fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return found()
        except urllib.error.HTTPError as err:
            if err.code != 404 or time.monotonic() > deadline:
                raise
        time.sleep(1)


def in_groups(leaders: list[int]) -> dict[int, int]:
    """Every running process of these process groups: pid to group."""
    listed = subprocess.run(
        ["ps", "-e", "-o", "pid=,pgid=,stat="], capture_output=True, text=True, check=True
    )
    rows = [line.split() for line in listed.stdout.splitlines()]
    # A zombie has ended; only its parent has not collected it yet.
    return {int(p): int(g) for p, g, stat in rows if int(g) in leaders and "Z" not in stat}


@contextmanager
def socket_listening() -> Iterator[int]:
    """A loopback port something else listens on, for the block."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield int(listener.getsockname()[1])


def wait_gone(pid: int) -> None:
    """Wait until a process (a child of init now) is gone; its reaping is init's."""
    deadline = time.monotonic() + 30
    while process_command(pid) is not None:
        assert time.monotonic() < deadline, f"pid {pid} still runs"
        time.sleep(0.1)
