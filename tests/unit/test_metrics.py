"""The metrics' make-up from a run and from statuses, and an export that fails as a warning.

The metrics of real runs, written and pushed, are checked in tests/integration/test_metrics.py.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from strata.batch.outcome import RunOutcome
from strata.batch.task import RangeResult
from strata.config import PipelineConfig, load_pipeline
from strata.operations.metrics import METRICS, export, run_metrics, status_metrics, textfile_path
from tests.conftest import ROOT


def _pipeline(tmp_path: Path, metrics: dict) -> PipelineConfig:
    (tmp_path / "conf" / "pipelines").mkdir(parents=True)
    (tmp_path / "schemas").mkdir()
    shutil.copy(ROOT / "schemas" / "clicks.avsc", tmp_path / "schemas")
    body = {
        "topics": ["clicks"],
        "schema_file": "clicks.avsc",
        "event_time": {"field": "ts"},
        "metrics": metrics,
    }
    (tmp_path / "conf" / "pipelines" / "clicks.yaml").write_text(yaml.safe_dump(body))
    return load_pipeline("clicks", tmp_path / "conf")


def _families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        assert family.type == "gauge", family.name
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _result(partition: int, messages: int, quarantined: int, size: int) -> RangeResult:
    return RangeResult(
        "clicks", partition, 0, messages, messages, 0, messages - quarantined, quarantined, size
    )


def test_a_run_is_gauges_per_partition_with_zeros_where_it_read_nothing():
    outcome = RunOutcome(
        "clicks",
        "committed",
        7,
        ranges=[_result(0, 100, 2, 5_000)],
        files={"table": 3, "raw": 1},
        lag={("clicks", 0): 40, ("clicks", 1): 5},
        seconds=4.0,
        read_seconds=2.0,
        warnings=["one"],
        late_after_completion={"dt=2026-01-31/hr=09": 3, "dt=2026-01-31/hr=08": 2},
    )
    view = {
        **_status("clicks", 40, None),
        "watermark": {
            "at": "2026-01-31T11:00:00+00:00",
            "holding": "clicks:0",
            "complete_before": "2026-01-31T10:00:00+00:00",
        },
    }
    quality = {"batch": 7, "checks": [{"success": True}, {"success": False}, {"success": False}]}
    found = _families(generate_latest(run_metrics(outcome, view, quality, 1_700_000_000)).decode())

    assert set(found) <= set(METRICS)
    assert found["strata_run_late_after_completion_rows"] == [({"pipeline": "clicks"}, 5)]
    assert found["strata_run_failed"] == [({"pipeline": "clicks"}, 0)]
    # A run that failed after its commit is no success.
    failed = generate_latest(run_metrics(outcome, view, quality, 1_700_000_000, run_failed=True))
    after_failure = _families(failed.decode())
    assert after_failure["strata_run_failed"] == [({"pipeline": "clicks"}, 1)]
    assert "strata_last_success_timestamp_seconds" not in after_failure
    assert found["strata_completeness_watermark_timestamp_seconds"] == [
        ({"pipeline": "clicks"}, 1_769_857_200)
    ]
    assert found["strata_complete_before_timestamp_seconds"] == [
        ({"pipeline": "clicks"}, 1_769_853_600)
    ]
    part = {"pipeline": "clicks", "topic": "clicks"}
    assert found["strata_run_messages"] == [
        ({**part, "partition": "0"}, 100),
        ({**part, "partition": "1"}, 0),
    ]
    assert found["strata_run_quarantined"][0] == ({**part, "partition": "0"}, 2)
    assert found["strata_run_rows"][0] == ({**part, "partition": "0"}, 98)
    assert found["strata_lag_messages"] == [
        ({**part, "partition": "0"}, 40),
        ({**part, "partition": "1"}, 5),
    ]
    assert found["strata_run_files"] == [
        ({"pipeline": "clicks", "table": "raw"}, 1),
        ({"pipeline": "clicks", "table": "table"}, 3),
    ]
    assert found["strata_run_read_bytes_per_second"] == [({"pipeline": "clicks"}, 2_500)]
    assert found["strata_quality_checks_failed"] == [({"pipeline": "clicks"}, 2)]
    assert found["strata_last_success_timestamp_seconds"] == [({"pipeline": "clicks"}, 1.7e9)]
    assert found["strata_warnings"] == [({"pipeline": "clicks"}, 1)]


def _status(pipeline: str, lag: int, left: int | None) -> dict:
    partition = {"topic": "clicks", "partition": 0, "committed": 10, "lag": lag}
    if left is not None:
        partition["time_to_retention_s"] = left
    return {
        "pipeline": pipeline,
        "last_batch": 3,
        "last_committed_at": "2026-01-31T10:00:00+00:00",
        "partitions": [partition],
        "lag_growth_runs": 2,
        "warnings": ["w"],
    }


def test_the_tables_of_a_routed_pipeline_share_one_exposition():
    text = status_metrics([_status("orders", 5, 3600), _status("clicks", 0, None)]).decode()
    found = _families(text)
    assert text.count("# TYPE strata_lag_messages gauge") == 1
    assert sorted((s[0]["pipeline"], s[1]) for s in found["strata_lag_messages"]) == [
        ("clicks", 0),
        ("orders", 5),
    ]
    # Only where retention gives a deadline.
    assert found["strata_time_to_retention_seconds"] == [
        ({"pipeline": "orders", "topic": "clicks", "partition": "0"}, 3600)
    ]
    assert found["strata_last_commit_timestamp_seconds"][0][1] == 1_769_853_600
    assert found["strata_lag_growth_runs"][0][1] == 2


def test_a_file_or_push_that_fails_is_a_warning_without_the_password(tmp_path, monkeypatch):
    monkeypatch.setenv("PUSH_PASSWORD", "pw-never-shown-5Tq")
    with socket.socket() as s:  # bound and closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = _pipeline(
        tmp_path,
        {
            "textfile_dir": str(tmp_path / "missing"),
            "pushgateway": f"http://127.0.0.1:{port}",
            "username": "u",
            "password": "${PUSH_PASSWORD}",
            "allow_http_on_loopback": True,
            "timeout_s": 2,
        },
    )
    registry = run_metrics(RunOutcome("clicks", "idle"), None, None, 0)
    written, pushed = export(cfg.metrics, cfg.name, registry)
    assert written.startswith(f"metrics not written to {tmp_path}/missing/strata_clicks.prom")
    assert pushed.startswith(f"metrics not pushed to http://127.0.0.1:{port}: URLError")
    assert "pw-never-shown-5Tq" not in written + pushed


def test_the_file_is_named_by_the_pipeline_and_replaced_whole(tmp_path):
    cfg = _pipeline(tmp_path, {"textfile_dir": str(tmp_path)})
    assert textfile_path(cfg.metrics, cfg.name) == f"{tmp_path}/strata_clicks.prom"
    for partition, lag in ((0, 3), (1, 4)):
        idle = RunOutcome("clicks", "idle", lag={("c", partition): lag})
        assert export(cfg.metrics, cfg.name, run_metrics(idle, None, None, 0)) == []
    found = _families((tmp_path / "strata_clicks.prom").read_text())
    assert found["strata_lag_messages"] == [
        ({"pipeline": "clicks", "topic": "c", "partition": "1"}, 4)
    ]
    assert [p.name for p in tmp_path.glob("strata_*")] == ["strata_clicks.prom"]
