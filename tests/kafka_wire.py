"""A minimal Kafka wire producer, for messages no client library will send.

confluent-kafka (like every client) only produces header keys that are text: given
bytes, it sends their `str()`. A header key that is not valid UTF-8 can only reach
a broker from a client that builds the record batch itself. This module does: one
Produce request (v3) carrying one RecordBatch (magic 2, CRC-32C, varints), sent over
a plain socket to a single broker, with the response checked.

References: the Kafka protocol guide (Produce request, v3) and the record batch
format of KIP-98 (magic 2).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

_PRODUCE = 0
_PRODUCE_VERSION = 3


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


def record_batch(records: Sequence[WireRecord]) -> bytes:
    """A RecordBatch (magic 2) holding the records, uncompressed and non-transactional."""
    base_ts = min(r.timestamp_ms for r in records)
    max_ts = max(r.timestamp_ms for r in records)
    after_crc = struct.pack(
        ">hiqqqhii",
        0,  # attributes: no compression, CreateTime, not transactional
        len(records) - 1,  # last offset delta
        base_ts,
        max_ts,
        -1,  # producer id
        -1,  # producer epoch
        -1,  # base sequence
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


def produce(
    bootstrap: str,
    topic: str,
    partition: int,
    records: Sequence[WireRecord],
    timeout_s: float = 30.0,
) -> int:
    """Produce one record batch to one partition of a single broker, acks=all.

    Args:
        bootstrap: `host:port` of the broker leading the partition (the local
            broker leads all of them).
        topic: Topic.
        partition: Partition.
        records: Records of the batch, in offset order.
        timeout_s: Socket timeout.

    Returns:
        The offset the broker assigned to the batch's first record.

    Raises:
        ProduceFailed: With the broker's error code.
    """
    batch = record_batch(records)
    correlation = 1
    body = (
        struct.pack(">hhi", _PRODUCE, _PRODUCE_VERSION, correlation)
        + _string("strata-tests-wire")
        + _string(None)  # transactional id
        + struct.pack(">hi", -1, int(timeout_s * 1000))  # acks=all, timeout
        + struct.pack(">i", 1)
        + _string(topic)
        + struct.pack(">i", 1)
        + struct.pack(">i", partition)
        + struct.pack(">i", len(batch))
        + batch
    )
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        (size,) = struct.unpack(">i", _read_exact(sock, 4))
        reply = _read_exact(sock, size)
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
