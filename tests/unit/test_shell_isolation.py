"""Tests see none of Strata's variables from the shell that runs them, unless they set them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from strata.config import ENV_BOOTSTRAP, ENV_METASTORE, ENV_WAREHOUSE, load_pipeline
from strata.log import LEVEL_ENV
from tests.conftest import ROOT, Pipeline

# A shell set up for production, as the README's deployment section advises.
PRODUCTION_SHELL = {
    ENV_WAREHOUSE: "/tmp/strata-production-warehouse",
    ENV_BOOTSTRAP: "127.0.0.1:1",
    ENV_METASTORE: "thrift://127.0.0.1:1",
    "STRATA_CONF_DIR": "/nonexistent/conf",
    LEVEL_ENV: "ERROR",
}


def test_no_project_variable_reaches_a_test():
    assert sorted(k for k in os.environ if k.startswith("STRATA_")) == []


def test_the_shipped_pipeline_keeps_its_own_warehouse_and_broker():
    defaults = yaml.safe_load((ROOT / "conf" / "strata.yaml").read_text())
    cfg = load_pipeline("clicks", ROOT / "conf")
    assert cfg.location("table") == str(ROOT / defaults["warehouse"] / "clicks")
    assert cfg.kafka.bootstrap_servers == defaults["kafka"]["bootstrap_servers"]


def test_a_shell_set_up_for_production_changes_no_test():
    # The two tests above, in a pytest whose shell exports the production variables:
    # without the clearing fixture both fail.
    here = Path(__file__).relative_to(ROOT)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"{here}::test_no_project_variable_reaches_a_test",
            f"{here}::test_the_shipped_pipeline_keeps_its_own_warehouse_and_broker",
        ],
        cwd=ROOT,
        env={**os.environ, **PRODUCTION_SHELL},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout


def test_a_variable_the_test_sets_is_seen_in_process_but_not_by_a_pipelines_process(
    monkeypatch, tmp_path
):
    monkeypatch.setenv(ENV_WAREHOUSE, "s3://lake/wh")
    assert os.environ[ENV_WAREHOUSE] == "s3://lake/wh"
    p = Pipeline("clicks", "clicks", tmp_path / "conf", tmp_path / "warehouse", "127.0.0.1:1")
    env = p.env(**{ENV_METASTORE: "thrift://127.0.0.1:9083"})
    # The child runs where the pipeline's files say; only what the test passes goes.
    assert sorted(k for k in env if k.startswith("STRATA_")) == [ENV_METASTORE]
    assert env[ENV_METASTORE] == "thrift://127.0.0.1:9083"
    assert env["PATH"] == os.environ["PATH"]
