"""Strata maintenance: delete Delta files that were removed long enough ago.

Each pipeline's tables (data, raw copy, quarantine, ledger) are vacuumed daily with
the pipeline's `airflow.vacuum_retention`: files a backfill or compaction replaced
stay for time-travel readers until then.
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

        @task(task_id=f"vacuum_{_name}")
        def vacuum(pipeline: str = _name) -> dict[str, object]:
            from strata.orchestrate import vacuum_task

            return vacuum_task(pipeline, CONF_DIR)

        vacuum()
