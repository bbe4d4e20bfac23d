"""A local Apache Kafka: one KRaft node (broker and controller in one process) on loopback.

The broker users run, and the one the integration tests run on: what Kafka does and
the local broker of the demo (`strata.local.broker`, Tansu) does not, they see as users
do: exact high watermarks, transactions and `read_committed`, `offsets_for_times`,
retention and compaction, DeleteRecords, CreatePartitions, a log that outlives a crash.

Its jars (`kafka_2.13` and `kafka-tools`, pinned in `jvm/kafka/pom.xml`) are fetched
once by `make setup` into the user's cache (`kafka_home`), checked against the
committed checksums; nothing here fetches anything, and a missing cache is an error
that names `make setup`.

Everything lives in the directory the caller gives: `server.properties`, the log4j
configuration, the partitions' logs (`data/`) and the server's own log
(`server.log`), so a test can restart the broker on the same log and read what it
said. Every listener is bound to 127.0.0.1. Its JMX agent is started only when a
metric is read, through `jcmd`, bound to loopback: the JVM's `-Dcom.sun.management`
options would also open the JDK's local connector on an ephemeral port of every
interface.
"""

from __future__ import annotations

import base64
import csv
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition

# The admin module defines these without listing them in `__all__`.
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
)

from strata.errors import JavaMissing, KafkaJarsMissing
from strata.local.service import LocalService, free_port

# The version jvm/kafka/pom.xml pins (`kafka.version`); a unit test holds them equal.
KAFKA_VERSION = "4.1.1"
LOOPBACK = "127.0.0.1"
# Written by `make kafka` into the cache after every jar was checked: its checksums.
COMPLETE = ".complete"

# Written into server.properties over Kafka's defaults: one node, and the background
# work (retention, compaction) checked every half second rather than every few minutes,
# so a test of retention or compaction waits for Kafka, not for a timer.
TEST_SETTINGS: Mapping[str, str] = {
    "num.partitions": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    # Every topic is created by whoever uses it, with the partitions and configs it
    # names: a produce to a topic nobody created fails instead of making one.
    "auto.create.topics.enable": "false",
    # A broker restarted after a crash can register only once the controller has given
    # up on its previous incarnation: 9 s by default.
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    # Tests produce at fixed event times, long past: under Kafka's default retention
    # (7 days) they would be deleted at once. A topic keeps every message unless its
    # own `retention.ms` says otherwise.
    "log.retention.ms": "-1",
    # Retention and the cleaner start 30 s after the broker by default.
    "log.initial.task.delay.ms": "0",
    "log.retention.check.interval.ms": "500",
    "log.cleaner.backoff.ms": "500",
    # The cleaner's buffer lives in the heap; 128 MiB by default.
    "log.cleaner.dedupe.buffer.size": str(32 << 20),
    # A produce request may carry a message above librdkafka's default fetch limit
    # (100 MB) with others beside it; Kafka refuses requests above 100 MiB by default.
    # A topic still takes batches above 1 MB only if its `max.message.bytes` says so.
    "socket.request.max.bytes": str(256 << 20),
}

JVM_OPTIONS = ("-Djava.awt.headless=true", "-Djava.net.preferIPv4Stack=true")
HEAP = "-Xmx512m"

# Kafka's own layout (config/log4j2.yaml of its release), to standard output, which
# the service writes to `server.log`; the per-request log stays quiet.
LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""

FETCH_CONVERSIONS = "kafka.server:type=BrokerTopicMetrics,name=FetchMessageConversionsPerSec"


def kafka_home() -> Path:
    """Where `make setup` puts Apache Kafka's jars: the user's cache, outside any clone."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "strata" / "jvm" / f"kafka-{KAFKA_VERSION}"


def kafka_classpath() -> str:
    """The broker's class path, from the cache `make setup` filled.

    Raises:
        KafkaJarsMissing: If the cache is missing or was never completed.
    """
    home = kafka_home()
    if not (home / COMPLETE).is_file():
        raise KafkaJarsMissing(
            f"Apache Kafka {KAFKA_VERSION}'s jars are not in {home}: run `make setup` "
            "(or `make kafka`), which fetches them once with Maven and checks them"
        )
    return f"{home}/*"


def new_cluster_id() -> str:
    """A random KRaft cluster id, as `kafka-storage random-uuid` prints one.

    Kafka's ids are 16 random bytes in URL-safe base64 without padding, never starting
    with a dash (a command line would read it as an option).
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def server_properties(port: int, controller_port: int, data_dir: Path) -> str:
    """The properties of a one-node KRaft cluster on loopback, its logs in `data_dir`."""
    broker = f"PLAINTEXT://{LOOPBACK}:{port}"
    controller = f"CONTROLLER://{LOOPBACK}:{controller_port}"
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        # A dynamic quorum of this one controller (`format --standalone` records it).
        "controller.quorum.bootstrap.servers": f"{LOOPBACK}:{controller_port}",
        "listeners": f"{broker},{controller}",
        "advertised.listeners": f"{broker},{controller}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data_dir),
        **TEST_SETTINGS,
    }
    return "".join(f"{k}={v}\n" for k, v in settings.items())


def _distinct_free_ports(count: int, taken: set[int]) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in taken and port not in ports:
            ports.append(port)
    return ports


class LocalKafka(LocalService):
    """An Apache Kafka broker and controller in one process, on loopback; a context manager.

    `stop` is a clean shutdown; `kill` a crash (SIGKILL), after which `start` or
    `restart` brings the broker back on the same log and ports. It has no `seal`: its
    high watermark is the log end, so nothing needs to be produced to make it exact.
    """

    name = "Kafka broker"

    def __init__(self, directory: Path, port: int | None = None) -> None:
        """Choose the broker's directory and its ports.

        Args:
            directory: Where its configuration, logs (`data/`) and `server.log` go.
            port: Port clients connect to; a free one if None. The controller and the
                JMX agent get free ports of their own.
        """
        self.directory = directory.resolve()
        super().__init__(port, self.directory / "server.log")
        self.controller_port, self.jmx_port = _distinct_free_ports(2, {self.port})
        self.bootstrap = f"{LOOPBACK}:{self.port}"
        self.data_dir = self.directory / "data"
        self._jmx_pid: int | None = None

    def _java(self) -> str:
        from strata.spark.jvm import java_binary, require_java

        require_java()
        java = java_binary()
        assert java is not None
        return java

    def start(self, timeout: float = 120.0) -> LocalKafka:
        """Format the storage (first start only), start the server, wait until it serves.

        Raises:
            KafkaJarsMissing: If `make setup` has not fetched Kafka.
            JavaMissing: If there is no Java 17 or newer.
            RuntimeError: With the tail of `server.log`, if the server exits or does
                not answer within `timeout` seconds.
        """
        if self._proc is not None and self._proc.poll() is None:
            raise RuntimeError(f"the Kafka broker at {self.bootstrap} is already running")
        classpath = kafka_classpath()
        java = self._java()
        self.directory.mkdir(parents=True, exist_ok=True)
        properties = self.directory / "server.properties"
        properties.write_text(server_properties(self.port, self.controller_port, self.data_dir))
        log4j = self.directory / "log4j2.properties"
        log4j.write_text(LOG4J2)
        options = [*JVM_OPTIONS, f"-Dlog4j2.configurationFile={log4j.as_uri()}", "-cp", classpath]
        if not (self.data_dir / "meta.properties").exists():
            self._format(java, options, properties)
        self._spawn([java, HEAP, *options, "kafka.Kafka", str(properties)], cwd=self.directory)
        self._jmx_pid = None
        self._wait(timeout)
        self._wait_until_serving(timeout)
        return self

    def _format(self, java: str, options: list[str], properties: Path) -> None:
        """Write the cluster id and this controller's place in the quorum into `data/`."""
        command = [java, *options, "kafka.tools.StorageTool", "format"]
        command += ["--cluster-id", new_cluster_id(), "--config", str(properties), "--standalone"]
        done = subprocess.run(command, capture_output=True, timeout=120, cwd=self.directory)
        with self.log_path.open("ab") as log:
            log.write(done.stdout + done.stderr)
        if done.returncode != 0:
            self._fail(f"formatting {self.data_dir} failed with {done.returncode}")

    def _wait_until_serving(self, timeout: float) -> None:
        """Wait until the broker answers for every partition it holds.

        Metadata alone is not enough after a crash: until the controller gives up on
        the killed incarnation, the restarted broker lists itself as every partition's
        leader yet answers "not leader" to reads; a ListOffsets of every partition
        succeeds only once it truly leads them again.
        """
        admin = self._admin()
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]  # unannotated upstream
        deadline = time.monotonic() + timeout
        while True:
            try:
                metadata = admin.list_topics(timeout=2)
                partitions = {
                    TopicPartition(name, p): latest
                    for name, t in metadata.topics.items()
                    for p in t.partitions
                }
                if metadata.brokers:
                    if partitions:
                        for future in admin.list_offsets(partitions, request_timeout=2).values():
                            future.result()
                    return
            except KafkaException:
                pass
            if time.monotonic() > deadline:
                self._fail(f"the broker did not serve within {timeout:.0f}s")
            time.sleep(0.1)

    def kill(self) -> None:
        """Crash the broker: SIGKILL, no controlled shutdown. `start` recovers its log."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait()
        self._proc = None

    def restart(self, timeout: float = 120.0) -> LocalKafka:
        """Stop the broker cleanly if it runs, then start it again on the same log and ports."""
        self.stop()
        return self.start(timeout)

    @contextmanager
    def unreachable(self) -> Iterator[None]:
        """The broker down for the block: killed on entry, started again on exit.

        Every client connection drops and connects are refused during the block; after
        it (a few seconds more, while the log is recovered) the same port answers, with
        every message acknowledged before the crash.
        """
        self.kill()
        try:
            yield
        finally:
            self.start()

    def _admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topic(
        self, topic: str, partitions: int, config: dict[str, str] | None = None
    ) -> None:
        """Create a topic (with topic configs such as `cleanup.policy`, `retention.ms`,
        `segment.ms`) and wait until every partition has a leader."""
        new = NewTopic(topic, partitions, 1, config=config or {})
        # The client must outlive its futures: destroyed, it fails them.
        admin = self._admin()
        for future in admin.create_topics([new]).values():
            future.result(30)
        self._wait_for_partitions(topic, partitions)

    def delete_topic(self, topic: str) -> None:
        """Delete a topic and wait until the broker no longer lists it."""
        admin = self._admin()
        for future in admin.delete_topics([topic]).values():
            future.result(30)
        deadline = time.monotonic() + 30
        while topic in admin.list_topics(timeout=10).topics:
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {topic} still listed 30s after its deletion")
            time.sleep(0.05)

    def create_partitions(self, topic: str, total: int) -> None:
        """Grow a topic to `total` partitions and wait until each has a leader."""
        admin = self._admin()
        for future in admin.create_partitions([NewPartitions(topic, total)]).values():
            future.result(30)
        self._wait_for_partitions(topic, total)

    def _wait_for_partitions(self, topic: str, count: int) -> None:
        admin = self._admin()
        deadline = time.monotonic() + 30
        while True:
            found = admin.list_topics(topic, timeout=10).topics.get(topic)
            if (
                found is not None
                and found.error is None
                and len(found.partitions) == count
                and all(p.leader >= 0 for p in found.partitions.values())
            ):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {topic} has no leader for all {count} partitions")
            time.sleep(0.05)

    def wait_until_stable(self, topic: str, timeout: float = 30.0) -> None:
        """Wait until every partition's last stable offset is its log end.

        That is, until every transaction on the topic is decided and its marker written:
        the broker writes the markers after `commit_transaction` (or `abort_transaction`)
        has returned, and until then a `read_committed` consumer's end is the open
        transaction's first offset.

        Raises:
            TimeoutError: If a transaction is still open after `timeout` seconds.
        """
        admin = self._admin()
        found = admin.list_topics(topic, timeout=10).topics[topic]
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]  # unannotated upstream
        wanted = {TopicPartition(topic, p): latest for p in found.partitions}
        deadline = time.monotonic() + timeout
        while True:
            ends = [
                {tp.partition: f.result(10).offset for tp, f in futures.items()}
                for futures in (
                    admin.list_offsets(wanted, isolation_level=level)
                    for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED)
                )
            ]
            if ends[0] == ends[1]:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"topic {topic}: last stable offsets {ends[0]} still below the log ends "
                    f"{ends[1]} after {timeout:.0f}s (a transaction left open?)"
                )
            time.sleep(0.05)

    def topic_config(self, topic: str) -> dict[str, str]:
        """A topic's configuration as the broker describes it (defaults included)."""
        resource = ConfigResource(ResourceType.TOPIC, topic)
        admin = self._admin()
        entries = admin.describe_configs([resource])[resource].result(30)
        return {name: e.value for name, e in entries.items() if e.value is not None}

    def alter_topic_config(self, topic: str, config: dict[str, str]) -> None:
        """Set topic configs (`retention.ms`, say), leaving the others as they are, and
        wait until the broker applies them (it learns them from the controller after
        the request returns)."""
        entries = [
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in config.items()
        ]
        resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
        admin = self._admin()
        admin.incremental_alter_configs([resource])[resource].result(30)
        deadline = time.monotonic() + 30
        while any(self.topic_config(topic).get(k) != v for k, v in config.items()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {topic}: {config} not in effect 30s after being set")
            time.sleep(0.05)

    def delete_records(self, topic: str, before: dict[int, int]) -> dict[int, int]:
        """Delete each partition's records below an offset (DeleteRecords).

        Args:
            topic: The topic.
            before: Partition to the first offset to keep.

        Returns:
            Each partition's log start offset afterwards.
        """
        offsets = [TopicPartition(topic, p, o) for p, o in before.items()]
        admin = self._admin()
        futures = admin.delete_records(offsets)
        return {tp.partition: f.result(30).low_watermark for tp, f in futures.items()}

    def jmx_value(self, object_name: str, attribute: str) -> float:
        """One attribute of one of the broker's MBeans, read with Kafka's JmxTool.

        The first read starts the JVM's JMX agent on `jmx_port`, bound to loopback.

        Raises:
            JavaMissing: If the Java has no `jcmd` (a JRE, not a JDK).
            RuntimeError: If the broker is not running or JmxTool fails.
        """
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError("the Kafka broker is not running")
        java = self._java()
        if self._jmx_pid != self._proc.pid:
            self._start_jmx(java, self._proc.pid)
        url = f"service:jmx:rmi:///jndi/rmi://{LOOPBACK}:{self.jmx_port}/jmxrmi"
        command = [java, *JVM_OPTIONS, "-cp", kafka_classpath(), "org.apache.kafka.tools.JmxTool"]
        command += ["--jmx-url", url, "--object-name", object_name, "--attributes", attribute]
        command += ["--one-time", "true"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        # A header line naming "object:attribute", then one line of values.
        rows = [r for r in csv.reader(done.stdout.splitlines()) if r]
        column = f"{object_name}:{attribute}"
        header = next((i for i, r in enumerate(rows) if column in r), None)
        if done.returncode != 0 or header is None or header + 1 >= len(rows):
            raise RuntimeError(
                f"JmxTool could not read {column}: {(done.stdout + done.stderr).strip()[-2000:]}"
            )
        return float(rows[header + 1][rows[header].index(column)])

    def _start_jmx(self, java: str, pid: int) -> None:
        jcmd = Path(java).resolve().parent / "jcmd"
        if not jcmd.exists():
            raise JavaMissing(
                f"{jcmd} not found: reading the local Kafka's JMX metrics needs a JDK's jcmd. "
                "Install openjdk-17-jdk-headless (Debian/Ubuntu) or set JAVA_HOME to a JDK 17."
            )
        command = [str(jcmd), str(pid), "ManagementAgent.start"]
        command += [f"jmxremote.port={self.jmx_port}", f"jmxremote.rmi.port={self.jmx_port}"]
        command += [f"jmxremote.host={LOOPBACK}", "jmxremote.authenticate=false"]
        command += ["jmxremote.ssl=false"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"jcmd could not start the broker's JMX agent: {done.stdout}")
        self._jmx_pid = pid

    def fetch_message_conversions(self) -> int:
        """How many fetched messages the broker converted to an older format for a client.

        Zero for a current client. A client too old for the stored format makes the
        broker rewrite every batch it fetches, at a large cost in broker CPU: it shows
        here first.
        """
        return int(self.jmx_value(FETCH_CONVERSIONS, "Count"))
