"""Click events for the demo, the tests and the benchmark: a realistic topic, produced.

Besides good events it makes late, malformed and future ones, each marked with what
the pipeline should make of it, so that a test can count what must land where.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, Producer

if TYPE_CHECKING:
    pass

HOUR_MS = 3_600_000
_PAGES = ["/", "/search", "/cart", "/checkout", "/help"] + [f"/products/{i}" for i in range(50)]
_COUNTRIES = ["US", "DE", "IN", "BR", "JP", "FR", "GB", None]
_DEVICES = ["desktop", "mobile", "tablet"]


@dataclass(frozen=True)
class Message:
    """A message to produce.

    Attributes:
        key: Message key.
        value: Message value.
        timestamp_ms: Kafka timestamp (CreateTime).
        kind: `ok`, `late`, `malformed` or `future`: what the pipeline should make of it.
    """

    key: bytes
    value: bytes
    timestamp_ms: int
    kind: str


def click_events(
    count: int,
    start_ms: int,
    hours: int,
    *,
    late: int = 0,
    malformed: int = 0,
    future: int = 0,
    seed: int = 7,
) -> Iterator[Message]:
    """Generate click events spread evenly over `hours` event hours.

    Normal events reach Kafka within seconds of happening. Late events reach it
    hours after. Malformed ones are not valid for the schema. Future ones carry an
    event time a month ahead of their Kafka timestamp.

    Args:
        count: Normal events.
        start_ms: Event time of the first event.
        hours: Event hours the normal events span.
        late: Events that arrive 3 to 30 hours after they happened.
        malformed: Messages that must be quarantined as undecodable.
        future: Events a month ahead of their Kafka timestamp.
        seed: Random seed; the same arguments give the same messages.

    Yields:
        Messages in production order.
    """
    rng = random.Random(seed)
    span = hours * HOUR_MS
    specials = ["late"] * late + ["malformed"] * malformed + ["future"] * future
    positions = sorted(rng.sample(range(count + len(specials)), len(specials))) if specials else []
    rng.shuffle(specials)
    special_at = dict(zip(positions, specials, strict=True))
    normal = 0
    for i in range(count + len(specials)):
        kind = special_at.get(i, "ok")
        event_ms = start_ms + (normal * span) // max(count, 1)
        if kind == "ok":
            normal += 1
        user = rng.randrange(1, 200_000)
        record = {
            "event_id": str(uuid.UUID(int=rng.getrandbits(128))),
            "user_id": user,
            "session_id": f"s-{user:x}-{rng.randrange(1000)}",
            "page": rng.choice(_PAGES),
            "referrer": rng.choice([None, "https://example.com/", "https://example.org/?q=x"]),
            "country": rng.choice(_COUNTRIES),
            "device": rng.choice(_DEVICES),
            "latency_ms": rng.randrange(5, 900),
            "ts": event_ms,
        }
        kafka_ms = event_ms + rng.randrange(0, 5000)
        if kind == "late":
            kafka_ms = event_ms + rng.randrange(3, 30) * HOUR_MS
        elif kind == "future":
            record["ts"] = event_ms + 30 * 24 * HOUR_MS
        value = json.dumps(record, separators=(",", ":")).encode()
        if kind == "malformed":
            value = rng.choice(
                [
                    value[: len(value) // 2],
                    json.dumps({**record, "user_id": "not-a-number"}).encode(),
                    b"\x00\x01binary garbage",
                    json.dumps({k: v for k, v in record.items() if k != "page"}).encode(),
                ]
            )
        yield Message(str(user).encode(), value, kafka_ms, kind)


def produce(
    bootstrap: str, topic: str, partitions: int, messages: Iterator[Message]
) -> dict[str, int]:
    """Produce messages round-robin over partitions, keyed but placed explicitly.

    Args:
        bootstrap: Broker list.
        topic: Topic.
        partitions: Number of partitions to spread over.
        messages: What to produce.

    Returns:
        How many messages of each kind were produced.

    Raises:
        RuntimeError: If the broker refused any message (Kafka refuses a timestamp more
            than `message.timestamp.after.max.ms`, an hour by default, in the future):
            a caller counting what it produced must not count those.
    """
    refused: list[str] = []

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            refused.append(err.str())

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 500_000,
        }
    )
    counts: dict[str, int] = {}
    for i, m in enumerate(messages):
        while True:
            try:
                producer.produce(
                    topic,
                    m.value,
                    m.key,
                    partition=i % partitions,
                    timestamp=m.timestamp_ms,
                    on_delivery=delivered,
                )
                break
            except BufferError:
                producer.poll(0.1)
        counts[m.kind] = counts.get(m.kind, 0) + 1
        if i % 50_000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    if refused or left:
        raise RuntimeError(
            f"{len(refused) + left} messages to `{topic}` at {bootstrap} were not delivered"
            + (f", the first: {refused[0]}" if refused else "")
        )
    return counts
