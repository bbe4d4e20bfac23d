"""Downstream of Strata, as a user writes it: a report per completed hour of each table.

One DAG per pipeline of `STRATA_CONF_DIR`, `hourly_report_<pipeline>`, scheduled on
the table's Asset `strata://<pipeline>/<table>` as docs/completeness.md shows: the
ingest DAG's `complete` task emits an event of it when a batch completed event-time
partitions, and the scheduler then starts this DAG with the event. Its one task
returns each triggering event's `extra` (batch, completed partitions, watermark,
late rows) as its XCom, for the scheduler tests to read through the REST API.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, Asset, task

from strata.config import PipelineConfig, load_pipelines


def hourly_report_dag(cfg: PipelineConfig) -> DAG:
    """The report DAG of one pipeline's table."""
    # A function per DAG, not the loop's body: the task must close over its own Asset.
    table = Asset(cfg.asset_uri)
    with DAG(
        dag_id=f"hourly_report_{cfg.name}",
        doc_md=__doc__,
        schedule=[table],
        start_date=datetime(2026, 1, 1),
        catchup=False,
        tags=["downstream", cfg.name],
    ) as dag:

        @task
        def report(triggering_asset_events: Any = None) -> list[dict[str, Any]]:
            return [dict(event.extra) for event in triggering_asset_events[table]]

        report()
    return dag


# A pipeline that routes to tables announces them through its alias: left out here.
for _cfg in load_pipelines(os.environ.get("STRATA_CONF_DIR", "conf")).values():
    if isinstance(_cfg, PipelineConfig) and not _cfg.routed:
        _dag = hourly_report_dag(_cfg)
        globals()[_dag.dag_id] = _dag
