"""How a batch is split into Spark tasks, decided before any Spark session exists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from strata.config import load_pipeline
from strata.spark.session import default_tasks, parallelism_from_conf
from tests.conftest import ROOT


def _cfg(tmp_path: Path, **overrides):
    (tmp_path / "conf" / "pipelines").mkdir(parents=True)
    body = {
        "topics": ["clicks"],
        "schema_file": "clicks.avsc",
        "schemas_dir": str(ROOT / "schemas"),
        "warehouse": "s3://lake/wh",
        "event_time": {"field": "ts"},
        **overrides,
    }
    (tmp_path / "conf" / "pipelines" / "clicks.yaml").write_text(yaml.safe_dump(body))
    return load_pipeline("clicks", tmp_path / "conf")


def test_the_cluster_size_comes_from_the_properties_that_set_it():
    assert parallelism_from_conf({"spark.default.parallelism": "12"}) == 12
    assert parallelism_from_conf({"spark.cores.max": "6"}) == 6
    sized = {"spark.executor.instances": "4", "spark.executor.cores": "3"}
    assert parallelism_from_conf(sized) == 12
    dynamic = {
        "spark.dynamicAllocation.enabled": "true",
        "spark.dynamicAllocation.maxExecutors": "5",
        "spark.executor.cores": "2",
        "spark.executor.instances": "1",
    }
    assert parallelism_from_conf(dynamic) == 10
    assert parallelism_from_conf({"spark.executor.cores": "2"}) is None
    assert parallelism_from_conf({}) is None


def _tasks(cfg) -> int:
    return default_tasks(cfg.spark, cfg.name, cfg.airflow.spark_mode == "spark_submit")


def test_the_override_and_local_masters(tmp_path):
    assert _tasks(_cfg(tmp_path / "a", spark={"master": "yarn", "tasks": 7})) == 7
    assert _tasks(_cfg(tmp_path / "b", spark={"master": "local[3,4]"})) == 3
    assert _tasks(_cfg(tmp_path / "c", spark={"master": "local"})) == 1
    # Airflow's plan task of a spark_submit pipeline: the batch runs on the cluster.
    submitted = {
        "master": "local[3]",
        "conf": {"spark.executor.instances": "2", "spark.executor.cores": "4"},
    }
    cfg = _cfg(tmp_path / "d", spark=submitted, airflow={"spark_mode": "spark_submit"})
    assert _tasks(cfg) == 8


def test_planning_for_an_unsized_cluster_starts_no_spark(tmp_path):
    _cfg(tmp_path, spark={"master": "spark://nowhere:7077"})
    # A fresh interpreter: no session of the test run may answer for the cluster. It
    # logs as a host does (Airflow's plan task): Strata adds no handler of its own.
    probe = (
        "import logging; logging.basicConfig(); "
        "import sys; from strata.config import load_pipeline; from strata.spark.session import "
        "default_tasks; from pyspark import SparkContext; "
        f"c = load_pipeline('clicks', {str(tmp_path / 'conf')!r}); "
        "n = default_tasks(c.spark, c.name); "
        "print(n, SparkContext._gateway is None)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "True"]
    assert "Set spark.tasks" in done.stderr


def test_workers_import_the_installed_pyspark_not_sparks_zip_of_it(tmp_path):
    import pyspark

    from strata.spark.daemon import prefer_installed_pyspark

    home = Path(pyspark.__file__).parent
    site = str(home.parent)
    lib = home / "python" / "lib"
    zips = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]
    jar = str(home / "jars" / "spark-core_2.13-4.0.0.jar")
    job = str(tmp_path / "job.zip")
    path = [*zips, jar, job, site]
    assert prefer_installed_pyspark(path) == [job, site, *zips]
    # Another Spark's zip (a cluster's own installation) keeps its place ahead.
    other = str(tmp_path / "spark" / "python" / "lib" / "pyspark.zip")
    assert prefer_installed_pyspark([other, jar, site]) == [other, jar, site]
    assert prefer_installed_pyspark([job, site]) == [job, site]
