"""Shared fixtures: Apache Kafka, one Spark session, and pipelines in tmp dirs."""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
import yaml
from deltalake import DeltaTable
from pyiceberg.catalog.hive import HiveCatalog

from strata.config import PipelineConfig, load_pipeline
from strata.local.events import click_events, produce
from strata.local.kafka import LocalKafka
from strata.local.service import free_port
from strata.spark.jvm import driver_options, require_java
from strata.spark.session import local_session, session_defaults
from strata.store.files import filesystem
from strata.store.locations import current_files

ROOT = Path(__file__).resolve().parents[1]
START_MS = 1_763_805_600_000  # 2025-11-22T10:00:00Z

# Every variable Strata reads is named STRATA_*: the configuration's overrides
# (STRATA_WAREHOUSE, STRATA_KAFKA_BOOTSTRAP, STRATA_METASTORE_URI), the DAG files'
# STRATA_CONF_DIR, STRATA_LOG_LEVEL and the local registry's credentials; so are the
# variables that arm the tests' faults. A shell set up as the README advises for
# production exports some of them, and a test must not land in that warehouse or dial
# that broker.
PROJECT_PREFIX = "STRATA_"


def without_project_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """A copy of an environment without Strata's own variables."""
    return {k: v for k, v in environ.items() if not k.startswith(PROJECT_PREFIX)}


@pytest.fixture(autouse=True)
def _no_project_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees only the Strata variables it sets itself, never the shell's."""
    for name in [k for k in os.environ if k.startswith(PROJECT_PREFIX)]:
        monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def kafka(tmp_path_factory) -> Iterator[LocalKafka]:
    """Apache Kafka itself (one KRaft node on loopback), from the jars `make setup` fetched.

    One broker serves the whole session; each test makes topics of its own on it.
    """
    with LocalKafka(tmp_path_factory.mktemp("kafka")) as service:
        yield service


@pytest.fixture(scope="session")
def broker(kafka: LocalKafka) -> LocalKafka:
    """The broker every test's pipelines read (`make_pipeline` creates its topics there):
    the session's Apache Kafka. Its high watermark is the log end, so what a test produces
    is exactly what a batch reads."""
    return kafka


@pytest.fixture(scope="session")
def metastore(tmp_path_factory):
    from strata.local.metastore import LocalMetastore

    with LocalMetastore(tmp_path_factory.mktemp("metastore")) as service:
        yield service


@pytest.fixture(scope="session")
def spark():
    # The job's own session properties, with fewer shuffle partitions for tiny data.
    settings = session_defaults(driver_options(require_java()))
    session = local_session(
        "local[2,4]", {**settings, "spark.sql.shuffle.partitions": "2"}, "strata-tests"
    )
    yield session
    session.stop()


def s3_client(url: str):
    return boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id="test",
        aws_secret_access_key="test",
        region_name="us-east-1",
    )


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    client = s3_client(url)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.create_bucket(Bucket="lake")
            break
        except Exception:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(10)


def clicks_config(warehouse: Path | None = None, **overrides: Any):
    """The click pipeline `clicks` (in `warehouse` if given), configured in memory (no
    broker needed)."""
    from strata.config import EventTimeConfig, PipelineConfig

    if warehouse is not None:
        overrides["warehouse"] = str(warehouse)
    return PipelineConfig(
        name="clicks",
        topics=["clicks"],
        schema_file="clicks.avsc",
        schemas_dir=str(ROOT / "schemas"),
        event_time=EventTimeConfig(field="ts"),
        **overrides,
    )


def s3_pipeline(make_pipeline, url: str, tmp_path: Path, prefix: str, **overrides: Any):
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
            **overrides,
        },
    ), options


def s3_landed(p, options) -> Counter:
    counts: Counter = Counter()
    for which in ("table", "quarantine"):
        t = DeltaTable(
            p.cfg().location(which), storage_options={**options, "conditional_put": "etag"}
        ).to_pyarrow_table(columns=["_partition", "_offset"])
        counts.update(
            zip(t.column("_partition").to_pylist(), t.column("_offset").to_pylist(), strict=True)
        )
    return counts


def iceberg_table(cfg: PipelineConfig, which: str):
    """One of a pipeline's Iceberg tables as any pyiceberg reader loads it: through a
    Hive catalog of its own (not the one Strata commits with)."""
    opts = cfg.storage_options
    properties = {"uri": cfg.metastore.uri or ""}
    for ours, theirs in (
        ("AWS_ENDPOINT_URL", "s3.endpoint"),
        ("AWS_ACCESS_KEY_ID", "s3.access-key-id"),
        ("AWS_SECRET_ACCESS_KEY", "s3.secret-access-key"),
        ("AWS_REGION", "s3.region"),
    ):
        if ours in opts:
            properties[theirs] = opts[ours]
    catalog = HiveCatalog("readers", **properties)
    name = cfg.places().table(which).name  # type: ignore[arg-type]
    return catalog.load_table((cfg.metastore.database, name))


@dataclass
class Pipeline:
    """A pipeline configured in a temporary conf dir, against the session's Kafka."""

    name: str
    topic: str
    conf_dir: Path
    warehouse: Path
    bootstrap: str

    def cfg(self) -> PipelineConfig:
        return load_pipeline(self.name, self.conf_dir)

    def env(self, **extra: str) -> dict[str, str]:
        # A child process takes Strata's variables only from `extra`: the pipeline's
        # files, not the environment, say where it runs.
        env = without_project_variables(os.environ)
        env.update(extra)
        return env

    def cli(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """Run the installed `strata` command as a separate process."""
        return subprocess.run(
            [
                str(Path(sys.executable).parent / "strata"),
                *args,
                "--pipeline",
                self.name,
                "--conf-dir",
                str(self.conf_dir),
            ],
            capture_output=True,
            text=True,
            env=env or self.env(),
            timeout=timeout,
        )

    def spawn(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """Start the installed `strata` command as a separate process, without waiting."""
        return subprocess.Popen(
            [
                str(Path(sys.executable).parent / "strata"),
                *args,
                "--pipeline",
                self.name,
                "--conf-dir",
                str(self.conf_dir),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env or self.env(),
        )

    def table_rows(self, which: str, columns: list[str] | None = None):
        cfg = self.cfg()
        if cfg.table_format == "parquet" and which != "ledger":
            # What a Hive-style reader sees: every visible file of each partition's
            # directory in use (a compacted partition's is named by its marker).
            fs, root = filesystem(cfg.location(which), cfg.storage_options)
            paths = [f"{root}/{f.path}" for f in current_files(fs, root)]
            if not paths:
                return pa.table({c: pa.array([], pa.int64()) for c in columns or []})
            dataset = ds.dataset(
                paths, filesystem=fs, format="parquet", partitioning="hive", partition_base_dir=root
            )
            return dataset.to_table(columns=columns)
        if cfg.table_format == "iceberg" and which != "ledger":
            # What an Iceberg reader sees: pyiceberg's own scan of the current snapshot,
            # through a catalog of its own (not the one Strata commits with).
            return (
                iceberg_table(cfg, which).scan(selected_fields=tuple(columns or ("*",))).to_arrow()
            )
        return DeltaTable(cfg.location(which)).to_pyarrow_table(columns=columns)

    def landed(self) -> Counter[tuple[int, int]]:
        """How often each (partition, offset) landed as a row or a quarantined row."""
        counts: Counter[tuple[int, int]] = Counter()
        for which in ("table", "quarantine"):
            t = self.table_rows(which, ["_partition", "_offset"])
            counts.update(
                zip(
                    t.column("_partition").to_pylist(), t.column("_offset").to_pylist(), strict=True
                )
            )
        return counts

    def raw_copies(self) -> Counter[tuple[int, int]]:
        t = self.table_rows("raw", ["_partition", "_offset"])
        return Counter(
            zip(t.column("_partition").to_pylist(), t.column("_offset").to_pylist(), strict=True)
        )


def pipelines(directory: Path, broker: LocalKafka):
    """A factory of pipelines in `directory`, each on a topic of its own on `broker`: what
    `make_pipeline` gives a test, for a fixture of a wider scope than one test's."""

    def factory(
        partitions: int = 4, overrides: dict[str, Any] | None = None, create: bool = True
    ) -> Pipeline:
        name = "p_" + uuid.uuid4().hex[:8]
        topic = "t-" + name
        if create:
            broker.create_topic(topic, partitions)
        conf = directory / name / "conf"
        (conf / "pipelines").mkdir(parents=True)
        schemas = directory / name / "schemas"
        schemas.mkdir()
        shutil.copy(ROOT / "schemas" / "clicks.avsc", schemas / "clicks.avsc")
        warehouse = directory / name / "warehouse"
        body: dict[str, Any] = {
            "topics": [topic],
            "format": "json",
            "schema_file": "clicks.avsc",
            "warehouse": str(warehouse),
            "event_time": {"field": "ts", "unit": "ms"},
            "kafka": {"bootstrap_servers": broker.bootstrap, "timeout_s": 10},
            "limits": {"read_stall_s": 20},
            "spark": {"master": "local[2,4]"},
        }
        for key, value in (overrides or {}).items():
            if isinstance(value, dict) and isinstance(body.get(key), dict):
                body[key] = {**body[key], **value}
            else:
                body[key] = value
        (conf / "pipelines" / f"{name}.yaml").write_text(yaml.safe_dump(body))
        return Pipeline(name, topic, conf, warehouse, broker.bootstrap)

    return factory


@pytest.fixture
def make_pipeline(tmp_path: Path, broker: LocalKafka):
    """Create a topic and a pipeline reading it; returns a factory taking config overrides."""
    return pipelines(tmp_path, broker)


def produce_clicks(
    broker: LocalKafka,
    topic: str,
    partitions: int,
    count: int,
    *,
    start_ms: int = START_MS,
    hours: int = 3,
    seed: int = 7,
    **specials: int,
) -> dict[int, int]:
    """Produce click events round-robin over the partitions; returns messages per partition."""
    kinds = produce(
        broker.bootstrap,
        topic,
        partitions,
        click_events(count, start_ms, hours, seed=seed, **specials),
    )
    total = sum(kinds.values())
    return {p: len(range(p, total, partitions)) for p in range(partitions)}


def expected_offsets(
    per_partition: dict[int, int], first: dict[int, int] | None = None
) -> Counter[tuple[int, int]]:
    first = first or {}
    return Counter((p, o) for p, n in per_partition.items() for o in range(first.get(p, 0), n))


# py4j logs its shutdown at interpreter exit, after pytest closed the streams.
logging.getLogger("py4j").setLevel(logging.WARNING)

# Airflow reads its configuration when first imported: point it at a throw-away home,
# this project's DAG folder, and no examples, before any test imports it.
if "AIRFLOW_HOME" not in os.environ:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="strata-airflow-")
    atexit.register(shutil.rmtree, os.environ["AIRFLOW_HOME"], True)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(ROOT / "airflow_dags"))


@pytest.fixture(scope="session")
def airflow_db():
    """Airflow's metadata database (SQLite in the throw-away home), migrated once."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    yield os.environ["AIRFLOW_HOME"]


REGISTRY_USER = "strata"
REGISTRY_PASSWORD = "registry-password-Qx4"


@pytest.fixture(scope="session")
def schema_registry():
    """The local Schema Registry, asking for basic auth (REGISTRY_USER, REGISTRY_PASSWORD)."""
    from strata.local.schema_registry import LocalSchemaRegistry

    with LocalSchemaRegistry(username=REGISTRY_USER, password=REGISTRY_PASSWORD) as service:
        yield service


@pytest.fixture(scope="session")
def trino(tmp_path_factory, metastore, s3_endpoint):
    """Trino (one coordinator on loopback, from the server `make setup` fetched) on the
    session's metastore: catalogs `delta`, `hive` and `iceberg`, reading local files and
    the session's S3 endpoint (credentials as `s3_client`'s), so one server serves the
    tests of both. Started once: it takes 20 to 60 s on two cores."""
    from strata.local.trino import LocalTrino, ObjectStore

    store = ObjectStore(s3_endpoint, "test", "test", "us-east-1")
    directory = tmp_path_factory.mktemp("trino")
    # `elsewhere`: catalogs on a metastore of Trino's own too, where tables are registered.
    with LocalTrino(directory, metastore.uri, store=store, elsewhere=True) as service:
        yield service


@pytest.fixture(scope="session")
def delta_spark(tmp_path_factory):
    """delta-spark 4.4.0 (the jars `make setup` fetched) in a Spark session of its own,
    in a child process (`tests.delta_spark`: the shared `spark` session cannot take it):
    `sql(statement)` answers an Arrow table, `call(fn, *args)` runs `fn(session, *args)`
    there."""
    from tests.delta_spark import DeltaSpark

    with DeltaSpark(tmp_path_factory.mktemp("delta-spark")) as session:
        yield session
