"""Print the installed file of a job: `spark-submit "$(python -m strata.jobs ingest)" ...`."""

from __future__ import annotations

import sys

from strata.jobs import job_path

if __name__ == "__main__":
    try:
        print(job_path(sys.argv[1] if len(sys.argv) > 1 else "ingest"))
    except ValueError as exc:
        print(f"strata: {exc}", file=sys.stderr)
        sys.exit(2)
