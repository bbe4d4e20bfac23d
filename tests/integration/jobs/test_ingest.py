"""The spark-submit job (`strata/jobs/ingest.py`), as a user submits it."""

from __future__ import annotations

import json
import subprocess

from prometheus_client.parser import text_string_to_metric_families

from strata.local.cluster import submit_command, submit_env
from tests.conftest import expected_offsets, produce_clicks


def test_the_spark_submit_job_runs_a_batch(make_pipeline, broker, tmp_path):
    metrics = tmp_path / "textfile"
    metrics.mkdir()
    p = make_pipeline(partitions=2, overrides={"metrics": {"textfile_dir": str(metrics)}})
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
    # A submitted job writes the same metrics as a run in the worker.
    text = (metrics / f"strata_{p.name}.prom").read_text()
    read = {
        (s.name, s.labels.get("partition")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert sum(v for (n, part), v in read.items() if n == "strata_run_messages" and part) == sum(
        per.values()
    )
