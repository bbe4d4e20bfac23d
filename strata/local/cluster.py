"""A Spark standalone cluster on loopback, started from the pyspark wheel's own launcher.

One master and its workers, each a JVM started with `bin/spark-class`, as a deployment
starts them. Jobs reach it with `spark-submit --master spark://127.0.0.1:<port>`. The
workers run with an environment of their own: no virtualenv on PATH, no PYTHONPATH,
no PYSPARK_PYTHON, so the executors' Python is only what the job ships to them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Self

from strata.local.service import LocalService, Supervised, free_port


def spark_home() -> Path:
    """The Spark installation inside the pyspark package (jars, bin, python/lib)."""
    import pyspark

    return Path(pyspark.__file__).parent


def cluster_env(work: Path) -> dict[str, str]:
    """A clean environment for the cluster's JVMs: Java and Spark only."""
    keep = ("JAVA_HOME", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    java = shutil.which("java")
    path = [str(Path(java).resolve().parent)] if java else []
    env["PATH"] = os.pathsep.join([*path, "/usr/local/bin", "/usr/bin", "/bin"])
    env["SPARK_HOME"] = str(spark_home())
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["SPARK_LOG_DIR"] = str(work / "logs")
    env["SPARK_WORKER_DIR"] = str(work / "work")
    return env


def submit_command(
    master: str,
    pipeline: str,
    conf_dir: Path,
    archive: Path | None = None,
    executor_env: Mapping[str, str] | None = None,
) -> list[str]:
    """spark-submit of the installed ingest job, as the README tells users to write it.

    Args:
        master: The master URL.
        pipeline: The pipeline to run.
        conf_dir: Its configuration directory.
        archive: The executors' packed environment (`make dist`); None for a local
            master, whose workers run the driver's Python.
        executor_env: Environment variables for the executors (`spark.executorEnv.*`).

    Returns:
        The command; run it with `submit_env`.
    """
    from strata.jobs import job_path

    command = [str(Path(sys.executable).parent / "spark-submit"), "--master", master]
    command += ["--name", f"strata-{pipeline}"]
    if archive is not None:
        command += ["--archives", f"{archive}#environment"]
        command += ["--conf", "spark.pyspark.python=./environment/bin/python"]
        command += ["--conf", f"spark.pyspark.driver.python={sys.executable}"]
        command += ["--conf", "spark.executor.memory=1g"]
    for key, value in (executor_env or {}).items():
        command += ["--conf", f"spark.executorEnv.{key}={value}"]
    job = [job_path("ingest"), "--pipeline", pipeline, "--conf-dir", str(conf_dir), "--json"]
    return command + job


def submit_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment spark-submit runs in: the driver's Python is this one.

    spark-submit finds its Spark installation with the driver's Python; the executors'
    Python is the command's to set (`spark.pyspark.python`), not an inherited variable.
    """
    out = {k: v for k, v in env.items() if k != "PYSPARK_PYTHON"}
    out["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return out


class _Daemon(LocalService):
    """One Spark daemon (master or worker) in its own process group."""

    def __init__(self, name: str, log_path: Path) -> None:
        super().__init__(None, log_path)
        self.name = name

    @property
    def pid(self) -> int | None:
        """The daemon's process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    def launch(self, args: list[str], env: dict[str, str], timeout: float) -> None:
        spark_class = spark_home() / "bin" / "spark-class"
        self._spawn([str(spark_class), *args], env=env, detach=True)
        self._wait(timeout)

    def stop(self) -> None:
        """Stop the daemon and what it started (a worker's executors) with it."""
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGTERM)
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
            except ProcessLookupError:
                pass
        self._proc = None


class LocalSparkCluster(Supervised):
    """A standalone master and `workers` workers on loopback; a context manager.

    Attributes:
        url: The master URL for spark-submit.
        ui_url: The master's web UI (its `/json/` view lists workers and applications).
    """

    def __init__(self, work: Path, workers: int = 1, cores: int = 2, memory: str = "2g") -> None:
        """Choose ports and directories.

        Args:
            work: Directory for logs and the workers' scratch space.
            workers: How many workers.
            cores: Cores each worker offers.
            memory: Memory each worker offers to executors.
        """
        self.work = work
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self._master = _Daemon("Spark master", work / "logs" / "master.log")
        self._workers = [
            _Daemon(f"Spark worker {i}", work / "logs" / f"worker-{i}.log") for i in range(workers)
        ]
        self._ui_port = free_port()
        self.url = f"spark://127.0.0.1:{self._master.port}"
        self.ui_url = f"http://127.0.0.1:{self._ui_port}"

    def state(self) -> dict[str, object]:
        """The master's view of the cluster (workers, applications), from its web UI."""
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as answer:
            return dict(json.load(answer))

    def start(self, timeout: float = 90.0) -> Self:
        """Start the master, then the workers, and wait until every worker is alive."""
        try:
            return self._start(timeout)
        except BaseException:
            # `__exit__` does not run when `__enter__` fails: stop what did start.
            self.stop()
            raise

    def _start(self, timeout: float) -> Self:
        env = cluster_env(self.work)
        (self.work / "work").mkdir(parents=True, exist_ok=True)
        self._master.launch(
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self._master.port),
                "--webui-port",
                str(self._ui_port),
            ],
            env,
            timeout,
        )
        for worker in self._workers:
            worker.launch(
                [
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(worker.port),
                    "--webui-port",
                    str(free_port()),
                    "--cores",
                    str(self.cores),
                    "--memory",
                    self.memory,
                    "--work-dir",
                    str(self.work / "work"),
                    self.url,
                ],
                env,
                timeout,
            )
        deadline = time.monotonic() + timeout
        while True:
            try:
                workers = self.state().get("workers")
            except OSError:
                workers = None
            listed = workers if isinstance(workers, list) else []
            alive = [w for w in listed if isinstance(w, dict) and w.get("state") == "ALIVE"]
            if len(alive) >= self.workers:
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{len(alive)} of {self.workers} Spark workers registered")
            time.sleep(0.3)

    def worker_pids(self) -> list[int]:
        """The workers' process ids (their executors are their children)."""
        return [w.pid for w in self._workers if w.pid is not None]

    def stop(self) -> None:
        """Stop the workers (and their executors), then the master."""
        for worker in self._workers:
            worker.stop()
        self._master.stop()
