"""A minimal Kafka wire producer, for messages no client library will send.

confluent-kafka (like every client) only produces header keys that are text: given
bytes, it sends their `str()`. A header key that is not valid UTF-8 can only reach
a broker from a client that builds the record batch itself. This module does: one
Produce request (v3) carrying one RecordBatch (magic 2, CRC-32C, varints), sent over
a plain socket to a single broker, with the response checked. It also writes the
batch a client library never writes: a transactional one its coordinator was never
told of (a producer id from InitProducerId, v0), which leaves a hanging transaction.

References: the Kafka protocol guide (Produce request, v3; InitProducerId, v0) and
the record batch format of KIP-98 (magic 2).
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

_PRODUCE = 0
_PRODUCE_VERSION = 3
_INIT_PRODUCER_ID = 22
_INIT_PRODUCER_ID_VERSION = 0
# The batch attribute that marks its records as part of a transaction (KIP-98).
_TRANSACTIONAL = 0x10
# COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE.
_RETRIABLE = (14, 15)


@dataclass(frozen=True)
class WireRecord:
    """One record of a batch, its fields as raw bytes.

    Attributes:
        value: Record value; None is a null value (a tombstone).
        key: Record key; None is a null key.
        headers: (key, value) pairs; keys are bytes, so any byte sequence can be sent.
        timestamp_ms: Record timestamp (CreateTime).
    """

    value: bytes | None
    key: bytes | None = None
    headers: Sequence[tuple[bytes, bytes | None]] = field(default_factory=tuple)
    timestamp_ms: int = 0


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum of record batches since magic 2."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def varint(n: int) -> bytes:
    """A zigzag-encoded variable-length integer, as record fields use."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        if z & ~0x7F:
            out.append((z & 0x7F) | 0x80)
            z >>= 7
        else:
            out.append(z)
            return bytes(out)


def _varbytes(data: bytes | None) -> bytes:
    return varint(-1) if data is None else varint(len(data)) + data


def _record(r: WireRecord, offset_delta: int, base_ts: int) -> bytes:
    body = bytearray()
    body += struct.pack(">b", 0)  # attributes (unused)
    body += varint(r.timestamp_ms - base_ts)
    body += varint(offset_delta)
    body += _varbytes(r.key)
    body += _varbytes(r.value)
    body += varint(len(r.headers))
    for key, value in r.headers:
        body += varint(len(key)) + key
        body += _varbytes(value)
    return varint(len(body)) + bytes(body)


@dataclass(frozen=True)
class WireProducer:
    """The producer a batch is written by, for a transactional batch.

    Attributes:
        producer_id: The id `init_producer_id` got from the broker.
        epoch: Its epoch.
        transactional_id: The transactional id the Produce request names; the broker
            asks its coordinator about it only while it verifies transactions.
    """

    producer_id: int
    epoch: int
    transactional_id: str


def record_batch(records: Sequence[WireRecord], producer: WireProducer | None = None) -> bytes:
    """A RecordBatch (magic 2) holding the records, uncompressed; transactional when a
    producer is given (its first batch: sequence 0)."""
    base_ts = min(r.timestamp_ms for r in records)
    max_ts = max(r.timestamp_ms for r in records)
    after_crc = struct.pack(
        ">hiqqqhii",
        0 if producer is None else _TRANSACTIONAL,  # no compression, CreateTime
        len(records) - 1,  # last offset delta
        base_ts,
        max_ts,
        -1 if producer is None else producer.producer_id,
        -1 if producer is None else producer.epoch,
        -1 if producer is None else 0,  # base sequence
        len(records),
    ) + b"".join(_record(r, i, base_ts) for i, r in enumerate(records))
    # Batch length counts everything after itself: leader epoch, magic, crc and the rest.
    length = 4 + 1 + 4 + len(after_crc)
    head = struct.pack(">qiibI", 0, length, -1, 2, crc32c(after_crc))
    return head + after_crc


def _string(text: str | None) -> bytes:
    if text is None:
        return struct.pack(">h", -1)
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def _read_exact(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            raise ConnectionError("the broker closed the connection before answering")
        data += part
    return bytes(data)


class ProduceFailed(Exception):
    """The broker answered a Produce request with an error code."""


def _request(bootstrap: str, body: bytes, timeout_s: float) -> bytes:
    """Send one request to the first broker of `bootstrap` and return its response."""
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        (size,) = struct.unpack(">i", _read_exact(sock, 4))
        return _read_exact(sock, size)


def init_producer_id(bootstrap: str, timeout_s: float = 30.0) -> tuple[int, int]:
    """A producer id and epoch from the broker, for a producer without a transactional id.

    Returns:
        (producer id, epoch).

    Raises:
        ProduceFailed: With the broker's error code.
    """
    correlation = 2
    body = (
        struct.pack(">hhi", _INIT_PRODUCER_ID, _INIT_PRODUCER_ID_VERSION, correlation)
        + _string("strata-tests-wire")
        + _string(None)  # transactional id
        + struct.pack(">i", int(timeout_s * 1000))
    )
    deadline = time.monotonic() + timeout_s
    while True:
        reply = _request(bootstrap, body, timeout_s)
        got_correlation, _throttle, error, producer_id, epoch = struct.unpack_from(">iihqh", reply)
        # A broker just started is still loading its coordinators' state, and says so.
        if error not in _RETRIABLE or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if got_correlation != correlation or error:
        raise ProduceFailed(f"InitProducerId answered error code {error}")
    return int(producer_id), int(epoch)


def produce(
    bootstrap: str,
    topic: str,
    partition: int,
    records: Sequence[WireRecord],
    timeout_s: float = 30.0,
    producer: WireProducer | None = None,
) -> int:
    """Produce one record batch to one partition of a single broker, acks=all.

    Args:
        bootstrap: `host:port` of the broker leading the partition (the local
            broker leads all of them).
        topic: Topic.
        partition: Partition.
        records: Records of the batch, in offset order.
        timeout_s: Socket timeout.
        producer: Write the batch as this producer's transaction (`WireProducer`).

    Returns:
        The offset the broker assigned to the batch's first record.

    Raises:
        ProduceFailed: With the broker's error code.
    """
    batch = record_batch(records, producer)
    correlation = 1
    body = (
        struct.pack(">hhi", _PRODUCE, _PRODUCE_VERSION, correlation)
        + _string("strata-tests-wire")
        + _string(None if producer is None else producer.transactional_id)
        + struct.pack(">hi", -1, int(timeout_s * 1000))  # acks=all, timeout
        + struct.pack(">i", 1)
        + _string(topic)
        + struct.pack(">i", 1)
        + struct.pack(">i", partition)
        + struct.pack(">i", len(batch))
        + batch
    )
    reply = _request(bootstrap, body, timeout_s)
    (got_correlation, topics) = struct.unpack_from(">ii", reply, 0)
    if got_correlation != correlation or topics != 1:
        raise ProduceFailed(f"unexpected Produce response header: {reply[:16].hex()}")
    at = 8
    (name_len,) = struct.unpack_from(">h", reply, at)
    at += 2 + name_len
    (partitions,) = struct.unpack_from(">i", reply, at)
    at += 4
    if partitions != 1:
        raise ProduceFailed(f"{partitions} partitions in the Produce response, expected 1")
    got_partition, error, base_offset = struct.unpack_from(">ihq", reply, at)
    if error or got_partition != partition:
        raise ProduceFailed(
            f"partition {partition} of `{topic}`: the broker answered error code {error}"
        )
    return int(base_offset)
