"""The job on a real Spark standalone cluster, submitted as the README tells users to.

A master and a worker started from the pyspark wheel on loopback; the executors run
the packed environment `make dist` builds (shipped with `--archives`), never the
driver's virtualenv; the warehouse is the S3 endpoint. Executors and drivers are
killed mid-batch, and every message must still land exactly once.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
import zipfile
from pathlib import Path

import psutil
import pytest

from strata import faults
from strata.batch.plan import PlanStore
from strata.local.cluster import LocalSparkCluster, spark_home, submit_command, submit_env
from strata.store.ledger import read_ledger
from tests.conftest import ROOT, expected_offsets, produce_clicks, s3_landed, s3_pipeline
from tests.faults import armed

CORES = 3  # not 2, the old fallback for any non-local master


@pytest.fixture(scope="module")
def executor_env(tmp_path_factory) -> Path:
    """The executors' packed environment, built by `make dist` as a user builds it."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        ["make", "-s", "dist", f"DIST={out}", f"EXECUTOR_ENV={out / 'env'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    archive = out / "strata-executor-env.tar.gz"
    assert archive.is_file()
    return archive


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalSparkCluster(tmp_path_factory.mktemp("cluster"), workers=1, cores=CORES) as c:
        yield c


def submit(
    cluster, archive: Path, p, executor_env: dict[str, str] | None = None, **env: str
) -> subprocess.Popen[str]:
    """spark-submit the installed job to the cluster, from an unrelated directory."""
    return subprocess.Popen(
        submit_command(cluster.url, p.name, p.conf_dir, archive, executor_env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=submit_env(p.env(**env)),
        cwd="/",
    )


def finish(proc: subprocess.Popen[str], timeout: float = 600) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def test_one_spark_version_python_and_jvm(spark):
    import pyspark

    assert pyspark.__version__ == spark.version
    # The executors' Python side comes from the Spark installation's own zip.
    with zipfile.ZipFile(spark_home() / "python" / "lib" / "pyspark.zip") as z:
        shipped = re.search(
            r"__version__\W*str\W*=\W*([\w.]+)", z.read("pyspark/version.py").decode()
        )
    assert shipped is not None and shipped.group(1) == spark.version


def test_an_executor_killed_mid_batch_is_retried_and_the_batch_is_exact(
    cluster, executor_env, make_pipeline, broker, s3_endpoint, tmp_path
):
    p, options = s3_pipeline(make_pipeline, s3_endpoint, tmp_path, "cluster-exec")
    per = produce_clicks(broker, p.topic, 2, 6_000, malformed=40)
    marker = tmp_path / "stopped-once"
    # The first task to close its files freezes its Python worker; the test then kills
    # that worker's executor JVM, as a lost node would.
    proc = submit(
        cluster,
        executor_env,
        p,
        armed(stop_at=faults.TASK_FILES_CLOSED, once=marker),
    )
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no task reached its files"
        time.sleep(0.2)
    worker_pid = int(marker.read_text().split()[-1])
    frozen = psutil.Process(worker_pid)
    executor = next(
        a for a in frozen.parents() if "CoarseGrainedExecutorBackend" in " ".join(a.cmdline())
    )
    # Not the driver's virtualenv: the executors run the shipped environment.
    assert frozen.cmdline()[0] == "./environment/bin/python", frozen.cmdline()
    for victim in (executor, *executor.children(recursive=True)):
        try:
            victim.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    code, out, err = finish(proc)
    assert code == 0, err[-3000:]
    assert s3_landed(p, options) == expected_offsets(per)
    # The batch was spread over the cluster's cores, not a fixed default.
    plan = PlanStore(p.cfg().places()).load(1)
    assert plan is not None and len(plan.splits) == CORES
    assert set(read_ledger(p.cfg().places()).column("batch").to_pylist()) == {1}


def test_a_driver_killed_mid_batch_is_finished_exactly_by_the_next_submit(
    cluster, executor_env, make_pipeline, broker, s3_endpoint, tmp_path
):
    p, options = s3_pipeline(make_pipeline, s3_endpoint, tmp_path, "cluster-driver")
    per = produce_clicks(broker, p.topic, 2, 4_000)
    crashed = submit(cluster, executor_env, p, **armed(crash_at=faults.AFTER_FILES))
    code, _, err = finish(crashed)
    assert code != 0
    assert read_ledger(p.cfg().places()).num_rows == 0  # killed after its files, before any commit
    planned = PlanStore(p.cfg().places()).load(1)
    assert planned is not None
    again = submit(cluster, executor_env, p)
    code, out, err = finish(again)
    assert code == 0, err[-3000:]
    # Both drivers ran their application on the cluster, not in a local session.
    apps = cluster.state()["activeapps"] + cluster.state()["completedapps"]
    assert [a["name"] for a in apps].count(f"strata-{p.name}") == 2
    assert s3_landed(p, options) == expected_offsets(per)
    ledger = read_ledger(p.cfg().places())
    assert set(ledger.column("batch").to_pylist()) == {1}
    # The re-run finished the saved plan, range for range.
    committed = sorted(
        zip(
            ledger.column("partition").to_pylist(),
            ledger.column("end_offset").to_pylist(),
            strict=True,
        )
    )
    assert committed == sorted((r.partition, r.end) for r in planned.ranges)
