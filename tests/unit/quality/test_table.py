"""The quality table on a local directory: a batch's rows, replaced when checked again."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pyarrow.parquet as pq
from deltalake import DeltaTable

from strata.config import EventTimeConfig, PipelineConfig
from strata.quality.checks import QUALITY_SCHEMA, Check, QualityResult, quality_rows
from strata.quality.table import publish_result, quality_table_location, replace_batch
from tests.conftest import ROOT


def config(warehouse) -> PipelineConfig:
    return PipelineConfig(
        name="clicks",
        topics=["clicks"],
        format="json",
        schema_file="clicks.avsc",
        schemas_dir=str(ROOT / "schemas"),
        warehouse=str(warehouse),
        event_time=EventTimeConfig(field="ts"),
    )


def result(batch: int, checked: str, failing: int = 0) -> QualityResult:
    checks = [
        Check("expect_column_values_to_not_be_null", True, "user_id"),
        Check("reconcile: data files present", True),
    ] + [
        Check("expect_column_values_to_be_between", False, f"c{i}", f"{i + 1} unexpected", i + 1)
        for i in range(failing)
    ]
    partitions = {f"dt=2025-11-22/hr={10 + i:02d}": 100 * batch + i for i in range(batch)}
    return QualityResult(
        pipeline="clicks",
        batch=batch,
        kind="ingest",
        gate="fail",
        success=not failing,
        checked_at=checked,
        committed_at="2025-11-22T10:00:00+00:00",
        rows=sum(partitions.values()),
        validated_rows=sum(partitions.values()),
        sampled=False,
        ledger={},
        lag_after=None,
        checks=checks,
        partitions=partitions,
        incomplete=sorted(partitions) if failing else [],
    )


def test_a_result_becomes_a_row_per_check_then_one_per_event_time_partition():
    rows = quality_rows(result(2, "2025-11-22T10:05:00+00:00", failing=1)).to_pylist()
    assert [r["scope"] for r in rows] == ["check"] * 3 + ["partition"] * 2
    when = datetime(2025, 11, 22, 10, 5, tzinfo=UTC)
    assert rows[2] == {
        "pipeline": "clicks", "batch": 2, "scope": "check", "kind": "ingest", "gate": "fail",
        "checked_at": when, "committed_at": datetime(2025, 11, 22, 10, tzinfo=UTC),
        "success": False, "check_name": "expect_column_values_to_be_between",
        "check_column": "c0", "unexpected": 1, "detail": "1 unexpected",
        "event_partition": None, "dt": None, "hr": None, "rows": None, "incomplete": None,
    }  # fmt: skip
    assert rows[1]["check_column"] is None and rows[1]["detail"] is None
    partitions = [(r["event_partition"], r["dt"], r["hr"], r["rows"], r["incomplete"], r["success"])
                  for r in rows[3:]]  # fmt: skip
    assert partitions == [
        ("dt=2025-11-22/hr=10", "2025-11-22", "10", 200, True, False),
        ("dt=2025-11-22/hr=11", "2025-11-22", "11", 201, True, False),
    ]
    assert all(r["check_name"] is None for r in rows[3:])


def test_checking_a_batch_again_replaces_its_rows_in_one_transaction(tmp_path):
    quality = config(tmp_path).places().table("quality")
    assert replace_batch(quality, result(1, "2025-11-22T10:05:00+00:00", failing=1)) == 3 + 1
    assert replace_batch(quality, result(2, "2025-11-22T11:05:00+00:00")) == 2 + 2
    table = DeltaTable(quality_table_location(quality))
    version = table.version()
    assert replace_batch(quality, result(1, "2025-11-22T12:05:00+00:00")) == 2 + 1

    table.update_incremental()
    assert table.version() == version + 1  # removes and add in one commit
    rows = table.to_pyarrow_table().sort_by([("batch", "ascending")]).to_pylist()
    assert [(r["batch"], r["scope"]) for r in rows] == [
        (1, "check"), (1, "check"), (1, "partition"),
        (2, "check"), (2, "check"), (2, "partition"), (2, "partition"),
    ]  # fmt: skip
    first = [r for r in rows if r["batch"] == 1]
    assert {r["checked_at"].hour for r in first} == {12} and all(r["success"] for r in first)
    assert not first[2]["incomplete"]
    # The directory alone, as a plain Parquet reader lists it, holds each batch once.
    files = sorted(p.name for p in (tmp_path / "clicks_quality" / "checks").glob("*.parquet"))
    assert len(files) == 2 and files[0].startswith("quality-b0000000001-")
    assert pq.read_table(tmp_path / "clicks_quality" / "checks" / files[0]).num_rows == 3
    assert pq.read_schema(tmp_path / "clicks_quality" / "checks" / files[1]) == QUALITY_SCHEMA


def test_a_table_that_cannot_be_written_or_registered_is_a_warning_naming_the_batch(
    tmp_path, caplog
):
    cfg = config(tmp_path)
    published = result(4, "2025-11-22T10:05:00+00:00")
    # A file where the table's directory should be: no Delta table can be made there.
    (tmp_path / "clicks_quality").mkdir()
    (tmp_path / "clicks_quality" / "checks").write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="strata"):
        assert publish_result(cfg.places(), cfg.metastore, cfg.warehouse, published) is False
    [warning] = [r for r in caplog.records if r.name.startswith("strata")]
    assert "batch 4's quality result is saved, but the quality table at" in warning.getMessage()
    assert "`strata quality --batch 4` writes it again" in warning.getMessage()

    # Written, but the metastore cannot be reached: the rows stay, and it says so.
    (tmp_path / "clicks_quality" / "checks").unlink()
    unreachable = cfg.metastore.model_copy(update={"uri": "thrift://127.0.0.1:9"})
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="strata"):
        assert publish_result(cfg.places(), unreachable, cfg.warehouse, published) is False
    [warning] = [r for r in caplog.records if r.name.startswith("strata")]
    assert "the quality table holds batch 4, but registering it failed" in warning.getMessage()
    quality = quality_table_location(cfg.places().table("quality"))
    assert DeltaTable(quality).to_pyarrow_table().num_rows == 2 + 4


def test_a_quality_table_that_cannot_be_read_does_not_fail_registration(tmp_path, caplog):
    from strata.catalog.register import RegistrationReport
    from strata.quality.table import register_written

    cfg = config(tmp_path)
    log = tmp_path / "clicks_quality" / "checks" / "_delta_log"
    log.mkdir(parents=True)
    (log / "00000000000000000000.json").write_text("{not json")
    report = RegistrationReport("strata")
    with caplog.at_level(logging.WARNING, logger="strata"):
        register_written(cfg.places(), cfg.metastore, cfg.warehouse, report)
    assert report.created == report.updated == report.unchanged == []
    assert "quality table" in caplog.text and "could not be read" in caplog.text
