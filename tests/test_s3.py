"""The same pipeline against a real S3 endpoint (moto_server on loopback)."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable

from strata.run import CRASH_ENV, run_batch
from tests.conftest import expected_offsets, produce_clicks, s3_client

pytestmark = pytest.mark.integration


def s3_pipeline(make_pipeline, url: str, tmp_path: Path, prefix: str):
    options = {
        "AWS_ENDPOINT_URL": url,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }
    return make_pipeline(
        partitions=2,
        overrides={
            "warehouse": f"s3://lake/{prefix}",
            "storage_options": options,
            "lock_dir": str(tmp_path / "locks"),
        },
    ), options


def landed(p, options) -> Counter:
    counts: Counter = Counter()
    for which in ("table", "quarantine"):
        t = DeltaTable(
            p.cfg().location(which), storage_options={**options, "conditional_put": "etag"}
        ).to_pyarrow_table(columns=["_partition", "_offset"])
        counts.update(
            zip(t.column("_partition").to_pylist(), t.column("_offset").to_pylist(), strict=True)
        )
    return counts


def test_a_batch_lands_in_s3_exactly_once(make_pipeline, broker, spark, s3_endpoint, tmp_path):
    p, options = s3_pipeline(make_pipeline, s3_endpoint, tmp_path, "wh1")
    per = produce_clicks(broker, p.topic, 2, 2000, malformed=3)
    outcome = run_batch(p.cfg(), session=lambda _: spark)
    assert outcome.status == "committed"
    assert p.cfg().location("table").startswith("s3://lake/wh1/")
    assert landed(p, options) == expected_offsets(per)
    client = s3_client(s3_endpoint)
    keys = [
        o["Key"]
        for o in client.list_objects_v2(Bucket="lake", Prefix=f"wh1/{p.name}/dt=")["Contents"]
    ]
    assert keys and all("/hr=" in k and k.endswith(".snappy.parquet") for k in keys)
    assert run_batch(p.cfg(), session=lambda _: spark).status == "idle"


def test_a_crash_between_commits_on_s3_resumes_exactly_once(
    make_pipeline, broker, s3_endpoint, tmp_path
):
    p, options = s3_pipeline(make_pipeline, s3_endpoint, tmp_path, "wh2")
    per = produce_clicks(broker, p.topic, 2, 2000)
    crashed = p.cli("run", env=p.env(**{CRASH_ENV: "after_raw_commit"}))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    rerun = p.cli("run")
    assert rerun.returncode == 0, rerun.stderr
    assert landed(p, options) == expected_offsets(per)
