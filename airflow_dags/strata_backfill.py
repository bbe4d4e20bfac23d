"""Strata backfill: re-ingest one committed offset range of one partition.

Trigger it by hand (UI: "Trigger DAG w/ config"; CLI: `airflow dags trigger
strata_backfill --conf '{"pipeline": "clicks", "topic": "clicks", "partition": 3,
"from_offset": 1200, "to_offset": 5000, "reason": "INC-42 decoder fix"}'`). The
range's rows are replaced in one transaction per table, rows outside it are
untouched, and the ledger records the backfill with its reason. A range Kafka no
longer holds is read from the raw copy; one that neither holds fails and says so.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, Param, get_current_context, task

from strata.config import list_pipelines

CONF_DIR = os.environ.get("STRATA_CONF_DIR") or str(Path(__file__).resolve().parents[1] / "conf")
PIPELINES = list_pipelines(CONF_DIR)

with DAG(
    dag_id="strata_backfill",
    doc_md=__doc__,
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["strata", "backfill"],
    params={
        "pipeline": Param(PIPELINES[0] if PIPELINES else "", type="string", enum=PIPELINES or [""]),
        "topic": Param("", type="string", minLength=1, description="Kafka topic"),
        "partition": Param(0, type="integer", minimum=0),
        "from_offset": Param(0, type="integer", minimum=0, description="first offset"),
        "to_offset": Param(1, type="integer", minimum=1, description="first offset after"),
        "reason": Param("", type="string", minLength=3, description="recorded in the ledger"),
    },
) as dag:

    @task
    def backfill() -> dict[str, object]:
        from strata.orchestrate import backfill_task

        p = get_current_context()["params"]
        return backfill_task(
            p["pipeline"],
            CONF_DIR,
            p["topic"],
            int(p["partition"]),
            int(p["from_offset"]),
            int(p["to_offset"]),
            p["reason"],
        )

    backfill()
