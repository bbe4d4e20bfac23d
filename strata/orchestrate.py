"""What the Airflow tasks call: each step of a run as a function of plain arguments.

The DAG files import nothing heavy; the tasks import this module when they run.
Every function returns a small JSON-ready dict, which Airflow keeps as the task's
XCom, so the UI shows what each run planned, read and registered. What Airflow keeps
(XCom, task logs) goes through `redact`: free text may quote a client's message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from strata.config import PipelineConfig, load_pipeline, redact, redact_json
from strata.errors import QualityGateFailed
from strata.plan import OffsetRange


def _each_table(
    pipeline: str, conf_dir: str, step: Callable[[PipelineConfig], dict[str, Any]]
) -> dict[str, Any]:
    """One step on a pipeline, or on each table of a pipeline that routes to tables.

    Every table has its turn whatever another's did; then the first failure is
    raised, so Airflow retries the step, and a retry finds the tables that went
    through idle or done.
    """
    from strata.evolve import table_schema

    cfg = load_pipeline(pipeline, conf_dir)
    if not cfg.routed:
        return step(table_schema(cfg))
    from strata.routes import route_tables

    tables: dict[str, Any] = {}
    failures: list[tuple[str, Exception]] = []
    for name in route_tables(cfg):
        try:
            tables[name] = step(table_schema(cfg.route(name)))
        except Exception as exc:  # noqa: BLE001 - raised below, once every table had its turn
            failures.append((name, exc))
            tables[name] = {"status": "failed", "error": redact(str(exc))}
    if failures:
        names = ", ".join(n for n, _ in failures)
        print(f"failed tables of {pipeline}: {names}", flush=True)  # noqa: T201 - the task log
        raise failures[0][1]
    return {"pipeline": pipeline, "tables": tables}


def _plan_one(cfg: PipelineConfig) -> dict[str, Any]:
    from strata.run import plan_next

    plan = plan_next(cfg)
    if plan is None:
        return {"pipeline": cfg.name, "batch": None, "ranges": [], "offsets": 0}
    return {
        "pipeline": cfg.name,
        "batch": plan.batch,
        "kind": plan.kind,
        "offsets": plan.offsets,
        "ranges": [asdict(r) for r in plan.ranges],
        "tasks": len(plan.splits),
    }


def plan_task(pipeline: str, conf_dir: str) -> dict[str, Any]:
    """Plan (and persist) the next batch, of each table if it routes; no JVM starts here."""
    return _each_table(pipeline, conf_dir, _plan_one)


def _ingest_one(cfg: PipelineConfig) -> dict[str, Any]:
    from strata.report import summary_dict
    from strata.run import run_batch

    return redact_json(summary_dict(run_batch(cfg, register_tables=False)))


def ingest_task(pipeline: str, conf_dir: str) -> dict[str, Any]:
    """Run the planned batch (of each table) in this process (the `local` Spark mode)."""
    return _each_table(pipeline, conf_dir, _ingest_one)


def _register_one(cfg: PipelineConfig) -> dict[str, Any]:
    from strata.run import RunOutcome, register

    if not cfg.metastore.uri:
        return {"pipeline": cfg.name, "registered": None, "reason": "no metastore configured"}
    outcome = RunOutcome(cfg.name, "register")
    register(cfg, outcome)
    if outcome.register_error:
        from strata.errors import MetastoreError

        raise MetastoreError(redact(outcome.register_error))
    return redact_json({"pipeline": cfg.name, "registered": outcome.registered})


def register_task(pipeline: str, conf_dir: str) -> dict[str, Any]:
    """Register the tables in the metastore (and tell Trino), if one is configured."""
    return _each_table(pipeline, conf_dir, _register_one)


def quality_gate_task(
    pipeline: str, conf_dir: str, batch: int | None, planned: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Run the quality suite on the batch this DAG run planned, and apply the gate.

    Args:
        pipeline: The pipeline.
        conf_dir: The configuration directory.
        batch: The batch the plan task planned, or None.
        planned: The plan task's whole answer: for a pipeline that routes to tables,
            each table's batch is taken from it.

    Raises:
        QualityGateFailed: Under `quality.gate: fail`, when a check failed. The batch
            stays committed either way: quality never loses data.
    """
    tables = (planned or {}).get("tables", {})

    def one(cfg: PipelineConfig) -> dict[str, Any]:
        return _quality_one(cfg, tables[cfg.name]["batch"] if cfg.name in tables else batch)

    return _each_table(pipeline, conf_dir, one)


def _quality_one(cfg: PipelineConfig, batch: int | None) -> dict[str, Any]:
    from strata.quality import render_quality, run_quality

    pipeline = cfg.name
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


def complete_task(
    pipeline: str, conf_dir: str, batch: int | None, planned: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Mark the partitions complete after the batch this DAG run planned, and list them.

    Args:
        pipeline: The pipeline.
        conf_dir: The configuration directory.
        batch: The batch the plan task planned, or None.
        planned: The plan task's whole answer: for a pipeline that routes to tables,
            each table's batch is taken from it.

    Returns:
        Per table: its Asset's URI, the partitions the batch completed, the watermark
        and the rows it landed after completion.
    """
    tables = (planned or {}).get("tables", {})

    def one(cfg: PipelineConfig) -> dict[str, Any]:
        return _complete_one(cfg, tables[cfg.name]["batch"] if cfg.name in tables else batch)

    return _each_table(pipeline, conf_dir, one)


def _complete_one(cfg: PipelineConfig, batch: int | None) -> dict[str, Any]:
    from strata.completeness import late_warnings
    from strata.ledger import ledger_state
    from strata.register import publish_completeness

    body: dict[str, Any] = {"pipeline": cfg.name, "asset": cfg.asset_uri, "batch": batch}
    # A batch the run did not commit completes nothing (yet).
    if batch is None or ledger_state(cfg).last_batch < batch:
        return {**body, "completed": []}
    found, problems = publish_completeness(cfg, batch)
    for line in problems + ([] if found is None else late_warnings(found)):
        print(f"warning: {redact(line)}", flush=True)  # noqa: T201 - the task log
    if found is None:
        return {**body, "completed": [], "problems": [redact(p) for p in problems]}
    return {
        **body,
        "completed": found.completed,
        "watermark": found.watermark,
        "held_back_by": found.holding,
        "late": found.late,
    }


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

    return _each_table(pipeline, conf_dir, lambda cfg: redact_json(compact(cfg).as_dict()))


def checkpoint_task(pipeline: str, conf_dir: str) -> dict[str, Any]:
    """Checkpoint the pipeline's Delta logs and delete their expired commits."""
    from strata.maintain import checkpoint

    return _each_table(pipeline, conf_dir, lambda cfg: redact_json(checkpoint(cfg)))


def vacuum_task(pipeline: str, conf_dir: str) -> dict[str, Any]:
    """Delete removed files past the retention, and files that can never be committed."""
    from strata.maintain import vacuum

    return _each_table(pipeline, conf_dir, lambda cfg: redact_json(vacuum(cfg)))
