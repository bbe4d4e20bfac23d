"""Every partition's watermarks asked of the brokers together, and their bad answers."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from strata.batch.kafka import _watermarks
from strata.config import EventTimeConfig, PipelineConfig
from strata.errors import KafkaUnavailable
from tests.conftest import ROOT

ASKED = [TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0)]
MARKS = {("t", 0): (0, 10), ("t", 1): (5, 7), ("u", 0): (0, 0)}


@dataclass
class Answer:
    topic: str
    partition: int
    offset: int
    error: KafkaError | None = None


class Brokers:
    """A consumer's `offsets_for_times`, answering as it is told to; each call recorded."""

    def __init__(self, *, error_at=None, leave_out=None, refuse=False):
        self.calls: list[list[tuple[str, int, int]]] = []
        self.error_at, self.leave_out, self.refuse = error_at, leave_out, refuse

    def offsets_for_times(self, asked, timeout):
        self.calls.append([(tp.topic, tp.partition, tp.offset) for tp in asked])
        if self.refuse:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        out = []
        for tp in asked:
            if (tp.topic, tp.partition) == self.leave_out:
                continue
            low, high = MARKS[tp.topic, tp.partition]
            error = (
                KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)
                if (tp.topic, tp.partition) == self.error_at
                else None
            )
            out.append(
                Answer(
                    tp.topic, tp.partition, low if tp.offset == OFFSET_BEGINNING else high, error
                )
            )
        return out


def source():
    return PipelineConfig(
        name="p",
        topics=["t", "u"],
        format="json",
        schema_file="clicks.avsc",
        schemas_dir=str(ROOT / "schemas"),
        warehouse="/nowhere",
        event_time=EventTimeConfig(field="ts"),
    ).source()


def test_all_partitions_are_asked_in_two_requests_and_answered_by_partition():
    brokers = Brokers()
    assert _watermarks(source(), brokers, ASKED) == MARKS
    assert len(brokers.calls) == 2  # earliest for all, then latest for all
    assert all(len(call) == len(ASKED) for call in brokers.calls)


def test_nothing_to_ask_sends_nothing():
    brokers = Brokers()
    assert _watermarks(source(), brokers, []) == {}
    assert brokers.calls == []


def test_an_error_for_one_partition_stops_naming_it():
    with pytest.raises(KafkaUnavailable, match=r"partition 1 of `t`: no watermarks"):
        _watermarks(source(), Brokers(error_at=("t", 1)), ASKED)


def test_a_partition_left_out_of_the_answer_stops_naming_it():
    with pytest.raises(KafkaUnavailable, match=r"partition 0 of `u`.*no answer for it"):
        _watermarks(source(), Brokers(leave_out=("u", 0)), ASKED)


def test_brokers_that_do_not_answer_stop_naming_the_topics():
    with pytest.raises(KafkaUnavailable, match=r"partitions of `t`, `u`: no watermarks"):
        _watermarks(source(), Brokers(refuse=True), ASKED)
