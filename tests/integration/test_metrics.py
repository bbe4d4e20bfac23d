"""Metrics through the real run: the textfile and the Pushgateway, read with the client's parser.

The registry's make-up, the push's failures and the lag-growth decision are checked in
tests/unit/test_metrics.py and tests/unit/test_status.py.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable
from prometheus_client.parser import text_string_to_metric_families

from strata.catalog.completeness import watermarks
from strata.local.events import HOUR_MS
from strata.orchestrate import ingest_task
from strata.store.ledger import read_ledger
from tests.conftest import produce_clicks

Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def samples(text: str) -> Samples:
    """Every sample of an exposition, by metric name and sorted labels."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def by_partition(found: Samples, name: str, pipeline: str, topic: str) -> dict[int, float]:
    return {
        int(dict(labels)["partition"]): value
        for labels, value in found[name].items()
        if dict(labels)["pipeline"] == pipeline and dict(labels)["topic"] == topic
    }


def only(found: Samples, name: str) -> float:
    [value] = found[name].values()
    return value


def produce_poison(bootstrap: str, topic: str, timestamp_ms: int) -> None:
    """One message that is not JSON, at offset 0 of partition 0."""
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b'{"event_id": "cut off', partition=0, timestamp=timestamp_ms)
    assert producer.flush(10) == 0


CAP = 200


@pytest.fixture
def capped(make_pipeline, broker, tmp_path):
    """A pipeline reading at most CAP offsets per partition of a topic kept 48 hours,
    whose messages were written 40 hours ago (one of them poison)."""

    def make(metrics: dict[str, Any]):
        p = make_pipeline(
            partitions=2,
            create=False,
            overrides={
                "limits": {"max_offsets_per_partition": CAP},
                "metrics": metrics,
                "airflow": {"lag_growth_runs": 2},
            },
        )
        broker.create_topic(p.topic, 2, {"retention.ms": str(48 * HOUR_MS)})
        written_at = int(time.time() * 1000) - 40 * HOUR_MS
        produce_poison(broker.bootstrap, p.topic, written_at)
        per = produce_clicks(broker, p.topic, 2, 600, start_ms=written_at, hours=1)
        per[0] += 1
        return p, per

    return make


def test_a_run_writes_its_batch_as_metrics_and_status_prints_them(capped, broker, spark, tmp_path):
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    p, per = capped({"textfile_dir": str(textfiles)})
    began = time.time()

    # The Airflow ingest task, in this process, on the tests' SparkSession (the active one).
    summary = ingest_task(p.name, str(p.conf_dir))
    found = samples((textfiles / f"strata_{p.name}.prom").read_text())

    ledger = {r["partition"]: r for r in read_ledger(p.cfg().places()).to_pylist()}
    quarantine = p.table_rows("quarantine", ["_partition"]).column("_partition").to_pylist()
    assert quarantine == [0]  # the poison message
    assert by_partition(found, "strata_run_messages", p.name, p.topic) == {0: CAP, 1: CAP}
    assert by_partition(found, "strata_run_quarantined", p.name, p.topic) == {0: 1, 1: 0}
    assert by_partition(found, "strata_run_rows", p.name, p.topic) == {0: CAP - 1, 1: CAP}
    assert by_partition(found, "strata_run_gaps", p.name, p.topic) == {0: 0, 1: 0}
    assert by_partition(found, "strata_run_bytes", p.name, p.topic) == {
        q: ledger[q]["bytes"] for q in (0, 1)
    }
    assert by_partition(found, "strata_lag_messages", p.name, p.topic) == {
        q: per[q] - CAP for q in (0, 1)
    }
    files = {dict(k)["table"]: v for k, v in found["strata_run_files"].items()}
    assert files["table"] == len(DeltaTable(p.cfg().location("table")).file_uris()) > 0
    assert files["raw"] == len(DeltaTable(p.cfg().location("raw")).file_uris()) > 0
    assert only(found, "strata_batch") == 1
    assert began <= only(found, "strata_last_success_timestamp_seconds") <= time.time()
    assert only(found, "strata_run_duration_seconds") > 0
    assert abs(only(found, "strata_run_read_bytes_per_second") / 1e6 - summary["mb_per_s"]) < 0.01
    # The first unread message was written up to 40 hours ago (the first read, 40), and
    # is kept 48.
    left = by_partition(found, "strata_time_to_retention_seconds", p.name, p.topic)
    age = by_partition(found, "strata_oldest_unread_age_seconds", p.name, p.topic)
    assert set(left) == set(age) == {0, 1}
    for q in (0, 1):
        assert 8 * 3600 < left[q] < 9 * 3600 and abs(left[q] + age[q] - 48 * 3600) <= 2
    # ... which the run's summary (the task's XCom) warns of, as `strata status` does.
    retention = [w for w in summary["warnings"] if "unread messages are deleted by retention" in w]
    assert len(retention) == 2 and only(found, "strata_warnings") == len(summary["warnings"])
    assert "strata_quality_checks_failed" not in found  # the quality task has not run yet
    # Both partitions were capped, so both hold the completeness watermark back: it is
    # the older of their newest event times; a partition is complete an hour after.
    mark = watermarks(read_ledger(p.cfg().places()))[-1]
    assert mark.at is not None and mark.holding is not None
    newest = [r["max_event_time"].timestamp() for r in ledger.values()]
    assert only(found, "strata_completeness_watermark_timestamp_seconds") == pytest.approx(
        min(newest)
    )
    assert only(found, "strata_complete_before_timestamp_seconds") == pytest.approx(
        min(newest) - 3600
    )
    assert only(found, "strata_run_late_after_completion_rows") == 0

    status = p.cli("status", "--prometheus")
    assert status.returncode == 0, status.stderr
    now = samples(status.stdout)
    assert only(now, "strata_batch") == 1
    assert by_partition(now, "strata_lag_messages", p.name, p.topic) == {
        q: per[q] - CAP for q in (0, 1)
    }
    assert set(by_partition(now, "strata_time_to_retention_seconds", p.name, p.topic)) == {0, 1}
    assert only(now, "strata_completeness_watermark_timestamp_seconds") == pytest.approx(
        min(newest)
    )
    text = p.cli("status")
    assert f"held back by {mark.holding}" in text.stdout, text.stdout
    assert only(now, "strata_last_commit_timestamp_seconds") == pytest.approx(
        max(r["committed_at"] for r in ledger.values()).timestamp(), abs=1
    )

    # More arrives than a batch reads, twice: the lag left behind grows two batches in
    # a row (airflow.lag_growth_runs), and the task's summary says so.
    lags = [sum(per.values()) - 2 * CAP]
    for batch in (2, 3):
        # Events of the last hour: Kafka refuses timestamps an hour ahead of its clock.
        now = int(time.time() * 1000)
        more = produce_clicks(broker, p.topic, 2, 600, start_ms=now - HOUR_MS, hours=1, seed=batch)
        lags.append(lags[-1] + sum(more.values()) - 2 * CAP)
        summary = ingest_task(p.name, str(p.conf_dir))
        assert summary["batch"] == batch
    assert lags[0] < lags[1] < lags[2]
    [growing] = [w for w in summary["warnings"] if "grown" in w]
    assert growing.startswith(
        f"the lag left behind has grown 2 batches in a row ({lags[0]:,} -> {lags[1]:,} -> "
        f"{lags[2]:,} messages)"
    )
    found = samples((textfiles / f"strata_{p.name}.prom").read_text())
    assert only(found, "strata_lag_growth_runs") == 2 and only(found, "strata_batch") == 3


class Pushgateway(ThreadingHTTPServer):
    """Records what is pushed to it, as a Pushgateway would accept it."""

    pushes: list[dict[str, Any]]


class _Handler(BaseHTTPRequestHandler):
    server: Pushgateway

    def _record(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        self.server.pushes.append(
            {
                "method": self.command,
                "path": self.path,
                "auth": self.headers.get("Authorization"),
                "body": body,
            }
        )
        self.send_response(200)
        self.end_headers()

    do_PUT = do_POST = _record

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def pushgateway() -> Iterator[Pushgateway]:
    server = Pushgateway(("127.0.0.1", 0), _Handler)
    server.pushes = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


PASSWORD = "push-password-Zk7"


def test_each_run_pushes_its_metrics_with_basic_auth_and_never_shows_the_password(
    capped, spark, pushgateway, monkeypatch
):
    monkeypatch.setenv("PUSHGATEWAY_PASSWORD", PASSWORD)
    url = f"http://127.0.0.1:{pushgateway.server_port}"
    p, per = capped(
        {
            "pushgateway": url,
            "job": "ingest",
            "username": "strata",
            "password": "${PUSHGATEWAY_PASSWORD}",
            "allow_http_on_loopback": True,
            "timeout_s": 5,
        }
    )
    summary = ingest_task(p.name, str(p.conf_dir))
    assert PASSWORD not in json.dumps(summary)

    [push] = pushgateway.pushes
    # PUT: what the pipeline pushed before is replaced whole, its grouping key by pipeline.
    assert (push["method"], push["path"]) == ("PUT", f"/metrics/job/ingest/pipeline/{p.name}")
    assert push["auth"] == "Basic " + base64.b64encode(f"strata:{PASSWORD}".encode()).decode()
    found = samples(push["body"])
    assert by_partition(found, "strata_run_messages", p.name, p.topic) == {0: CAP, 1: CAP}
    assert by_partition(found, "strata_run_quarantined", p.name, p.topic) == {0: 1, 1: 0}
    assert by_partition(found, "strata_lag_messages", p.name, p.topic) == {
        q: per[q] - CAP for q in (0, 1)
    }

    # The next batch reads the rest; then the command's run, idle, pushes as well.
    assert ingest_task(p.name, str(p.conf_dir))["batch"] == 2
    run = p.cli("run", "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1])["status"] == "idle"
    assert PASSWORD not in run.stdout + run.stderr
    assert len(pushgateway.pushes) == 3
    found = samples(pushgateway.pushes[-1]["body"])
    assert only(found, "strata_batch") == 2
    assert by_partition(found, "strata_lag_messages", p.name, p.topic) == {0: 0, 1: 0}
    assert by_partition(found, "strata_run_messages", p.name, p.topic) == {0: 0, 1: 0}
