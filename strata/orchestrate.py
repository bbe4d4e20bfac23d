"""What the Airflow tasks call: each step of a run as a function of plain arguments.

The DAG files import nothing heavy; the tasks import this module when they run.
Every function returns a small JSON-ready dict, which Airflow keeps as the task's
XCom, so the UI shows what each run planned, read and registered. What Airflow keeps
(XCom, task logs) goes through `redact`: free text may quote a client's message.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from strata.config import load_pipeline, redact, redact_json
from strata.errors import QualityGateFailed
from strata.plan import OffsetRange


def plan_task(pipeline: str, conf_dir: str) -> dict[str, Any]:
    """Plan (and persist) the next batch; no JVM starts here."""
    from strata.run import plan_next

    plan = plan_next(load_pipeline(pipeline, conf_dir))
    if plan is None:
        return {"pipeline": pipeline, "batch": None, "ranges": [], "offsets": 0}
    return {
        "pipeline": pipeline,
        "batch": plan.batch,
        "kind": plan.kind,
        "offsets": plan.offsets,
        "ranges": [asdict(r) for r in plan.ranges],
        "tasks": len(plan.splits),
    }


def ingest_task(pipeline: str, conf_dir: str) -> dict[str, Any]:
    """Run the planned batch in this process (the `local` Spark mode)."""
    from strata.report import summary_dict
    from strata.run import run_batch

    outcome = run_batch(load_pipeline(pipeline, conf_dir), register_tables=False)
    return redact_json(summary_dict(outcome))


def register_task(pipeline: str, conf_dir: str) -> dict[str, Any]:
    """Register the tables in the metastore (and tell Trino), if one is configured."""
    from strata.run import RunOutcome, register

    cfg = load_pipeline(pipeline, conf_dir)
    if not cfg.metastore.uri:
        return {"pipeline": pipeline, "registered": None, "reason": "no metastore configured"}
    outcome = RunOutcome(pipeline, "register")
    register(cfg, outcome)
    if outcome.register_error:
        from strata.errors import MetastoreError

        raise MetastoreError(redact(outcome.register_error))
    return redact_json({"pipeline": pipeline, "registered": outcome.registered})


def quality_gate_task(pipeline: str, conf_dir: str, batch: int | None) -> dict[str, Any]:
    """Run the quality suite on the batch this DAG run planned, and apply the gate.

    Raises:
        QualityGateFailed: Under `quality.gate: fail`, when a check failed. The batch
            stays committed either way: quality never loses data.
    """
    from strata.quality import render_quality, run_quality

    cfg = load_pipeline(pipeline, conf_dir)
    if cfg.quality.gate == "off":
        return {"pipeline": pipeline, "gate": "off", "batch": batch}
    if batch is None:
        return {"pipeline": pipeline, "gate": cfg.quality.gate, "batch": None, "checked": False}
    result = run_quality(cfg, batch)
    text = redact(render_quality(result))
    print(text, flush=True)  # noqa: T201 - the task log is where an operator reads it
    body = {
        "pipeline": pipeline,
        "gate": cfg.quality.gate,
        "batch": batch,
        "success": result.success,
        "failed": [f"{c.name} {c.column or ''}".strip() for c in result.failed],
        "docs": result.docs,
    }
    if not result.success and cfg.quality.gate == "fail":
        raise QualityGateFailed(text)
    return redact_json(body)


def backfill_task(
    pipeline: str, conf_dir: str, topic: str, partition: int, start: int, end: int, reason: str
) -> dict[str, Any]:
    """Re-ingest one committed range, replacing its rows."""
    from strata.backfill import backfill
    from strata.report import summary_dict

    outcome = backfill(
        load_pipeline(pipeline, conf_dir), OffsetRange(topic, partition, start, end), reason
    )
    return redact_json(summary_dict(outcome))


def vacuum_task(pipeline: str, conf_dir: str) -> dict[str, Any]:
    """Delete Delta files removed, or never committed, longer ago than the retention.

    Files a failed attempt or a runner that lost its lease wrote are never in the log
    (every attempt writes files of its own names): vacuum's full mode deletes them too.
    It runs under the pipeline's run lock, so no run's not-yet-committed files are
    mistaken for such leftovers.
    """
    from deltalake import DeltaTable

    from strata.delta import open_table
    from strata.durations import parse_duration_ms
    from strata.lock import run_lock

    cfg = load_pipeline(pipeline, conf_dir)
    hours = parse_duration_ms(cfg.airflow.vacuum_retention) // 3_600_000
    deleted: dict[str, int] = {}
    if cfg.table_format != "delta":
        return {"pipeline": pipeline, "deleted": deleted, "reason": "plain Parquet tables"}
    with run_lock(cfg):
        for which in ("table", "raw", "quarantine", "ledger"):
            uri = cfg.location(which)
            table: DeltaTable | None = open_table(uri, cfg.storage_options)
            if table is None:
                continue
            removed = table.vacuum(
                retention_hours=hours, dry_run=False, enforce_retention_duration=False, full=True
            )
            deleted[which] = len(removed)
    return {"pipeline": pipeline, "retention_hours": hours, "deleted": deleted}
