"""Secrets on a cluster: a credential set through the environment is never printed.

Here `strata run` and `strata status` against a down broker, and a batch to a real S3
endpoint with every credential set. The configuration's reprs, its errors and the DAG
folder are checked in tests/unit/test_secrets.py.
"""

from __future__ import annotations

import json

import pytest

from strata.local.service import free_port
from tests.canaries import CANARIES, S3_SECRETS, SECRETS, assert_no_canary, merge
from tests.conftest import expected_offsets, produce_clicks, s3_landed, s3_pipeline


@pytest.fixture
def canaries(monkeypatch) -> dict[str, str]:
    for name, value in CANARIES.items():
        monkeypatch.setenv(name, value)
    return CANARIES


def test_run_and_status_against_a_down_broker_print_no_secret(make_pipeline, canaries):
    p = make_pipeline(
        create=False,
        overrides=merge(
            SECRETS, {"kafka": {"bootstrap_servers": f"127.0.0.1:{free_port()}", "timeout_s": 3}}
        ),
    )
    run = p.cli("run", "--json")
    assert run.returncode == 1 and "cannot reach the brokers" in run.stderr, run.stderr
    status = p.cli("status", "--json")
    assert status.returncode == 1 and "cannot reach the brokers" in status.stderr, status.stderr
    assert "lag unknown" in status.stdout
    assert_no_canary(run.stdout, run.stderr, status.stdout, status.stderr)


def test_a_batch_to_s3_with_every_credential_set_prints_none_of_them(
    make_pipeline, broker, s3_endpoint, tmp_path, canaries
):
    # moto accepts any key pair, so the canaries are the credentials Spark's tasks use.
    options = {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
        **S3_SECRETS,
    }
    p, _ = s3_pipeline(
        make_pipeline,
        s3_endpoint,
        tmp_path,
        "secrets",
        storage_options=options,
        kafka=SECRETS["kafka"],
        spark=SECRETS["spark"],
    )
    per = produce_clicks(broker, p.topic, 2, 300)
    run = p.cli("run", "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1])["batch"] == 1
    status = p.cli("status", "--json")
    assert status.returncode == 0, status.stderr[-3000:]
    assert_no_canary(run.stdout, run.stderr, status.stdout, status.stderr)
    assert s3_landed(p, p.cfg().storage_options) == expected_offsets(per)
