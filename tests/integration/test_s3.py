"""The same pipeline against a real S3 endpoint (moto_server on loopback)."""

from __future__ import annotations

import signal

from strata import faults
from strata.run import run_batch
from tests.conftest import expected_offsets, produce_clicks, s3_client, s3_landed, s3_pipeline
from tests.faults import armed


def test_a_batch_lands_in_s3_exactly_once(make_pipeline, broker, spark, s3_endpoint, tmp_path):
    p, options = s3_pipeline(make_pipeline, s3_endpoint, tmp_path, "wh1")
    per = produce_clicks(broker, p.topic, 2, 2000, malformed=3)
    outcome = run_batch(p.cfg(), session=lambda _: spark)
    assert outcome.status == "committed"
    assert p.cfg().location("table").startswith("s3://lake/wh1/")
    assert s3_landed(p, options) == expected_offsets(per)
    client = s3_client(s3_endpoint)
    keys = [
        o["Key"]
        for o in client.list_objects_v2(Bucket="lake", Prefix=f"wh1/{p.name}/dt=")["Contents"]
    ]
    assert keys and all("/hr=" in k and k.endswith(".snappy.parquet") for k in keys)
    assert run_batch(p.cfg(), session=lambda _: spark).status == "idle"


def test_a_crash_between_commits_on_s3_resumes_exactly_once(
    make_pipeline, broker, spark, s3_endpoint, tmp_path
):
    p, options = s3_pipeline(make_pipeline, s3_endpoint, tmp_path, "wh2")
    per = produce_clicks(broker, p.topic, 2, 2000)
    crashed = p.cli("run", env=p.env(**armed(crash_at=faults.AFTER_RAW_COMMIT)))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    # The killed run's lease names a process that is gone: the re-run takes it at once.
    assert run_batch(p.cfg(), session=lambda _: spark).status == "resumed"
    assert s3_landed(p, options) == expected_offsets(per)
