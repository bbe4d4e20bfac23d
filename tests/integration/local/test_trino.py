"""The local Trino: on loopback only, answering queries, and reading what Strata landed.

One server serves the module (the session's `trino`, on the session's metastore); the
playground's test starts one of its own through `strata-local up --trino`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest
import yaml
from trino.exceptions import TrinoUserError

from strata.local.processes import process_command
from strata.local.service import port_open
from strata.local.trino import LOOPBACK, LocalTrino
from strata.run import run_batch
from tests.conftest import ROOT, produce_clicks, without_project_variables

BIN = Path(sys.executable).parent


def _listening(pid: int) -> set[tuple[str, int]]:
    return {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.Process(pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    }


def test_trino_listens_on_loopback_only_and_answers_through_its_http_api(trino: LocalTrino):
    assert trino.pid is not None
    # Its HTTP port and nothing else, on loopback: by default Trino binds every interface.
    assert _listening(trino.pid) == {(LOOPBACK, trino.port)}
    assert trino.url == f"http://{LOOPBACK}:{trino.port}"
    assert trino.query("SELECT 1") == [(1,)]
    # And the same three on a metastore of Trino's own, for the session's tests.
    assert sorted(trino.query("SHOW CATALOGS")) == [
        ("delta",),
        ("delta_elsewhere",),
        ("hive",),
        ("hive_elsewhere",),
        ("iceberg",),
        ("iceberg_elsewhere",),
        ("system",),
    ]
    # Its configuration, data and log in the directory it was given.
    assert "SERVER STARTED" in trino.log_path.read_text()
    assert trino.log_path == trino.directory / "server.log"
    assert (trino.directory / "etc" / "catalog" / "delta.properties").is_file()


def _ddl(p) -> list[str]:
    """The statements `strata sql ddl` prints, without their comments."""
    done = p.cli("sql", "ddl")
    assert done.returncode == 0, done.stderr[-3000:]
    statements = []
    for paragraph in done.stdout.split(";\n"):
        kept = [line for line in paragraph.splitlines() if not line.startswith("--")]
        if "\n".join(kept).strip():
            statements.append("\n".join(kept).strip())
    return statements


def test_a_delta_table_strata_registered_reads_in_trino_with_every_row_that_landed(
    trino: LocalTrino, make_pipeline, broker, metastore, spark
):
    database = "trino_" + uuid.uuid4().hex[:6]
    p = make_pipeline(
        partitions=2, overrides={"metastore": {"uri": metastore.uri, "database": database}}
    )
    produce_clicks(broker, p.topic, 2, 300, malformed=5)
    outcome = run_batch(p.cfg(), session=lambda _: spark)
    assert outcome.register_error is None
    landed = p.table_rows("table", ["_partition", "_offset"])
    assert landed.num_rows > 0

    # The metastore's entry is all Trino's Delta catalog needs: no statement first.
    count = f"SELECT count(*), count(DISTINCT (_partition, _offset)) FROM {database}.{p.name}"
    assert trino.query(count, catalog="delta") == [(landed.num_rows, landed.num_rows)]
    # The Hive catalog hands the Delta table to the Delta catalog, as it would not alone.
    assert trino.query(count, catalog="hive") == [(landed.num_rows, landed.num_rows)]

    # What `strata sql ddl` prints runs; on the metastore Strata registers in, the table
    # is registered already, so the calls are printed as comments, which Trino refuses.
    done = p.cli("sql", "ddl")
    assert done.returncode == 0, done.stderr[-3000:]
    [create] = _ddl(p)
    assert create == f'CREATE SCHEMA IF NOT EXISTS "delta"."{database}"'
    trino.query(create)
    data = next(
        line.removeprefix("-- ").rstrip(";")
        for line in done.stdout.splitlines()
        if line.startswith("-- CALL") and f"table_name => '{p.name}'" in line
    )
    with pytest.raises(TrinoUserError, match="already exists"):
        trino.query(data)
    # The procedure itself is enabled: the same location under another name reads alike.
    assert f"table_location => 'file://{p.cfg().location('table')}'" in data
    trino.query(data.replace(f"table_name => '{p.name}'", f"table_name => '{p.name}_again'"))
    again = count.replace(f".{p.name}", f".{p.name}_again")
    assert trino.query(again, catalog="delta") == [(landed.num_rows, landed.num_rows)]


@pytest.fixture
def project(tmp_path: Path):
    """A copy of the project's conf/ and schemas/ with a playground directory beside it;
    whatever `up` started is stopped at the end, failed or not."""
    root = tmp_path / "project"
    shutil.copytree(ROOT / "conf", root / "conf", ignore=shutil.ignore_patterns("local"))
    shutil.copytree(ROOT / "schemas", root / "schemas")
    data = tmp_path / "playground"
    started: dict[int, str] = {}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(BIN / args[0]), *args[1:]],
            cwd=root,
            capture_output=True,
            text=True,
            env=without_project_variables(os.environ),
            timeout=900,
        )
        if args[:2] == ("strata-local", "up") and done.returncode == 0:
            body = json.loads(done.stdout.strip().splitlines()[-1])
            started.update({s["pid"]: s["command"] for s in body["services"].values()})
        return done

    try:
        yield root, data, run
    finally:
        run("strata-local", "down", "--dir", str(data))
        for pid, command in started.items():
            if process_command(pid) == command:
                os.killpg(pid, signal.SIGKILL)


def _ok(done: subprocess.CompletedProcess[str]) -> dict:
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_playground_with_trino_answers_strata_sql_query_and_goes_down_with_it(project):
    root, data, run = project
    where = ("--dir", str(data))
    ports = ("--broker-port", "0", "--metastore-port", "0", "--trino-port", "0")
    done = run("strata-local", "up", *where, *ports, "--trino", "--json")
    up = _ok(done)
    assert up["started"] == ["broker", "metastore", "trino"]
    trino = up["services"]["trino"]
    url = f"http://{LOOPBACK}:{trino['port']}"
    assert trino["address"] == up["trino"] == url and f"Trino: {url}" in done.stdout
    settings = yaml.safe_load((root / "conf" / "local" / "playground.yaml").read_text())
    assert settings["trino"] == {"url": url}
    assert _listening(trino["pid"]) == {(LOOPBACK, trino["port"])}

    landed = _ok(run("strata", "run", "--pipeline", "clicks", "--json"))
    assert landed["rows"] > 0
    # Through Trino, as the settings now say, with no option.
    answer = run(
        "strata", "sql", "query", "--pipeline", "clicks", "--format", "json", "--json",
        "--execute", "SELECT count(*) AS n FROM clicks",
    )  # fmt: skip
    assert answer.returncode == 0, answer.stderr[-3000:]
    rows = json.loads("\n".join(answer.stdout.strip().splitlines()[:-1]))
    assert rows == [{"n": landed["rows"]}]
    assert json.loads(answer.stdout.strip().splitlines()[-1])["engine"] == "trino"

    status = _ok(run("strata-local", "status", *where, "--json"))
    assert status["trino"] == url and status["services"]["trino"]["up"]
    down = _ok(run("strata-local", "down", *where, "--json"))
    assert sorted(down["stopped"]) == ["broker", "metastore", "trino"]
    assert process_command(trino["pid"]) is None and not port_open(trino["port"])
