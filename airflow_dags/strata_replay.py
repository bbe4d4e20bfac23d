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
    dag_id="strata_replay",
    doc_md=__doc__,
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["strata", "replay"],
    params={
        "pipeline": Param(PIPELINES[0] if PIPELINES else "", type="string", enum=PIPELINES or [""]),
        "from_batch": Param(
            None, type=["null", "integer"], minimum=1, description="first batch to replay"
        ),
        "to_batch": Param(
            None, type=["null", "integer"], minimum=1, description="last batch (default: first)"
        ),
        "topic": Param(None, type=["null", "string"], description="or a range: its topic"),
        "partition": Param(None, type=["null", "integer"], minimum=0),
        "from_offset": Param(None, type=["null", "integer"], minimum=0, description="first offset"),
        "to_offset": Param(
            None, type=["null", "integer"], minimum=1, description="first offset after"
        ),
        "reason": Param("", type="string", minLength=3, description="recorded in the ledger"),
    },
) as dag:

    @task
    def replay() -> dict[str, object]:
        from strata.orchestrate import replay_task

        p = get_current_context()["params"]
        return replay_task(
            p["pipeline"],
            CONF_DIR,
            p["reason"],
            p["from_batch"],
            p["to_batch"],
            (p["topic"], p["partition"], p["from_offset"], p["to_offset"]),
        )

    replay()
