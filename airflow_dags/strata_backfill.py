"""Strata backfill: re-ingest one committed offset range of one partition.

Trigger it by hand (UI: "Trigger DAG w/ config"; CLI: `airflow dags trigger
strata_backfill --conf '{"pipeline": "clicks", "topic": "clicks", "partition": 3,
"from_offset": 1200, "to_offset": 5000, "reason": "INC-42 decoder fix"}'`). The
range's rows are replaced in one transaction per table, rows outside it are
untouched, and the ledger records the backfill with its reason. A range Kafka no
longer holds is read from the raw copy; one that neither holds fails and says so.

Every param is required and typed: Airflow refuses a missing one, a value of the
wrong type or out of bounds, or a pipeline that is not configured, before the run
starts. What a schema cannot say (`to_offset` above `from_offset`, a param name
misspelt, a range not committed yet) fails the run at once, without a retry and
without touching a table; the task's log says which param to fix.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, Param, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException

from strata.config import list_pipelines

CONF_DIR = os.environ.get("STRATA_CONF_DIR") or str(Path(__file__).resolve().parents[1] / "conf")
PIPELINES = list_pipelines(CONF_DIR)
# The ledger's columns: a partition is an int32, an offset an int64.
MAX_PARTITION = 2**31 - 1
MAX_OFFSET = 2**63 - 1

# No defaults: with `schedule=None` Airflow checks them only at trigger time, so an
# operator who leaves one out is refused rather than backfilling partition 0.
PARAMS = {
    "pipeline": Param(
        type="string",
        # An empty enum is not a schema: with no pipeline configured, any name is
        # accepted here and the task says the pipeline's file is missing.
        **({"enum": PIPELINES} if PIPELINES else {"minLength": 1}),
        description="The pipeline whose tables are backfilled.",
    ),
    "topic": Param(
        type="string",
        minLength=1,
        description="The Kafka topic of the range (one the pipeline reads).",
    ),
    "partition": Param(
        type="integer",
        minimum=0,
        maximum=MAX_PARTITION,
        description="The partition of the range.",
    ),
    "from_offset": Param(
        type="integer",
        minimum=0,
        maximum=MAX_OFFSET,
        description="The first offset of the range.",
    ),
    "to_offset": Param(
        type="integer",
        minimum=1,
        maximum=MAX_OFFSET,
        description="The first offset after the range: above from_offset, and committed.",
    ),
    "reason": Param(
        type="string",
        minLength=3,
        description="Why (an incident, a fix); recorded in the ledger.",
    ),
}

with DAG(
    dag_id="strata_backfill",
    doc_md=__doc__,
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["strata", "backfill"],
    params=PARAMS,
) as dag:

    @task
    def backfill() -> dict[str, object]:
        from strata.errors import BackfillError, ConfigError
        from strata.orchestrate import backfill_task, check_conf

        context = get_current_context()
        p = context["params"]
        try:
            check_conf(context["dag_run"].conf, PARAMS)
            return backfill_task(
                p["pipeline"],
                CONF_DIR,
                p["topic"],
                int(p["partition"]),
                int(p["from_offset"]),
                int(p["to_offset"]),
                p["reason"],
            )
        except (BackfillError, ConfigError) as err:
            # The request itself is wrong, and nothing was changed: a retry would only
            # repeat the refusal.
            raise AirflowFailException(str(err)) from err

    backfill()
