"""Strata ingest: one DAG per pipeline in `conf/pipelines/`.

Each run plans the next batch (ranges shown in the `plan` task's XCom), ingests it
with Spark, registers the tables in the metastore, and runs the batch's data-quality
suite: under the pipeline's `quality.gate: fail` a failed suite fails the run (the
batch stays committed; its event-time partitions are marked incomplete). Last, the
`complete` task marks the event-time partitions the batch completed and emits an
event of the table's Asset, `strata://<pipeline>/<table>`, listing them in its
`extra`; when the batch completed none, the task is skipped and no event is emitted,
so a DAG scheduled on the Asset runs after a batch that completed hours (one event
may list several; events emitted before its run starts all come to that run).
Batches are idempotent, so retries are safe: a retried task finishes the batch its
first attempt planned, exactly once. Each DAG runs on its pipeline's
`airflow.schedule`, a cron expression, a preset or a duration between the starts of
runs (`30s`). Runs never overlap (`max_active_runs=1`) and nothing is caught up:
each run reads what Kafka holds beyond the last commit.

Each pipeline's DAG can live in a file of its own, a copy or symlink of this file
named `strata_ingest_<pipeline>.py`: a malformed pipeline file then fails only its
own DAG file, and the others still load (see `pipelines_here`).

The Spark step runs in the worker (`airflow.spark_mode: local`) or is submitted to
a cluster with `SparkSubmitOperator` (`spark_submit`), per pipeline. Set
`STRATA_CONF_DIR` when the configuration is not beside this folder.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Asset, AssetAlias, Metadata, task

from strata.config import PipelineConfig, list_pipelines, load_pipelines
from strata.config.secrets import is_secret_key
from strata.durations import parse_duration_ms
from strata.errors import ConfigError

PROJECT = Path(__file__).resolve().parents[1]
CONF_DIR = os.environ.get("STRATA_CONF_DIR") or str(PROJECT / "conf")


def ingest_dag(cfg: PipelineConfig) -> DAG:
    """The ingest DAG of one pipeline."""
    name = cfg.name
    with DAG(
        dag_id=f"strata_ingest_{name}",
        doc_md=__doc__,
        schedule=cfg.airflow.dag_schedule,
        start_date=datetime(2026, 1, 1),
        catchup=False,
        max_active_runs=1,
        tags=["strata", "ingest", name],
        default_args={
            "retries": cfg.airflow.retries,
            "retry_delay": timedelta(milliseconds=parse_duration_ms(cfg.airflow.retry_delay)),
        },
    ) as dag:

        @task
        def plan() -> dict[str, object]:
            from strata.orchestrate import plan_task

            return plan_task(name, CONF_DIR)

        if cfg.airflow.spark_mode == "spark_submit":
            from airflow.providers.apache.spark.operators.spark_submit import (
                SparkSubmitOperator,
            )

            from strata.jobs import job_path

            ingest = SparkSubmitOperator(
                task_id="ingest",
                # The job installed with the package, wherever this file was copied.
                application=job_path("ingest"),
                # The pipeline's Spark properties, `spark.archives` (the executors'
                # packed environment) and `spark.pyspark.python` among them. Not its
                # credentials: the command line is logged and rendered, and the driver
                # takes them from the configuration itself.
                conf={k: v for k, v in cfg.spark.conf.items() if not is_secret_key(k)},
                application_args=[
                    "--pipeline",
                    name,
                    "--conf-dir",
                    CONF_DIR,
                    "--json",
                    "--no-register",
                ],
                conn_id=cfg.airflow.spark_conn_id,
                name=f"strata-{name}",
            )
        else:

            @task
            def ingest() -> dict[str, object]:
                from strata.orchestrate import ingest_task

                return ingest_task(name, CONF_DIR)

            ingest = ingest()

        @task
        def register() -> dict[str, object]:
            from strata.orchestrate import register_task

            return register_task(name, CONF_DIR)

        @task
        def quality_gate(planned: dict[str, object]) -> dict[str, object]:
            from airflow.sdk.exceptions import AirflowFailException

            from strata.errors import QualityGateFailed
            from strata.orchestrate import quality_gate_task

            try:
                return quality_gate_task(name, CONF_DIR, planned.get("batch"), planned)  # type: ignore[arg-type]
            except QualityGateFailed as exc:
                # A retry would check the same committed rows again: fail at once.
                raise AirflowFailException(str(exc)) from None

        # One Asset per table: a pipeline that routes its topics to tables names its
        # tables' Assets when they complete, through an alias.
        alias = AssetAlias(f"strata_{name}_tables") if cfg.routed else None
        asset = None if cfg.routed else Asset(cfg.asset_uri)

        # Its own Asset is an inlet too: the events already emitted say what was announced.
        @task(outlets=[alias or asset], inlets=[alias or asset])
        def complete(planned: dict[str, object]) -> Generator[Metadata, None, dict[str, object]]:
            from airflow.sdk import get_current_context
            from airflow.sdk.exceptions import AirflowSkipException

            from strata.orchestrate import announced_batches, complete_task

            context = get_current_context()
            emitted = context["inlet_events"][alias or asset].ascending(False).limit(1000)
            announced = announced_batches(emitted, context["dag"].dag_id)
            batch = planned.get("batch")
            found = complete_task(name, CONF_DIR, batch, planned, announced)  # type: ignore[arg-type]
            tables = found.get("tables", {name: found})
            announced = False
            for body in tables.values():
                if body.get("completed"):
                    announced = True
                    yield Metadata(
                        asset or Asset(body["asset"]),
                        {k: body.get(k) for k in ("batch", "completed", "watermark", "late")},
                        alias=alias,
                    )
            if not announced:
                # A skipped task emits no Asset event: downstream DAGs wait for an hour.
                raise AirflowSkipException("no partition became complete in this run")
            return found

        planned = plan()
        checked = planned >> ingest >> register() >> quality_gate(planned)
        checked >> complete(planned)
    return dag


def pipelines_here(dag_file: Path, conf_dir: str) -> list[str]:
    """The pipelines whose DAGs a copy of this file holds, by the copy's name.

    Airflow records import errors, and marks DAGs stale, per DAG file: in one file,
    one malformed pipeline would hide every pipeline's DAGs. A copy (or symlink) of
    this file named `strata_ingest_NAME.py` holds pipeline NAME's DAGs alone, so a
    malformed `NAME.yaml` fails that file only, named in its import error. This file
    holds the DAGs of every pipeline without a file of its own.
    """
    prefix = "strata_ingest_"
    if dag_file.stem.startswith(prefix):
        return [dag_file.stem.removeprefix(prefix)]
    apart = {f.stem.removeprefix(prefix) for f in dag_file.parent.glob(f"{prefix}*.py")}
    return [name for name in list_pipelines(conf_dir) if name not in apart]


_OWN = Path(__file__).stem.startswith("strata_ingest_")
# Each pipeline file is read once, and each pipeline's tables checked against the others'.
for _name, _cfg in load_pipelines(CONF_DIR, pipelines_here(Path(__file__), CONF_DIR)).items():
    if isinstance(_cfg, ConfigError):
        if _OWN:
            raise _cfg  # a pipeline's own file: its import error names the pipeline's file
        # The shared file leaves a malformed pipeline out, so the others still load;
        # `strata_config_errors.py` fails to import naming its file and key.
        continue
    _dag = ingest_dag(_cfg)
    globals()[_dag.dag_id] = _dag
