"""What the Airflow tasks call: each step of a run as a function of plain arguments.

The DAG files import nothing heavy; the tasks import this module when they run.
Every function returns a small JSON-ready dict, which Airflow keeps as the task's
XCom, so the UI shows what each run planned, read and registered. What Airflow keeps
(XCom, task logs) goes through `redact`: free text may quote a client's message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict
from functools import partial
from typing import TYPE_CHECKING, Any

from strata.config import PipelineConfig, load_pipeline
from strata.config.secrets import redact, redact_json
from strata.errors import BackfillError, QualityGateFailed
from strata.store.ranges import OffsetRange

if TYPE_CHECKING:
    from strata.batch.outcome import RunOutcome


def _each_table(
    pipeline: str,
    conf_dir: str,
    step: Callable[[PipelineConfig], dict[str, Any]],
    together: Callable[[list[PipelineConfig]], list[dict[str, Any] | Exception]] | None = None,
    *,
    running: bool = False,
) -> dict[str, Any]:
    """One step on a pipeline, or on each table of a pipeline that routes to tables.

    Every table has its turn whatever another's did (`strata.edge.table_turns`), or
    all take it at once when they share work (`together`, `strata.edge.shared_turns`);
    then the first failure is raised, so Airflow retries the step, and a retry finds
    the tables that went through idle or done. A step of a run (`running`, or one
    taken `together`) leaves out the tables retired while no topic routes to them.
    """
    from strata.edge import as_evolved, shared_turns, table_turns

    cfg = load_pipeline(pipeline, conf_dir)
    if not cfg.routed:
        return step(as_evolved(cfg))
    tables: dict[str, Any] = {}
    failures: list[tuple[str, Exception]] = []
    if together is None:
        # A run's plan asks the brokers about every table's topics: once for all.
        turns = table_turns(cfg, step, running=running, asks_brokers=running)
    else:
        turns = shared_turns(cfg, together)
    for name, got in turns:
        if isinstance(got, Exception):
            failures.append((name, got))
            got = {"status": "failed", "error": redact(str(got))}
        tables[name] = got
    if failures:
        names = ", ".join(n for n, _ in failures)
        print(f"failed tables of {pipeline}: {names}", flush=True)  # noqa: T201 - the task log
        raise failures[0][1]
    return {"pipeline": pipeline, "tables": tables}


def _plan_one(cfg: PipelineConfig) -> dict[str, Any]:
    from strata.run import plan_next, plan_settings

    plan = plan_next(cfg.places(), plan_settings(cfg))
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
    return _each_table(pipeline, conf_dir, _plan_one, running=True)


def _ingest_tables(tables: list[PipelineConfig]) -> list[dict[str, Any] | Exception]:
    """Run the planned batch of each pipeline given, their reads in one Spark job."""
    from strata.edge import then_each
    from strata.run import run_batches

    return then_each(tables, run_batches(tables, register_tables=False), _after_ingest)


def _after_ingest(cfg: PipelineConfig, outcome: RunOutcome) -> dict[str, Any]:
    from strata.edge import status_settings
    from strata.operations.metrics import after_run
    from strata.operations.report import render_summary, summary_dict

    # Retention and growing-lag warnings join the summary; metrics are written.
    after_run(cfg.places(), status_settings(cfg), cfg.metrics, outcome)
    print(redact(render_summary(outcome)), flush=True)  # noqa: T201 - the task log
    return redact_json(summary_dict(outcome))


def ingest_task(pipeline: str, conf_dir: str) -> dict[str, Any]:
    """Run the planned batch (of each table, in one Spark job) in this process (`local` mode)."""
    from strata.edge import alone

    return _each_table(pipeline, conf_dir, partial(alone, _ingest_tables), _ingest_tables)


def _register_one(cfg: PipelineConfig, ddl: bool = False) -> dict[str, Any]:
    from strata.batch.outcome import RunOutcome
    from strata.edge import registration
    from strata.run import register

    conn_id = cfg.airflow.trino_conn_id
    body: dict[str, Any] = {"pipeline": cfg.name}
    if cfg.metastore.uri:
        outcome = RunOutcome(cfg.name, "register")
        # Through the connection, Trino is told below: not also at `trino.url`.
        register(registration(cfg), None if conn_id else cfg.trino, outcome)
        if outcome.register_error:
            from strata.errors import MetastoreError

            raise MetastoreError(redact(outcome.register_error))
        body["registered"] = outcome.registered
    else:
        body.update(registered=None, reason="no metastore configured")
    if conn_id:
        from strata.catalog.sql import ddl_statements, run_through_connection, trino_statements

        # A Delta table's metastore entry is all a Trino on the same metastore needs;
        # `register_table`, which Trino refuses unless its catalog allows it, only
        # where the pipeline says Trino's Delta catalog uses another metastore.
        whole = ddl and (cfg.table_format == "parquet" or cfg.trino.register_delta_tables)
        places = cfg.places()
        statements = (
            ddl_statements(
                places,
                cfg.schemas(),
                cfg.metastore,
                cfg.trino.delta_catalog,
                cfg.trino.hive_catalog,
                cfg.trino.iceberg_catalog,
                # As after a run: an Iceberg table Trino holds at an older snapshot (one
                # the maintenance may just have expired) is re-pointed at the current one.
                repoint=cfg.table_format == "iceberg",
            )
            if whole
            else trino_statements(places, cfg.metastore, cfg.trino)
        )
        body["trino"] = {"conn_id": conn_id, "ran": run_through_connection(conn_id, statements)}
    return redact_json(body)


def register_task(pipeline: str, conf_dir: str, ddl: bool = False) -> dict[str, Any]:
    """Register the tables in the metastore (if one is configured), and tell Trino.

    Trino is called through the Airflow connection `airflow.trino_conn_id` when it is
    set, else at `trino.url`.

    Args:
        pipeline: The pipeline.
        conf_dir: The configuration directory.
        ddl: Through the connection, run the pipeline's whole DDL (`strata sql ddl`),
            which creates what a Trino on another metastore lacks, instead of the
            statements every run needs.
    """
    return _each_table(pipeline, conf_dir, lambda cfg: _register_one(cfg, ddl))


def _planned_batch(planned: dict[str, Any] | None, table: str, batch: int | None) -> int | None:
    """The batch this DAG run planned for a table of a routed pipeline (or the pipeline)."""
    tables = (planned or {}).get("tables", {})
    return tables[table]["batch"] if table in tables else batch


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

    return _each_table(pipeline, conf_dir, partial(_quality_one, batch=batch, planned=planned))


def _quality_one(
    cfg: PipelineConfig, batch: int | None, planned: dict[str, Any] | None
) -> dict[str, Any]:
    from strata.quality.checks import render_quality
    from strata.quality.run import run_quality

    pipeline = cfg.name
    batch = _planned_batch(planned, pipeline, batch)
    if cfg.quality.gate == "off":
        return {"pipeline": pipeline, "gate": "off", "batch": batch}
    if batch is None:
        return {"pipeline": pipeline, "gate": cfg.quality.gate, "batch": None, "checked": False}
    result = run_quality(
        cfg.places(), cfg.quality, cfg.schemas(), cfg.metastore, cfg.warehouse, batch
    )
    text = redact(render_quality(result))
    print(text, flush=True)  # noqa: T201 - the task log is where an operator reads it
    body = {
        "pipeline": pipeline,
        "gate": cfg.quality.gate,
        "batch": batch,
        "success": result.success,
        "failed": [f"{c.name} {c.column or ''}".strip() for c in result.failed],
        "docs": result.docs,
        "docs_location": result.docs_location,
    }
    if not result.success and cfg.quality.gate == "fail":
        raise QualityGateFailed(text)
    return redact_json(body)


def complete_task(
    pipeline: str,
    conf_dir: str,
    batch: int | None,
    planned: dict[str, Any] | None = None,
    announced: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Mark the partitions complete after the batch this DAG run planned, and list them.

    Args:
        pipeline: The pipeline.
        conf_dir: The configuration directory.
        batch: The batch the plan task planned, or None.
        planned: The plan task's whole answer: for a pipeline that routes to tables,
            each table's batch is taken from it.
        announced: The last batch announced per Asset URI (`announced_batches`): the
            partitions completed by any batch since are listed (by any batch at all for
            an Asset missing from it). None lists those this run's batch completed.

    Returns:
        Per table: its Asset's URI, the partitions completed since the last announced
        batch, the watermark and the rows the batch landed after completion.
    """

    return _each_table(
        pipeline,
        conf_dir,
        partial(_complete_one, batch=batch, planned=planned, announced=announced),
    )


def announced_batches(events: Iterable[Any], dag_id: str) -> dict[str, int]:
    """The last batch each Asset's events from this DAG announced, by Asset URI.

    Airflow keeps every event it emitted, so what was announced is read from there: a
    run whose `complete` task never ran (its quality gate failed, its worker died)
    leaves partitions that the next run announces, and none is announced twice.

    Args:
        events: Asset events (Airflow's `inlet_events` of the task's Asset or alias).
        dag_id: This DAG's id; another DAG's events on the Asset are not this one's.
    """
    last: dict[str, int] = {}
    for event in events:
        batch = (event.extra or {}).get("batch")
        if event.source_dag_id != dag_id or not isinstance(batch, int):
            continue
        last[event.asset.uri] = max(batch, last.get(event.asset.uri, 0))
    return last


def _complete_one(
    cfg: PipelineConfig,
    batch: int | None,
    planned: dict[str, Any] | None,
    announced: dict[str, int] | None,
) -> dict[str, Any]:
    from strata.catalog.completeness import late_warnings
    from strata.catalog.register import publish_completeness
    from strata.edge import registration
    from strata.store.ledger import ledger_state

    batch = _planned_batch(planned, cfg.name, batch)
    # An Asset never announced: every partition complete so far is news.
    since = None if announced is None else announced.get(cfg.asset_uri, 0)
    body: dict[str, Any] = {"pipeline": cfg.name, "asset": cfg.asset_uri, "batch": batch}
    # A batch the run did not commit completes nothing (yet); a run that planned none
    # still announces what earlier runs completed and did not announce.
    if (batch is None and since is None) or (
        batch is not None and ledger_state(cfg.places()).last_batch < batch
    ):
        return {**body, "completed": []}
    found, problems = publish_completeness(registration(cfg), batch, since)
    if found is not None:
        body["batch"] = found.batch
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


def check_conf(conf: Mapping[str, Any] | None, params: Iterable[str]) -> None:
    """Refuse a trigger's conf that names a param the DAG does not take.

    Airflow keeps whatever else a conf holds as an extra param: a misspelt
    `to_batch` would replay the first batch alone, and say nothing.

    Args:
        conf: The DAG run's conf, as triggered.
        params: The names of the DAG's params.

    Raises:
        BackfillError: Naming each unknown param and the params the DAG takes.
    """
    known = list(params)
    unknown = sorted(set(conf or {}) - set(known))
    if unknown:
        raise BackfillError(
            f"unknown param {', '.join(f'`{name}`' for name in unknown)}: this DAG takes "
            f"{', '.join(known)}; nothing was done. Trigger it again with the names as listed"
        )


def _check_offsets(start: int, end: int) -> None:
    if end <= start:
        raise BackfillError(
            f"to_offset {end} is not above from_offset {start}: the range is [from_offset, "
            "to_offset), to_offset the first offset after it; nothing was done. Trigger "
            "again with to_offset above from_offset"
        )


def backfill_task(
    pipeline: str, conf_dir: str, topic: str, partition: int, start: int, end: int, reason: str
) -> dict[str, Any]:
    """Re-ingest one committed range, replacing its rows.

    Args:
        pipeline: The pipeline.
        conf_dir: The configuration directory.
        topic: The range's topic.
        partition: The range's partition.
        start: The first offset (the DAG's `from_offset`).
        end: The first offset after the range (`to_offset`).
        reason: Why; recorded in the ledger.

    Raises:
        BackfillError: If the range is not one, not committed, or held by no copy;
            nothing was changed.
    """
    from strata.operations.report import summary_dict
    from strata.run import reprocess

    _check_offsets(start, end)
    target = OffsetRange(topic, partition, start, end)
    outcome = reprocess(load_pipeline(pipeline, conf_dir), "backfill", [target], reason)
    return redact_json(summary_dict(outcome))


def _check_replay(
    from_batch: int | None,
    to_batch: int | None,
    target: tuple[str | None, int | None, int | None, int | None],
) -> None:
    """Refuse what JSON schema cannot: a replay takes batches, or one whole range."""
    names = ("topic", "partition", "from_offset", "to_offset")
    given = [name for name, value in zip(names, target, strict=True) if value is not None]
    missing = [name for name in names if name not in given]
    choose = (
        "give from_batch (and to_batch), or topic, partition, from_offset and to_offset; "
        "nothing was done"
    )
    if from_batch is None and to_batch is not None:
        wrong = f"to_batch {to_batch} was given without from_batch"
    elif from_batch is not None and given:
        wrong = f"both from_batch and {', '.join(given)} were given"
    elif from_batch is None and not given:
        wrong = "neither from_batch nor a range was given"
    elif missing and from_batch is None:
        were = "was" if len(missing) == 1 else "were"
        wrong = f"a range needs {', '.join(names)}; {', '.join(missing)} {were} not given"
    elif from_batch is not None and to_batch is not None and to_batch < from_batch:
        wrong = f"to_batch {to_batch} is below from_batch {from_batch}"
        choose = "give to_batch at least from_batch, or none for one batch; nothing was done"
    else:
        if target[2] is not None and target[3] is not None:
            _check_offsets(target[2], target[3])
        return
    raise BackfillError(f"{wrong}: {choose}")


def replay_task(
    pipeline: str,
    conf_dir: str,
    reason: str,
    from_batch: int | None = None,
    to_batch: int | None = None,
    target: tuple[str | None, int | None, int | None, int | None] = (None, None, None, None),
) -> dict[str, Any]:
    """Re-decode committed batches (or one range) from the raw copy, replacing their rows.

    Args:
        pipeline: The pipeline.
        conf_dir: The configuration directory.
        reason: Why; recorded in the ledger.
        from_batch: The first batch to replay, or None for a range.
        to_batch: The last batch; None is `from_batch`.
        target: Topic, partition, first offset and first offset after, for a range.

    Raises:
        BackfillError: Naming the DAG's params, if they name neither batches nor one
            range, or both; if the batches or the range are not committed, or not in
            the raw copy. Nothing was changed.
    """
    from strata.operations.backfill import replay_targets
    from strata.operations.report import summary_dict
    from strata.run import reprocess

    _check_replay(from_batch, to_batch, target)
    cfg = load_pipeline(pipeline, conf_dir)
    targets = replay_targets(cfg.places(), from_batch, to_batch, target)
    outcome = reprocess(cfg, "replay", targets, reason)
    return redact_json(summary_dict(outcome))


def compact_task(pipeline: str, conf_dir: str) -> dict[str, Any]:
    """Merge the small files of the pipeline's settled partitions (`strata.maintenance.compact`)."""
    from strata.edge import compact_pipeline

    return _each_table(pipeline, conf_dir, lambda cfg: redact_json(compact_pipeline(cfg).as_dict()))


def checkpoint_task(pipeline: str, conf_dir: str) -> dict[str, Any]:
    """Checkpoint the pipeline's Delta logs and delete their expired commits."""
    from strata.maintenance.vacuum import checkpoint

    return _each_table(
        pipeline, conf_dir, lambda cfg: redact_json(checkpoint(cfg.places()).as_dict())
    )


def vacuum_task(pipeline: str, conf_dir: str) -> dict[str, Any]:
    """Delete removed files past the retention, and files that can never be committed."""
    from strata.maintenance.vacuum import vacuum

    return _each_table(
        pipeline,
        conf_dir,
        lambda cfg: redact_json(
            vacuum(cfg.places(), cfg.maintenance.vacuum_retention, cfg.metastore).as_dict()
        ),
    )
