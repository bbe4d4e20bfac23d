"""Consumed messages as Arrow: one raw-schema table per consume() batch.

Fields are read through `Message`'s methods mapped over a batch, without a Python
frame per message. A message whose headers the Kafka client cannot convert is kept
with its key and value and marked for quarantine, never allowed to crash the task.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Message

from strata.schema.avro import RAW_SCHEMA

# Messages are always consume()d and never built by hand; headers() is read through
# the method itself so a failure can be pinned on one message (see `_headers`).
_HEADERS = Message.headers
_TIMESTAMP, _TOPIC, _PARTITION = Message.timestamp, Message.topic, Message.partition
_OFFSET, _KEY, _VALUE, _ERROR = Message.offset, Message.key, Message.value, Message.error


@dataclass(frozen=True)
class RawChunk:
    """A chunk of messages handed to decode and write.

    Attributes:
        table: Messages in `RAW_SCHEMA`, in offset order per partition.
        rejected: Row index to the reason a message must go to quarantine whatever
            its value holds (its headers could not be read).
    """

    table: pa.Table
    rejected: Mapping[int, str]


def events_apart(messages: list[Any]) -> tuple[list[Any], list[tuple[Any, Any]]]:
    """A consumed batch's messages, and its events (an error, a partition's end) with theirs."""
    errors = list(map(_ERROR, messages))
    # By identity: a KafkaError compared with None leaves a TypeError set (list.count).
    if all(e is None for e in errors):
        return messages, []
    pairs = list(zip(messages, errors, strict=True))
    return [m for m, e in pairs if e is None], [(m, e) for m, e in pairs if e is not None]


def _headers(messages: list[Any]) -> tuple[list[Any], dict[int, str]]:
    """Every message's headers, and why those of some could not be read.

    confluent-kafka decodes header keys as UTF-8. For a key that is not, `headers()`
    raises SystemError (from a UnicodeDecodeError) and caches a half-built list whose
    key is a null pointer: calling it again on that message returns the list, and
    touching the key crashes the interpreter. So each message's `headers()` is called
    exactly once; `list.extend` keeps what was read before a failure, which pins it
    on one message.
    """
    headers: list[Any] = []
    unreadable: dict[int, str] = {}
    while True:
        try:
            headers.extend(map(_HEADERS, messages[len(headers) :] if unreadable else messages))
            return headers, unreadable
        except Exception as exc:  # noqa: BLE001 - any failure is this one message's
            unreadable[len(headers)] = _header_problem(exc)
            headers.append(None)


def _header_problem(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__ or exc
    if isinstance(cause, UnicodeDecodeError):
        raw = bytes(cause.object)
        shown = repr(raw[:64]) + ("..." if len(raw) > 64 else "")
        return (
            f"headers unreadable by the Kafka client: header key {shown} is not UTF-8 "
            f"({cause.reason} at byte {cause.start})"
        )
    return f"headers unreadable by the Kafka client: {type(cause).__name__}: {cause}"


def to_table(messages: list[Any], batch: int, topic: str | None) -> tuple[pa.Table, dict[int, str]]:
    """One consume() batch as a raw-schema table: one pass per field.

    Fields are read through the methods themselves, mapped over the batch (no Python
    frame per message), as this runs once per message read.

    Args:
        messages: The batch's messages, none of them an event.
        batch: Batch number stamped on each row.
        topic: The only topic the consumer reads, or None if it reads several.

    Returns:
        The table, and the rows whose headers could not be read (kept with null
        headers) with the reason.
    """
    n = len(messages)
    kinds, stamps = zip(*map(_TIMESTAMP, messages), strict=True) if n else ((), ())
    headers, unreadable = _headers(messages)
    ts = pa.array(stamps, pa.int64())
    # Type 0 is "not available": such a message has no Kafka timestamp.
    ts = pc.if_else(pc.equal(pa.array(kinds, pa.int8()), 0), pa.scalar(None, pa.int64()), ts)
    if headers.count(None) != n:
        header_rows: list[Any] = [
            None if h is None else [{"key": k, "value": v} for k, v in h] for h in headers
        ]
        header_column = pa.array(header_rows, RAW_SCHEMA.field("_headers").type)
    else:
        header_column = pa.nulls(n, RAW_SCHEMA.field("_headers").type)
    topics = (
        pa.array(list(map(_TOPIC, messages)), pa.string())
        if topic is None
        else pa.repeat(pa.scalar(topic, pa.string()), n)
    )
    table = pa.table(
        [
            topics,
            pa.array(list(map(_PARTITION, messages)), pa.int32()),
            pa.array(list(map(_OFFSET, messages)), pa.int64()),
            ts.cast(pa.timestamp("ms", tz="UTC")),
            # Over 2 GiB of keys or values (a few huge messages at once), pyarrow
            # returns a chunked array rather than overflow; chunks are cut below that.
            pa.array(list(map(_KEY, messages)), pa.binary()),
            pa.array(list(map(_VALUE, messages)), pa.binary()),
            header_column,
            pa.repeat(pa.scalar(batch, pa.int64()), n),
            pa.array([unreadable.get(i) for i in range(n)], pa.string())
            if unreadable
            else pa.nulls(n, pa.string()),
        ],
        schema=RAW_SCHEMA,
    )
    return table, unreadable
