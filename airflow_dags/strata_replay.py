"""Strata replay: re-decode committed batches from the raw copy, replacing their rows.

After a schema or decoder fix, the batches `from_batch` to `to_batch` (or one range:
`topic`, `partition`, `from_offset`, `to_offset`) are decoded again from the raw
copy with the current schema and decoder, and their rows replaced in the data and
quarantine tables, one transaction per table: quarantined messages that now decode
move into the data table. Kafka is not contacted, so a range its retention deleted
long ago replays as well. The ledger records the replay with its reason.

Trigger it by hand (UI: "Trigger DAG w/ config"; CLI: `airflow dags trigger
strata_replay --conf '{"pipeline": "clicks", "from_batch": 40, "to_batch": 48,
"reason": "INC-42 decoder fix"}'`). The task's XCom is the replay's summary.

`pipeline` and `reason` are required and every param is typed: Airflow refuses a
missing one, a value of the wrong type or out of bounds, or a pipeline that is not
configured, before the run starts. What a schema cannot say (batches or a whole
range, not both; `to_batch` not below `from_batch`; `to_offset` above
`from_offset`; a param name misspelt; batches not committed) fails the run at once,
without a retry and without touching a table; the task's log says which param to fix.
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
# The ledger's columns: a batch and an offset are int64s, a partition an int32.
MAX_BATCH = MAX_OFFSET = 2**63 - 1
MAX_PARTITION = 2**31 - 1
RANGE = "Or one offset range, instead of batches"

PARAMS = {
    # No default: with `schedule=None` Airflow checks params only at trigger time, so
    # an operator who names no pipeline is refused rather than replaying another's.
    "pipeline": Param(
        type="string",
        # An empty enum is not a schema: with no pipeline configured, any name is
        # accepted here and the task says the pipeline's file is missing.
        **({"enum": PIPELINES} if PIPELINES else {"minLength": 1}),
        description="The pipeline whose batches are replayed.",
    ),
    "reason": Param(
        type="string",
        minLength=3,
        description="Why (an incident, a decoder fix); recorded in the ledger.",
    ),
    "from_batch": Param(
        None,
        type=["null", "integer"],
        minimum=1,
        maximum=MAX_BATCH,
        description="The first batch to replay (`strata status` lists them).",
    ),
    "to_batch": Param(
        None,
        type=["null", "integer"],
        minimum=1,
        maximum=MAX_BATCH,
        description="The last batch to replay, not below from_batch; empty: from_batch alone.",
    ),
    "topic": Param(
        None,
        type=["null", "string"],
        minLength=1,
        section=RANGE,
        description="The Kafka topic of the range.",
    ),
    "partition": Param(
        None,
        type=["null", "integer"],
        minimum=0,
        maximum=MAX_PARTITION,
        section=RANGE,
        description="The partition of the range.",
    ),
    "from_offset": Param(
        None,
        type=["null", "integer"],
        minimum=0,
        maximum=MAX_OFFSET,
        section=RANGE,
        description="The first offset of the range.",
    ),
    "to_offset": Param(
        None,
        type=["null", "integer"],
        minimum=1,
        maximum=MAX_OFFSET,
        section=RANGE,
        description="The first offset after the range: above from_offset, and committed.",
    ),
}

with DAG(
    dag_id="strata_replay",
    doc_md=__doc__,
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["strata", "replay"],
    params=PARAMS,
) as dag:

    @task
    def replay() -> dict[str, object]:
        from strata.errors import BackfillError, ConfigError
        from strata.orchestrate import check_conf, replay_task

        context = get_current_context()
        p = context["params"]
        try:
            check_conf(context["dag_run"].conf, PARAMS)
            return replay_task(
                p["pipeline"],
                CONF_DIR,
                p["reason"],
                p["from_batch"],
                p["to_batch"],
                (p["topic"], p["partition"], p["from_offset"], p["to_offset"]),
            )
        except (BackfillError, ConfigError) as err:
            # The request itself is wrong, and nothing was changed: a retry would only
            # repeat the refusal.
            raise AirflowFailException(str(err)) from err

    replay()
