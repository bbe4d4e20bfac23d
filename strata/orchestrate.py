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


def compact_task(pipeline: str, conf_dir: str) -> dict[str, Any]:
    """Merge the small files of the pipeline's settled partitions (see `strata.compact`)."""
    from strata.compact import compact

    return redact_json(compact(load_pipeline(pipeline, conf_dir)).as_dict())


def checkpoint_task(pipeline: str, conf_dir: str) -> dict[str, Any]:
    """Checkpoint the pipeline's Delta logs and delete their expired commits."""
    from strata.maintain import checkpoint

    return redact_json(checkpoint(load_pipeline(pipeline, conf_dir)))


def vacuum_task(pipeline: str, conf_dir: str) -> dict[str, Any]:
    """Delete removed files past the retention, and files that can never be committed."""
    from strata.maintain import vacuum

    return redact_json(vacuum(load_pipeline(pipeline, conf_dir)))
