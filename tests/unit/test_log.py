"""The `strata` logger's rate limit, and librdkafka's lines routed through it."""

from __future__ import annotations

import logging

import pytest

from strata.batch.kafka import ClientLog
from strata.log import RateLimit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_same_message_goes_through_once_a_window_with_the_count_held_back():
    clock = Clock()
    limit = RateLimit(60, clock)
    assert limit.admit("refused") == 0
    assert [limit.admit("refused") for _ in range(5)] == [None] * 5
    assert limit.admit("timed out") == 0  # another message has its own window
    clock.now = 59.9
    assert limit.admit("refused") is None
    clock.now = 60.0
    assert limit.admit("refused") == 6
    assert limit.admit("refused") is None


def test_forgotten_messages_do_not_pile_up():
    clock = Clock()
    limit = RateLimit(1, clock)
    for i in range(RateLimit._KEEP):
        limit.admit(i)
    clock.now = 5
    limit.admit("new")
    assert len(limit._seen) == 1


FAIL = (
    "[thrd:10.0.0.9:9092/bootstrap]: 10.0.0.9:9092/bootstrap: Connect to ipv4#10.0.0.9:9092 "
    "failed: Connection refused (after {}ms in state CONNECT)"
)


def test_client_lines_are_rate_limited_and_failed_connections_kept_for_the_error(caplog):
    log = ClientLog(logging.getLogger("strata.kafka.client"))
    with caplog.at_level(logging.DEBUG, logger="strata.kafka.client"):
        for ms in (0, 3, 0, 12):
            # As confluent-kafka calls it: facility, client name, text.
            log.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", FAIL.format(ms))
        for _ in range(3):
            log.log(logging.WARNING, "%s [%s] %s", "CONFWARN", "rdkafka#2", "[thrd:app]: x")
    records = [(r.levelno, r.getMessage()) for r in caplog.records]
    # A failed connection, retried by the client, is a DEBUG line, once per window
    # whatever the attempt's duration; another line keeps its own level.
    assert records == [
        (
            logging.DEBUG,
            "kafka client: 10.0.0.9:9092/bootstrap: Connect to ipv4#10.0.0.9:9092 failed: "
            "Connection refused (after 0ms in state CONNECT)",
        ),
        (logging.WARNING, "kafka client: x"),
    ]
    assert log.failure_since(10) == (
        "10.0.0.9:9092/bootstrap: Connect to ipv4#10.0.0.9:9092 failed: Connection refused"
    )


@pytest.mark.parametrize("level", [logging.INFO, logging.WARNING])
def test_failed_connections_are_not_shown_at_the_commands_level(caplog, level):
    log = ClientLog(logging.getLogger("strata.kafka.client"))
    with caplog.at_level(level, logger="strata.kafka.client"):
        log.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", FAIL.format(0))
    assert caplog.records == [] and log.failure_since(10) is not None
