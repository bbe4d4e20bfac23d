"""The `strata` command and the spark-submit job, as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition

from strata.cli import build_parser
from strata.local.cluster import submit_command, submit_env
from strata.local.service import free_port
from tests.conftest import ROOT, expected_offsets, produce_clicks

STRATA = str(Path(sys.executable).parent / "strata")


def test_every_subcommand_has_help():
    commands = [a for a in build_parser()._subparsers._group_actions[0].choices]  # noqa: SLF001
    assert {"run", "status", "publish", "backfill", "replay", "quality"} <= set(commands)
    assert "metastore" not in commands  # the local stack has its own command
    for command in commands:
        done = subprocess.run([STRATA, command, "--help"], capture_output=True, text=True)
        assert done.returncode == 0 and "--json" in done.stdout
        assert "--pipeline" in done.stdout
    local = subprocess.run(
        [STRATA + "-local", "metastore", "--help"], capture_output=True, text=True
    )
    assert local.returncode == 0 and "--dir" in local.stdout and "--json" in local.stdout


def test_bad_config_fails_at_load_naming_file_key_and_fix(tmp_path):
    (tmp_path / "conf" / "pipelines").mkdir(parents=True)
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "clicks.avsc").write_text(
        (ROOT / "schemas" / "clicks.avsc").read_text()
    )
    body = {
        "topics": ["clicks"],
        "schema_file": "clicks.avsc",
        "event_time": {"field": "ts"},
        "limits": {"target_file_mb": -1},
    }
    (tmp_path / "conf" / "pipelines" / "clicks.yaml").write_text(yaml.safe_dump(body))
    done = subprocess.run(
        [STRATA, "run", "--pipeline", "clicks", "--conf-dir", str(tmp_path / "conf")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "clicks.yaml: key `limits.target_file_mb`: Input should be greater than 0" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.integration
def test_an_unreachable_broker_is_a_clear_error_in_bounded_time(make_pipeline):
    p = make_pipeline(
        create=False,
        overrides={"kafka": {"bootstrap_servers": f"127.0.0.1:{free_port()}", "timeout_s": 3}},
    )
    began = time.monotonic()
    done = p.cli("run", "--json")
    assert done.returncode == 1
    assert "cannot reach the brokers at 127.0.0.1:" in done.stderr and "within 3s" in done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["status"] == "failed"
    assert "Traceback" not in done.stderr
    assert time.monotonic() - began < 60


@pytest.mark.integration
def test_a_missing_topic_is_named(make_pipeline):
    p = make_pipeline(create=False)
    done = p.cli("run")
    assert done.returncode == 1 and f"topic `{p.topic}` is not available" in done.stderr


@pytest.mark.integration
def test_status_shows_ranges_history_and_lag_and_the_group_sees_the_offsets(make_pipeline, broker):
    p = make_pipeline(partitions=2)
    per = produce_clicks(broker, p.topic, 2, 600)
    run = p.cli("run", "--json")
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["batch"] == 1 and summary["messages"] == sum(per.values())
    assert summary["lag_after"] == {f"{p.topic}:0": 0, f"{p.topic}:1": 0}
    assert summary["kafka_client"].startswith("librdkafka 2.")
    produce_clicks(broker, p.topic, 2, 100, seed=3)

    status = p.cli("status", "--json")
    assert status.returncode == 0, status.stderr
    body = json.loads(status.stdout.strip().splitlines()[-1])
    assert [(x["partition"], x["committed"]) for x in body["partitions"]] == [
        (0, per[0]),
        (1, per[1]),
    ]
    assert body["total_lag"] == 100 + 2  # 100 new events and a sealing message per partition
    assert body["batches"][0]["batch"] == 1 and body["batches"][0]["messages"] == sum(per.values())
    assert "recent batches:" in status.stdout

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"strata-{p.name}"})
    committed = consumer.committed(
        [TopicPartition(p.topic, 0), TopicPartition(p.topic, 1)], timeout=10
    )
    consumer.close()
    assert [tp.offset for tp in committed] == [per[0], per[1]]


@pytest.mark.integration
def test_the_spark_submit_job_runs_a_batch(make_pipeline, broker):
    p = make_pipeline(partitions=2)
    per = produce_clicks(broker, p.topic, 2, 500)
    done = subprocess.run(
        submit_command("local[2]", p.name, p.conf_dir),
        capture_output=True,
        text=True,
        env=submit_env(p.env()),
        timeout=300,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["batch"] == 1
    assert p.landed() == expected_offsets(per)
