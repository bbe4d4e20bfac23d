"""A local Trino: one coordinator that is its own worker, on loopback, on the local metastore.

The Trino users query Strata's tables with. Its catalogs read the Hive Metastore it is
given (`strata.local.metastore.LocalMetastore` in the tests and the playground):

- `delta`: the Delta Lake connector, which reads each Delta table the metastore lists
  (`spark.sql.sources.provider=delta`, as `strata register` records them) from its log;
- `iceberg`: the Iceberg connector on the metastore (`iceberg.catalog.type=hive_metastore`);
- `hive`: the Hive connector, for plain Parquet tables; it hands a Delta or Iceberg
  table to the catalog above that reads it, where by itself it would refuse it.

The Delta and Iceberg catalogs have their `register_table` procedure enabled, as
`strata sql ddl` prints it for a Trino on another metastore. Asked for (`elsewhere`),
three more catalogs are such a Trino's: `delta_elsewhere`, `hive_elsewhere` and
`iceberg_elsewhere` keep their tables in a metastore of Trino's own (a file metastore
in its directory), which Strata never registers in. Every catalog reads local files
(`file:` locations) and, when asked (`ObjectStore`), one S3 endpoint.

The server (`io.trino:trino-server`, pinned in `jvm/trino/pom.xml`) is fetched once by
`make setup` into the user's cache (`trino_home`), its checksum checked, with only the
hive, delta-lake and iceberg plugins kept; nothing here fetches anything. Trino 476
needs Java 24 or newer, found at run time (`trino_java`), not the Java 17 Spark runs on.

Everything lives in the directory the caller gives: `etc/` (the server's and the
catalogs' properties), `data/` (Trino's data directory, its HTTP request log
included) and the server's own log (`server.log`). The HTTP server is bound to
127.0.0.1 only: by default Trino listens on every interface.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata.errors import JavaMissing, StrataError
from strata.local.jvm_cache import fetched, jvm_cache
from strata.local.service import LocalService

# The version jvm/trino/pom.xml pins (`trino.version`); a unit test holds them equal.
TRINO_VERSION = "476"
# The oldest Java the server runs on (Trino 476's launcher refuses older ones).
JAVA_FEATURE = 24
# Names a JDK (its home) to run Trino on, before the standard folders are searched.
JAVA_HOME_VARIABLE = "STRATA_TRINO_JAVA_HOME"
# Where JDKs are installed beside the system's default one: Debian's and Ubuntu's
# packages (Adoptium's Temurin included), other Linux layouts, macOS.
JVM_FOLDERS = (
    Path("/usr/lib/jvm"),
    Path("/usr/local/lib/jvm"),
    Path("/opt/java"),
    Path("/Library/Java/JavaVirtualMachines"),
)
LOOPBACK = "127.0.0.1"
# The user the local stack's statements run as: no authentication on loopback.
USER = "strata"
# The catalogs' names, as `trino.*_catalog` defaults to them (strata.config).
DELTA, HIVE, ICEBERG = "delta", "hive", "iceberg"
# What the catalogs on a metastore of Trino's own are named: each of the above and this.
ELSEWHERE = "_elsewhere"
# Trino's data directory and its JVM's heap: a small one, for small tables on a laptop.
HEAP = "1G"

# Trino's recommended JVM options (its jvm.config) less the large heap, with the IPv4
# stack so that the loopback socket reads as 127.0.0.1; and the quick compiler and the
# serial collector instead of the optimising compiler and G1, as for Spark's driver
# (strata.spark.jvm): the local tables are small, and on two cores C2's and G1's
# threads cost half of the start-up's CPU (about 20 s of CPU to about 11 s, ready in
# half the time).
JVM_OPTIONS = (
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    "-XX:+ExitOnOutOfMemoryError",
    "-XX:-OmitStackTraceInFastThrow",
    "-XX:ReservedCodeCacheSize=256M",
    "-XX:PerMethodRecompilationCutoff=10000",
    "-XX:PerBytecodeRecompilationCutoff=10000",
    "-XX:+EnableDynamicAgentLoading",
    "-Djdk.attach.allowAttachSelf=true",
    "-Djdk.nio.maxCachedBufferSize=2000000",
    "-Dfile.encoding=UTF-8",
    "-Djava.net.preferIPv4Stack=true",
    # A session's zone is the server's unless the client names one: UTC, the zone of
    # Strata's timestamps and of the embedded engine's sessions, whatever the machine's.
    "-Duser.timezone=UTC",
    # JNA (Trino's system information) loads native code; without this the JVM warns.
    "--enable-native-access=ALL-UNNAMED",
)
MAIN_CLASS = "io.trino.server.TrinoServer"

# Quiet enough to read: Trino's start-up steps and every warning and error, not the
# table of every configuration property (`Bootstrap`) nor a line per query.
LOG_LEVELS = """\
Bootstrap=WARN
io.trino=INFO
io.trino.event.QueryMonitor=WARN
io.airlift=WARN
org.apache.hadoop=WARN
org.eclipse.jetty=WARN
"""


class TrinoMissing(StrataError):
    """The Trino server is not in the cache `make setup` fills."""


@dataclass(frozen=True)
class ObjectStore:
    """An S3 endpoint the catalogs read `s3://` locations from (moto's in the tests).

    Attributes:
        endpoint: `http://host:port` of the endpoint.
        access_key: The access key id.
        secret_key: The secret access key; written only into the catalogs' files.
        region: The region the endpoint answers for.
    """

    endpoint: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"

    def properties(self) -> dict[str, str]:
        """Trino's native S3 file system on this endpoint, path-style (as moto serves)."""
        return {
            "fs.native-s3.enabled": "true",
            "s3.endpoint": self.endpoint,
            "s3.path-style-access": "true",
            "s3.region": self.region,
            "s3.aws-access-key": self.access_key,
            "s3.aws-secret-key": self.secret_key,
        }


def trino_home() -> Path:
    """Where `make setup` unpacks the Trino server: the user's cache, outside any clone."""
    return jvm_cache(f"trino-server-{TRINO_VERSION}")


def trino_server() -> Path:
    """The unpacked server, from the cache `make setup` filled.

    Raises:
        TrinoMissing: If the cache is missing or was never completed.
    """
    return fetched(trino_home().name, f"the Trino server {TRINO_VERSION}", "trino", TrinoMissing)


def java_feature(java: Path) -> int | None:
    """The feature release of a `java` executable (17, 25...), or None if it does not run."""
    try:
        done = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)', done.stderr)
    return int(match.group(1)) if done.returncode == 0 and match else None


def _installed_javas() -> Iterator[Path]:
    """Every `java` of the standard JVM folders, then the default one's."""
    for folder in JVM_FOLDERS:
        if folder.is_dir():
            for home in sorted(folder.iterdir()):
                for java in (home / "bin" / "java", home / "Contents" / "Home" / "bin" / "java"):
                    if java.is_file():
                        yield java
    default = os.environ.get("JAVA_HOME")
    if default:
        yield Path(default) / "bin" / "java"


def trino_java() -> str:
    """The `java` Trino runs on: `STRATA_TRINO_JAVA_HOME`'s, else the newest Java 24+ found.

    Spark runs on the system's Java (17 or newer); Trino 476 needs 24 or newer, which
    is usually installed beside it, so the standard JVM folders are searched too.

    Raises:
        JavaMissing: If `STRATA_TRINO_JAVA_HOME` is not a Java 24+, or none is found.
    """
    named = os.environ.get(JAVA_HOME_VARIABLE)
    if named:
        java = Path(named) / "bin" / "java"
        feature = java_feature(java)
        if feature is None or feature < JAVA_FEATURE:
            found = "does not run" if feature is None else f"is Java {feature}"
            raise JavaMissing(
                f"{JAVA_HOME_VARIABLE}={named}: {java} {found}; Trino {TRINO_VERSION} needs "
                f"Java {JAVA_FEATURE} or newer. Point it at such a JDK's home, or unset it "
                "to use the newest one installed"
            )
        return str(java)
    best: tuple[int, Path] | None = None
    for java in dict.fromkeys(p.resolve() for p in _installed_javas()):
        feature = java_feature(java)
        if feature is not None and feature >= JAVA_FEATURE and (best is None or feature > best[0]):
            best = (feature, java)
    if best is None:
        folders = ", ".join(str(f) for f in JVM_FOLDERS)
        raise JavaMissing(
            f"no Java {JAVA_FEATURE} or newer found (searched {folders} and JAVA_HOME): Trino "
            f"{TRINO_VERSION} needs one. Install a JDK {JAVA_FEATURE}+ beside the Java 17 "
            f"Spark uses (Eclipse Temurin 25, temurin-25-jdk from Adoptium's packages) and, "
            f"if it is elsewhere, set {JAVA_HOME_VARIABLE} to its home"
        )
    return str(best[1])


def catalogs(
    metastore_uri: str, store: ObjectStore | None = None, elsewhere: Path | None = None
) -> dict[str, dict[str, str]]:
    """Each catalog's properties (`etc/catalog/NAME.properties`), on one metastore.

    Args:
        metastore_uri: `thrift://host:port` of the Hive Metastore.
        store: An S3 endpoint the catalogs read too; local files only if None.
        elsewhere: A directory for a metastore of Trino's own: with it, the catalogs
            `delta_elsewhere`, `hive_elsewhere` and `iceberg_elsewhere` keep their
            tables there, as a Trino whose catalogs use another metastore than Strata's.
    """
    files = store.properties() if store is not None else {}
    # Trino's own local file system reads `file:` locations, but lists a directory's
    # files as `local:` ones, which the Hive connector then finds outside the partition
    # and skips: a plain Parquet table would read as empty. Hadoop's lists them as they
    # are; the Delta and Iceberg connectors read the files their logs name, never a
    # listing, and keep Trino's own.
    native = {"fs.native-local.enabled": "true", "local.location": "/", **files}
    hadoop = {"fs.hadoop.enabled": "true", **files}
    shared = {"hive.metastore.uri": metastore_uri}
    delta = {"connector.name": "delta_lake", "delta.register-table-procedure.enabled": "true"}
    hive = {"connector.name": "hive"}
    iceberg = {"connector.name": "iceberg", "iceberg.register-table-procedure.enabled": "true"}
    out = {
        DELTA: {**delta, **shared, **native},
        # A Delta or Iceberg table the Hive connector would refuse ("Cannot query Delta
        # Lake table") is read through the catalog of its format instead.
        HIVE: {
            **hive,
            **shared,
            **hadoop,
            "hive.delta-lake-catalog-name": DELTA,
            "hive.iceberg-catalog-name": ICEBERG,
        },
        ICEBERG: {**iceberg, "iceberg.catalog.type": "hive_metastore", **shared, **native},
    }
    if elsewhere is None:
        return out
    # Trino's file metastore (one folder per schema and table), which the Iceberg
    # connector calls its testing one: a metastore no Strata run writes to.
    folder = elsewhere.resolve()
    own = {"hive.metastore": "file", "hive.metastore.catalog.dir": f"local://{folder}"}
    out[DELTA + ELSEWHERE] = {**delta, **own, **native}
    out[HIVE + ELSEWHERE] = {
        **hive,
        **own,
        "hive.metastore.catalog.dir": f"file://{folder}",
        **hadoop,
        "hive.delta-lake-catalog-name": DELTA + ELSEWHERE,
        "hive.iceberg-catalog-name": ICEBERG + ELSEWHERE,
    }
    out[ICEBERG + ELSEWHERE] = {
        **iceberg,
        "iceberg.catalog.type": "TESTING_FILE_METASTORE",
        "hive.metastore.catalog.dir": f"local://{folder}",
        **native,
    }
    return out


def server_properties(port: int, directory: Path, server: Path) -> dict[str, str]:
    """The coordinator's `config.properties`: one node, its HTTP server on loopback alone."""
    return {
        "coordinator": "true",
        "node-scheduler.include-coordinator": "true",
        "node.environment": "strata_local",
        # Bound to loopback and announced there; Trino's default is every interface.
        "node.bind-ip": LOOPBACK,
        "node.internal-address": LOOPBACK,
        "http-server.http.port": str(port),
        "discovery.uri": f"http://{LOOPBACK}:{port}",
        # The heartbeat failure detector drops a node whose pings time out, for queries
        # to go to the others; a cluster of one has no other, and would only be emptied.
        "failure-detector.enabled": "false",
        "http-server.log.path": str(request_log(directory)),
        "plugin.dir": str(server / "plugin"),
        "catalog.config-dir": str(directory / "etc" / "catalog"),
    }


def request_log(directory: Path) -> Path:
    """Where the server in `directory` logs each HTTP request it answered."""
    return directory / "data" / "var" / "log" / "http-request.log"


def schedules_catalogs(log: str) -> bool:
    """Whether Trino's node manager has refreshed since the node announced itself, by the
    requests in its HTTP request log (`request_log`).

    The node announces itself, with its catalogs, as the server finishes starting, and
    the node manager reads the announcements every 5 s, each time asking every node
    its state (`GET /v1/info/state`). Until the first of those after the announcement,
    `SELECT 1` answers but a query reading a catalog's table finds no node to run on
    (NO_NODES_AVAILABLE).
    """
    announced = False
    for line in log.splitlines():
        fields = line.split("\t")
        if len(fields) < 4:
            continue
        method, path = fields[2], fields[3]
        if method == "PUT" and path.startswith("/v1/announcement/"):
            announced = True
        elif announced and method == "GET" and path == "/v1/info/state":
            return True
    return False


def _properties(settings: Mapping[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in settings.items())


class LocalTrino(LocalService):
    """A Trino coordinator (its own worker) on loopback; a context manager.

    Ready once it answers `SELECT 1` through its HTTP API, as a client sees it, not
    merely once its port opens (it does so long before it has loaded its catalogs), and
    once a query reading a catalog's table would find a node (`schedules_catalogs`).
    """

    name = "Trino server"

    def __init__(
        self,
        directory: Path,
        metastore_uri: str,
        port: int | None = None,
        store: ObjectStore | None = None,
        heap: str = HEAP,
        elsewhere: bool = False,
    ) -> None:
        """Choose the server's directory, its metastore, its port and its heap.

        Args:
            directory: Where `etc/`, `data/` and `server.log` go.
            metastore_uri: `thrift://host:port` of the Hive Metastore every catalog reads.
            port: The HTTP port clients use; a free one if None.
            store: An S3 endpoint the catalogs read too; local files only if None.
            heap: The JVM's maximum heap (`-Xmx`), such as `1G`.
            elsewhere: Add the catalogs of a Trino on another metastore (`catalogs`),
                whose metastore is `metastore/` in `directory`.
        """
        self.directory = directory.resolve()
        super().__init__(port, self.directory / "server.log")
        self.metastore_uri = metastore_uri
        self.store = store
        self.heap = heap
        self.elsewhere = self.directory / "metastore" if elsewhere else None
        self.url = f"http://{LOOPBACK}:{self.port}"

    def configure(self, server: Path) -> list[str]:
        """Write `etc/` for the server in `server`; the command line that starts it."""
        etc = self.directory / "etc"
        catalog_dir = etc / "catalog"
        catalog_dir.mkdir(parents=True, exist_ok=True)
        (self.directory / "data").mkdir(exist_ok=True)
        config = etc / "config.properties"
        config.write_text(_properties(server_properties(self.port, self.directory, server)))
        levels = etc / "log.properties"
        levels.write_text(LOG_LEVELS)
        for stale in catalog_dir.glob("*.properties"):
            stale.unlink()
        if self.elsewhere is not None:
            self.elsewhere.mkdir(parents=True, exist_ok=True)
        for name, settings in catalogs(self.metastore_uri, self.store, self.elsewhere).items():
            path = catalog_dir / f"{name}.properties"
            path.write_text(_properties(settings))
            # It may hold the object store's secret key.
            path.chmod(0o600)
        return [
            trino_java(),
            f"-Xmx{self.heap}",
            *JVM_OPTIONS,
            "-cp",
            f"{server / 'lib'}/*",
            f"-Dconfig={config}",
            f"-Dlog.levels-file={levels}",
            MAIN_CLASS,
        ]

    def start(self, timeout: float = 300.0) -> LocalTrino:
        """Write the configuration, start the server, and wait until it answers a query.

        Args:
            timeout: Seconds to wait for the first answer.

        Raises:
            TrinoMissing: If `make setup` has not fetched the server.
            JavaMissing: If there is no Java 24 or newer.
            RuntimeError: With the tail of `server.log`, if the server exits or does
                not answer within `timeout` seconds.
        """
        if self._proc is not None and self._proc.poll() is None:
            raise RuntimeError(f"the Trino server at {self.url} is already running")
        command = self.configure(trino_server())
        # Trino's data directory is its working directory (the launcher's `--data-dir`).
        self._spawn(command, cwd=self.directory / "data")
        self._wait(timeout)
        deadline = time.monotonic() + timeout
        while not (self._answers() and self._schedules_catalogs()):
            assert self._proc is not None
            if self._proc.poll() is not None:
                self._fail(f"the {self.name} exited with {self._proc.returncode}")
            if time.monotonic() > deadline:
                self._fail(f"the {self.name} did not answer a query within {timeout:.0f}s")
            time.sleep(0.5)
        return self

    def _schedules_catalogs(self) -> bool:
        """Whether a query reading a catalog's table finds the node (`schedules_catalogs`)."""
        try:
            return schedules_catalogs(request_log(self.directory).read_text())
        except FileNotFoundError:
            return False

    def _answers(self) -> bool:
        """Whether `SELECT 1` answers 1; Trino refuses queries until it has started."""
        try:
            return self.query("SELECT 1") == [(1,)]
        except Exception:  # noqa: BLE001 - starting: HTTP 503, connection errors, refusals
            return False

    def query(
        self, statement: str, catalog: str | None = None, schema: str | None = None
    ) -> list[tuple[Any, ...]]:
        """Run one statement as `USER` and return every row it answers.

        Args:
            statement: The statement, as Trino takes it, without a terminating semicolon.
            catalog: The session's catalog, for unqualified names.
            schema: The session's schema, for unqualified names.

        Raises:
            trino.exceptions.TrinoQueryError: If Trino refuses or fails the statement.
        """
        import trino

        conn = trino.dbapi.connect(  # type: ignore[no-untyped-call]
            host=LOOPBACK,
            port=self.port,
            user=USER,
            catalog=catalog,
            schema=schema,
            request_timeout=60,
        )
        try:
            cursor = conn.cursor()
            cursor.execute(statement)
            return [tuple(row) for row in cursor.fetchall()]
        finally:
            conn.close()
