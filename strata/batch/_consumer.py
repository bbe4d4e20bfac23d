"""The consumer a read uses, and what it hears of brokers it cannot reach."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError


class BrokerTrouble:
    """What the client last reported about reaching the brokers; its `error_cb`.

    librdkafka reports a refused or dropped connection here, not as a message, and
    keeps retrying: the read only needs it to say why it is stuck if it gives up.
    """

    def __init__(self, conf: Mapping[str, Any]) -> None:
        servers = str(conf.get("bootstrap.servers", ""))
        self.several = "," in servers
        self.brokers = f"the broker{'s' if self.several else ''} at {servers}"
        self.last: str | None = None

    def __call__(self, err: KafkaError) -> None:
        # "1/1 brokers are down" follows each refusal: keep the refusal, which says why.
        if err.code() != KafkaError._ALL_BROKERS_DOWN or self.last is None:
            self.last = err.str()

    def why_stuck(self) -> str:
        """The brokers, named, and what is known of why they serve nothing."""
        if self.last is None:
            serve = "serve" if self.several else "serves"
            return f"{self.brokers} no longer {serve} the planned offsets"
        return f"{self.brokers} cannot be reached ({self.last})"


def range_consumer(conf: dict[str, Any]) -> Consumer:
    """A consumer that reads assigned offsets exactly: committed records only, no group.

    The group is never joined (assign, not subscribe) and never committed to; an offset
    out of range is an error rather than a silent jump, and each partition's end is
    reported, so a range ends on position.
    """
    return Consumer(
        {
            **conf,
            "group.id": conf.get("group.id", "strata-reader"),
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "auto.offset.reset": "error",
        }
    )
