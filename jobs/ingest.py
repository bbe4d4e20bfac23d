"""spark-submit entry point from a checkout: run one batch of a pipeline.

    spark-submit --master local[2] jobs/ingest.py --pipeline clicks --conf-dir conf --json

The job is `strata.jobs.ingest`, in the package: this file only hands over to it, so a
checkout and an installed package (`spark-submit "$(python -m strata.jobs ingest)"`)
run the same code. The driver's Python must have Strata installed (`make setup`).
"""

from __future__ import annotations

import sys

from strata.jobs.ingest import main

if __name__ == "__main__":
    sys.exit(main())
