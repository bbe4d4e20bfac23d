r"""spark-submit entry point: run one batch of a pipeline (of each table, if it routes).

From a checkout, submit `jobs/ingest.py`, which hands over to this module. From an
installed package, submit this file; `python -m strata.jobs ingest` prints its path:

    spark-submit --master spark://master:7077 --name strata-clicks \
      --archives strata-executor-env.tar.gz#environment \
      --conf spark.pyspark.python=./environment/bin/python \
      --conf spark.pyspark.driver.python="$(which python)" \
      "$(python -m strata.jobs ingest)" --pipeline clicks --conf-dir conf --json

The driver runs in the Python environment where Strata is installed; the executors
run the packed environment `make dist` builds. Settings given to spark-submit win
over the pipeline's `spark` section.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from typing import Any

from strata.batch.outcome import RunOutcome
from strata.cli import run_guarded
from strata.config import PipelineConfig, load_pipeline
from strata.edge import alone, each_table, status_settings, then_each
from strata.log import configure as configure_logging
from strata.operations.metrics import after_run
from strata.operations.report import render_summary, summary_dict
from strata.run import run_batches
from strata.spark.session import build_session, submitted_master


def main() -> int:
    """Parse arguments, build the session, run the batch.

    Returns:
        The exit code: 0, or that of the error that stopped the run.
    """
    # Raw: the docstring's spark-submit example keeps its lines in --help.
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--pipeline", required=True, help="pipeline name (conf/pipelines/NAME.yaml)"
    )
    parser.add_argument(
        "--conf-dir", default="conf", help="configuration directory (default: conf)"
    )
    parser.add_argument(
        "--max-offsets", type=int, default=None, help="cap on offsets per partition for this batch"
    )
    parser.add_argument("--json", action="store_true", help="end the output with one JSON line")
    parser.add_argument(
        "--no-register",
        action="store_true",
        help="leave metastore registration to a later step (an Airflow register task)",
    )
    args = parser.parse_args()
    configure_logging()

    def run_tables(tables: list[PipelineConfig]) -> list[tuple[str, dict[str, Any]] | Exception]:
        first = tables[0]
        master = submitted_master() or first.spark.master
        if not master.startswith("local") and not first.spark.tasks:
            # Started before the plan, so the batch is split over the cluster's cores.
            build_session(first.spark, first.name)
        outcomes = run_batches(
            tables,
            max_offsets=args.max_offsets,
            session=lambda table: build_session(table.spark, table.name),
            register_tables=not args.no_register,
        )
        return then_each(tables, outcomes, after)

    def after(cfg: PipelineConfig, outcome: RunOutcome) -> tuple[str, dict[str, Any]]:
        # The same warnings and metrics as a run in the Airflow worker or at the prompt.
        after_run(cfg.places(), status_settings(cfg), cfg.metrics, outcome)
        return render_summary(outcome), summary_dict(outcome)

    # A pipeline routing its topics to tables runs all its tables in this one
    # application: their reads in one Spark job, their commits each its own.
    return run_guarded(
        lambda: each_table(
            load_pipeline(args.pipeline, args.conf_dir),
            "run",
            partial(alone, run_tables),
            run_tables,
        ),
        args.json,
    )


if __name__ == "__main__":
    sys.exit(main())
