"""Strata maintenance: compaction, registration, log checkpoints and vacuum, daily.

For each pipeline in `conf/pipelines/`, in order:

1. `compact`: the small files of settled event-time partitions (and of the raw,
   quarantine and ledger tables) are merged into target-sized files, one Delta
   transaction per partition marked as no data change; ingest goes on beside it.
2. `register`: the metastore is set right where it drifted from storage (a table
   altered or a partition dropped by hand, a compacted partition whose move was
   interrupted), before vacuum deletes the directories compaction moved away from.
   With `airflow.trino_conn_id`, the pipeline's Trino DDL (`strata sql ddl`) then runs
   through that connection, creating whatever a Trino on another metastore lacks.
3. `checkpoint`: each Delta table's log gets a checkpoint and loses its expired
   commits, so opening a table costs the same on day 1 and on day 1,000.
4. `vacuum`: files removed longer ago than `maintenance.vacuum_retention` are
   deleted, and so are files of killed attempts that can never be committed.

Each step is also a command: `strata compact|register|checkpoint|vacuum --pipeline NAME`.
The quality suite is not here: it runs on each batch, in the ingest DAG.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, task

from strata.config import list_pipelines

CONF_DIR = os.environ.get("STRATA_CONF_DIR") or str(Path(__file__).resolve().parents[1] / "conf")

with DAG(
    dag_id="strata_maintenance",
    doc_md=__doc__,
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["strata", "maintenance"],
) as dag:
    for _name in list_pipelines(CONF_DIR):

        @task(task_id=f"compact_{_name}")
        def compact(pipeline: str = _name) -> dict[str, object]:
            from strata.orchestrate import compact_task

            return compact_task(pipeline, CONF_DIR)

        @task(task_id=f"register_{_name}")
        def register(pipeline: str = _name) -> dict[str, object]:
            from strata.orchestrate import register_task

            return register_task(pipeline, CONF_DIR, ddl=True)

        @task(task_id=f"checkpoint_{_name}")
        def checkpoint(pipeline: str = _name) -> dict[str, object]:
            from strata.orchestrate import checkpoint_task

            return checkpoint_task(pipeline, CONF_DIR)

        @task(task_id=f"vacuum_{_name}")
        def vacuum(pipeline: str = _name) -> dict[str, object]:
            from strata.orchestrate import vacuum_task

            return vacuum_task(pipeline, CONF_DIR)

        compact() >> register() >> checkpoint() >> vacuum()
