"""The DAGs: they import cleanly and cheaply, with no broker or Spark.

Real `dag.test()` runs are in tests/integration/test_airflow.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

DAGS = ROOT / "airflow_dags"


def load_dags(conf_dir: Path | str, folder: Path = DAGS):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(folder))
    assert bag.import_errors == {}
    return bag


def test_the_dag_folder_imports_without_errors(monkeypatch):
    monkeypatch.setenv("STRATA_CONF_DIR", str(ROOT / "conf"))
    bag = load_dags(ROOT / "conf")
    assert sorted(bag.dag_ids) == [
        "strata_backfill",
        "strata_ingest_clicks",
        "strata_maintenance",
        "strata_replay",
    ]
    dag = bag.dags.__getitem__("strata_ingest_clicks")
    assert [t.task_id for t in dag.topological_sort()] == [
        "plan",
        "ingest",
        "register",
        "quality_gate",
        "complete",
    ]
    assert [a.uri for a in dag.get_task("complete").outlets] == ["strata://clicks/clicks"]
    assert dag.max_active_runs == 1 and dag.catchup is False and "strata" in dag.tags
    assert dag.doc_md and dag.default_args["retries"] == 2


def test_dag_files_are_airflow3_clean_and_cheap_to_import():
    lint = subprocess.run(
        [str(Path(sys.executable).parent / "ruff"), "check", "--select", "AIR3", str(DAGS)],
        capture_output=True,
        text=True,
    )
    assert lint.returncode == 0, lint.stdout
    probe = (
        "import runpy, sys\n"
        f"for f in {[str(p) for p in sorted(DAGS.glob('*.py'))]!r}: runpy.run_path(f)\n"
        "heavy = ('pyspark', 'confluent_kafka', 'deltalake', 'pyarrow')\n"
        "heavy = [m for m in heavy if m in sys.modules]\n"
        "print(heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_replay_dag_takes_typed_params_naming_the_pipelines(monkeypatch):
    from airflow.sdk.definitions.param import ParamValidationError

    monkeypatch.setenv("STRATA_CONF_DIR", str(ROOT / "conf"))
    params = load_dags(ROOT / "conf").dags["strata_replay"].params
    assert params.get_param("pipeline").schema["enum"] == ["clicks"]
    assert params.get_param("from_batch").resolve(3) == 3
    for name, bad in [("from_batch", 0), ("from_batch", "3"), ("partition", -1), ("reason", "")]:
        with pytest.raises(ParamValidationError):
            params.get_param(name).resolve(bad)


def test_the_maintenance_dag_registers_before_vacuum(monkeypatch):
    monkeypatch.setenv("STRATA_CONF_DIR", str(ROOT / "conf"))
    dag = load_dags(ROOT / "conf").dags["strata_maintenance"]
    assert [t.task_id for t in dag.topological_sort()] == [
        "compact_clicks",
        "register_clicks",
        "checkpoint_clicks",
        "vacuum_clicks",
    ]


def a_deployment_with_a_malformed_pipeline(tmp_path: Path) -> tuple[Path, Path]:
    """A configuration with pipelines `good` and `bad` (a misspelt key), and a DAGs
    folder holding every DAG file and the ingest file once per pipeline (a copy and a
    symlink): (conf dir, DAGs folder)."""
    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    shutil.copytree(ROOT / "schemas", tmp_path / "schemas")
    clicks = (ROOT / "conf" / "pipelines" / "clicks.yaml").read_text()
    (conf / "pipelines" / "good.yaml").write_text(clicks)
    (conf / "pipelines" / "bad.yaml").write_text(clicks.replace("limits:", "limts:"))
    folder = tmp_path / "dags"
    folder.mkdir()
    for dag_file in DAGS.glob("*.py"):
        shutil.copy(dag_file, folder)
    shutil.copy(DAGS / "strata_ingest.py", folder / "strata_ingest_good.py")
    (folder / "strata_ingest_bad.py").symlink_to(folder / "strata_ingest.py")
    return conf, folder


def test_a_malformed_pipeline_file_fails_only_its_own_dag_file(tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    conf, folder = a_deployment_with_a_malformed_pipeline(tmp_path)
    monkeypatch.setenv("STRATA_CONF_DIR", str(conf))
    bag = DagBag(dag_folder=str(folder))
    assert sorted(bag.dag_ids) == [
        "strata_backfill",
        "strata_ingest_good",
        "strata_maintenance",
        "strata_replay",
    ]
    assert sorted(bag.import_errors) == [
        str(folder / "strata_config_errors.py"),
        str(folder / "strata_ingest_bad.py"),
    ]
    for error in bag.import_errors.values():
        assert f"{conf / 'pipelines' / 'bad.yaml'}: key `limts`" in error
        assert "remove it or check its spelling" in error


def test_with_no_file_per_pipeline_a_malformed_one_is_left_out_and_named(tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    conf, folder = a_deployment_with_a_malformed_pipeline(tmp_path)
    for own in ("strata_ingest_good.py", "strata_ingest_bad.py"):
        (folder / own).unlink()
    monkeypatch.setenv("STRATA_CONF_DIR", str(conf))
    bag = DagBag(dag_folder=str(folder))
    # The shared ingest file still loads the good pipeline's DAG ...
    assert "strata_ingest_good" in bag.dag_ids and "strata_ingest_bad" not in bag.dag_ids
    # ... and the one import error, of the configuration check, names the bad file.
    assert list(bag.import_errors) == [str(folder / "strata_config_errors.py")]
    error = bag.import_errors[str(folder / "strata_config_errors.py")]
    assert "pipeline bad: " in error and f"{conf / 'pipelines' / 'bad.yaml'}: key `limts`" in error


def test_through_a_trino_connection_registration_signs_in_over_https_as_the_connection_says(
    tmp_path, monkeypatch, caplog
):
    # What the session's real Trino (plain http, no sign-in) cannot show: the connection's
    # password sent as basic auth, over https checked against the connection's `verify`,
    # and kept out of the task's XCom and log. The statements running in Trino itself are
    # tests/integration/test_dags.py's and test_iceberg.py's.
    import base64
    import json

    from strata.catalog.sql import trino_statements
    from strata.config import load_pipeline
    from strata.orchestrate import register_task
    from tests.fake_trino import FakeTrino, self_signed_certificate

    password = "conn-pw-Vb81"
    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    shutil.copytree(ROOT / "schemas", tmp_path / "schemas")
    clicks = (ROOT / "conf" / "pipelines" / "clicks.yaml").read_text()
    extra = "table_format: parquet\nairflow: {trino_conn_id: lake_trino}\n"
    (conf / "pipelines" / "clicks.yaml").write_text(clicks + extra)
    cert, key = self_signed_certificate(tmp_path)
    # requests lets these win over a connection's own `verify`; a worker must not set them.
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    with FakeTrino((cert, key)) as fake:
        connection = {
            "conn_type": "trino",
            "host": "127.0.0.1",
            "port": fake.port,
            "login": "etl",
            "password": password,
            "extra": {"protocol": "https", "verify": str(cert)},
        }
        monkeypatch.setenv("AIRFLOW_CONN_LAKE_TRINO", json.dumps(connection))
        shown = register_task("clicks", str(conf))
    cfg = load_pipeline("clicks", conf)
    wanted = trino_statements(cfg.places(), cfg.metastore, cfg.trino)
    assert wanted == ["""CALL "hive".system.sync_partition_metadata('strata', 'clicks', 'ADD')"""]
    signed = "Basic " + base64.b64encode(f"etl:{password}".encode()).decode()
    assert fake.requests == [("etl", signed, wanted[0])]
    assert shown["trino"] == {"conn_id": "lake_trino", "ran": wanted}
    assert password not in json.dumps(shown) + caplog.text


def _pipelines_scheduled(tmp_path: Path, schedules: dict[str, str]) -> Path:
    """A configuration of one `clicks` pipeline per schedule, named by the dict's keys."""
    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    shutil.copytree(ROOT / "schemas", tmp_path / "schemas")
    clicks = (ROOT / "conf" / "pipelines" / "clicks.yaml").read_text()
    for name, schedule in schedules.items():
        body = clicks + f"airflow: {{schedule: {schedule!r}}}\n"
        (conf / "pipelines" / f"{name}.yaml").write_text(body)
    return conf


def test_a_duration_schedules_the_ingest_dag_every_so_long_and_cron_stays_cron(
    tmp_path, monkeypatch
):
    from datetime import timedelta

    from airflow.sdk.definitions.timetables.trigger import (
        CronTriggerTimetable,
        DeltaTriggerTimetable,
    )

    conf = _pipelines_scheduled(tmp_path, {"fast": "30s", "slow": "*/5 * * * *"})
    monkeypatch.setenv("STRATA_CONF_DIR", str(conf))
    bag = load_dags(conf)
    fast = bag.dags.__getitem__("strata_ingest_fast").timetable
    slow = bag.dags.__getitem__("strata_ingest_slow").timetable
    # Under a minute, which no cron expression can say: a run every 30 seconds.
    assert isinstance(fast, DeltaTriggerTimetable) and fast.delta == timedelta(seconds=30)
    assert isinstance(slow, CronTriggerTimetable) and slow.expression == "*/5 * * * *"


def test_a_bad_schedule_leaves_the_other_pipelines_dags_loaded_and_names_the_key(
    tmp_path, monkeypatch
):
    from airflow.dag_processing.dagbag import DagBag

    conf = _pipelines_scheduled(tmp_path, {"good": "@hourly", "bad": "every hour"})
    monkeypatch.setenv("STRATA_CONF_DIR", str(conf))
    bag = DagBag(dag_folder=str(DAGS))
    assert "strata_ingest_good" in bag.dag_ids and "strata_ingest_bad" not in bag.dag_ids
    # Only the configuration check fails to import, naming the file, the key and the fix.
    error = bag.import_errors.pop(str(DAGS / "strata_config_errors.py"))
    assert bag.import_errors == {}
    assert f"{conf / 'pipelines' / 'bad.yaml'}: key `airflow.schedule`" in error
    assert "'every hour' is not a schedule" in error and "write a duration (30s, 15m)" in error


BACKFILL_CONF = {
    "pipeline": "clicks",
    "topic": "clicks",
    "partition": 3,
    "from_offset": 1200,
    "to_offset": 5000,
    "reason": "INC-42",
}


def test_the_backfill_dag_requires_every_param_typed_and_bounded(monkeypatch):
    from airflow.sdk.definitions.param import ParamValidationError

    monkeypatch.setenv("STRATA_CONF_DIR", str(ROOT / "conf"))
    params = load_dags(ROOT / "conf").dags["strata_backfill"].params
    assert params.get_param("pipeline").schema["enum"] == ["clicks"]
    # No default: leaving one out is refused, not a backfill of partition 0 from offset 0.
    for name in BACKFILL_CONF:
        with pytest.raises(ParamValidationError, match="No value passed"):
            params.get_param(name).resolve()
    assert {name: params.get_param(name).resolve(v) for name, v in BACKFILL_CONF.items()} == (
        BACKFILL_CONF
    )
    bad = [
        ("pipeline", "orders"),
        ("topic", ""),
        ("partition", "3"),
        ("partition", 2**31),
        ("from_offset", -1),
        ("from_offset", 1.5),
        ("to_offset", 0),
        ("reason", "x"),
    ]
    for name, value in bad:
        with pytest.raises(ParamValidationError):
            params.get_param(name).resolve(value)


def test_the_replay_dag_requires_a_pipeline_and_a_reason(monkeypatch):
    from airflow.sdk.definitions.param import ParamValidationError

    monkeypatch.setenv("STRATA_CONF_DIR", str(ROOT / "conf"))
    params = load_dags(ROOT / "conf").dags["strata_replay"].params
    for name in ("pipeline", "reason"):
        with pytest.raises(ParamValidationError, match="No value passed"):
            params.get_param(name).resolve()
    for name in ("from_batch", "to_batch", "topic", "partition", "from_offset", "to_offset"):
        assert params.get_param(name).resolve() is None
    with pytest.raises(ParamValidationError):
        params.get_param("to_batch").resolve(2**63)


@pytest.mark.parametrize(
    ("task", "args", "message"),
    [
        (
            "backfill_task",
            ("clicks", 0, 500, 500, "INC-1"),
            "to_offset 500 is not above from_offset 500",
        ),
        ("replay_task", ("fix", None, 3), "to_batch 3 was given without from_batch"),
        ("replay_task", ("fix",), "neither from_batch nor a range was given"),
        (
            "replay_task",
            ("fix", 1, None, ("clicks", None, None, None)),
            "both from_batch and topic",
        ),
        ("replay_task", ("fix", None, None, ("clicks", 0, None, 9)), "from_offset was not given"),
        ("replay_task", ("fix", 5, 4), "to_batch 4 is below from_batch 5"),
        (
            "replay_task",
            ("fix", None, None, ("clicks", 0, 9, 2)),
            "to_offset 2 is not above from_offset 9",
        ),
    ],
)
def test_the_tasks_refuse_what_the_params_schema_cannot_say_before_reading_anything(
    task, args, message, tmp_path
):
    import strata.orchestrate
    from strata.errors import BackfillError

    # An empty configuration directory: the refusal comes before the pipeline is read.
    with pytest.raises(BackfillError, match=message) as refused:
        getattr(strata.orchestrate, task)("clicks", str(tmp_path), *args)
    assert "nothing was done" in str(refused.value)


def test_a_conf_naming_a_param_the_dag_does_not_take_is_refused():
    from strata.errors import BackfillError
    from strata.orchestrate import check_conf

    check_conf(BACKFILL_CONF, BACKFILL_CONF)
    check_conf(None, BACKFILL_CONF)
    with pytest.raises(
        BackfillError, match=r"unknown param `from`, `to`: this DAG takes pipeline,"
    ):
        check_conf({"pipeline": "clicks", "to": 5, "from": 1}, BACKFILL_CONF)
