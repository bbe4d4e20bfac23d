"""The `strata` command, as a user runs it, against the real broker.

Its help and its configuration errors are checked in tests/unit/test_cli.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from strata.local.service import free_port
from tests.conftest import produce_clicks


def test_an_unreachable_broker_is_one_clear_line_in_bounded_time(make_pipeline):
    address = f"127.0.0.1:{free_port()}"  # bound and closed: nothing listens there
    p = make_pipeline(
        create=False, overrides={"kafka": {"bootstrap_servers": address, "timeout_s": 3}}
    )
    for command in ("run", "status"):
        began = time.monotonic()
        done = p.cli(command, "--json")
        assert done.returncode == 1, (command, done.stderr)
        # librdkafka retried the connection dozens of times meanwhile: none of it shows.
        [line] = done.stderr.strip().splitlines()
        assert line.startswith(f"strata: error: cannot reach the brokers at {address} within 3s")
        assert "Connection refused" in line and "%3|" not in done.stderr
        assert "Traceback" not in done.stderr
        assert time.monotonic() - began < 60
        body = json.loads(done.stdout.strip().splitlines()[-1])
        if command == "run":
            assert body["status"] == "failed" and address in body["error"]
        else:
            # The ledger still answers; only the lag is missing.
            assert body["last_batch"] == 0 and address in body["broker_error"]
            assert "total_lag" in body and body["total_lag"] is None


def test_a_missing_topic_is_named(make_pipeline):
    p = make_pipeline(create=False)
    done = p.cli("run")
    assert done.returncode == 1 and f"topic `{p.topic}` is not available" in done.stderr


# What the JVM, Spark's log4j, Hadoop and PySpark print when a session starts by default.
STARTUP_NOISE = (
    "WARNING: Using incubator modules",
    "Using Spark's default log4j profile",
    'Setting default log level to "WARN"',
    "To adjust logging level use sc.setLogLevel",
    "NativeCodeLoader",
    "FutureWarning",
)


def test_status_shows_ranges_history_and_lag_and_the_group_sees_the_offsets(make_pipeline, broker):
    p = make_pipeline(partitions=2)
    per = produce_clicks(broker, p.topic, 2, 600)
    run = p.cli("run", "--json")
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["batch"] == 1 and summary["messages"] == sum(per.values())
    # The run prints its own lines, none of the parts' it starts: the JVM's, Spark's,
    # Hadoop's, PySpark's. The data docs are named where they can be opened.
    assert run.stdout.startswith(f"pipeline {p.name}: batch 1 committed: ")
    assert [n for n in STARTUP_NOISE if n in run.stdout + run.stderr] == []
    [docs] = [line for line in run.stdout.splitlines() if line.startswith("data docs: ")]
    page = Path(docs.removeprefix("data docs: "))
    assert page.is_absolute() and page.is_relative_to(p.warehouse) and page.is_file()
    assert "<html" in page.read_text().lower()
    assert summary["lag_after"] == {f"{p.topic}:0": 0, f"{p.topic}:1": 0}
    assert summary["kafka_client"].startswith("librdkafka 2.")
    more = produce_clicks(broker, p.topic, 2, 100, seed=3)

    status = p.cli("status", "--json")
    assert status.returncode == 0, status.stderr
    body = json.loads(status.stdout.strip().splitlines()[-1])
    assert [(x["partition"], x["committed"]) for x in body["partitions"]] == [
        (0, per[0]),
        (1, per[1]),
    ]
    assert [x["lag"] for x in body["partitions"]] == [more[0], more[1]]
    assert body["total_lag"] == 100
    assert body["batches"][0]["batch"] == 1 and body["batches"][0]["messages"] == sum(per.values())
    assert "recent batches:" in status.stdout

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"strata-{p.name}"})
    committed = consumer.committed(
        [TopicPartition(p.topic, 0), TopicPartition(p.topic, 1)], timeout=10
    )
    consumer.close()
    assert [tp.offset for tp in committed] == [per[0], per[1]]
