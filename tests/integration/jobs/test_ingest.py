"""The spark-submit job (`strata/jobs/ingest.py`), as a user submits it."""

from __future__ import annotations

import json
import subprocess

from strata.local.cluster import submit_command, submit_env
from tests.conftest import expected_offsets, produce_clicks


def test_the_spark_submit_job_runs_a_batch(make_pipeline, broker):
    p = make_pipeline(partitions=2)
    per = produce_clicks(broker, p.topic, 2, 500)
    done = subprocess.run(
        submit_command("local[2]", p.name, p.conf_dir),
        capture_output=True,
        text=True,
        env=submit_env(p.env()),
        timeout=300,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["batch"] == 1
    assert p.landed() == expected_offsets(per)
