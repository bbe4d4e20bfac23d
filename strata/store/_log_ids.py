"""Which log each partition's committed offsets belong to: the brokers' topic ids, recorded.

A topic deleted and created again under the same name gets a new id, and its offsets
are other messages. The ledger records the ids in its commits (`LogIds`), and the next
plan checks the brokers' ids against them (`strata.batch.planning.check_topic_ids`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from strata.store._ledger_state import recorded
from strata.store.delta import BATCH_KEY

# Commit metadata of the ledger: the broker's id of each topic, so a topic re-created
# under the same name is told apart from the one the committed offsets belong to.
TOPIC_IDS_KEY = "strata.topic_ids"
PARTITION_IDS_KEY = "strata.partition_topic_ids"


@dataclass(frozen=True)
class LogIds:
    """Which log each partition's committed offsets belong to: the brokers' topic id.

    A topic deleted and created again under the same name gets a new id, and its
    offsets are other messages. Each ledger commit that records ids holds the whole
    map, so the newest one is the truth: a topic's id, and where a partition's
    offsets belong to another log than its topic's recorded one (a partition sought
    alone onto a re-created topic), that partition's own.

    An operation records only facts about what it touched: an ingest vouches for
    the whole topics it checked, a seek for the partitions it moved; every other
    topic and partition keeps what the ledger recorded before.

    Attributes:
        batch: The batch whose commit recorded this map (0 when none did).
        topics: `{topic: id}`.
        partitions: `{topic: {partition: id}}`, only where it differs from `topics`.
    """

    batch: int = 0
    topics: dict[str, str] = field(default_factory=dict)
    partitions: dict[str, dict[int, str]] = field(default_factory=dict)

    def of(self, topic: str, partition: int) -> str | None:
        """The id of the log where reading goes on in a partition, or None if unknown."""
        return self.partitions.get(topic, {}).get(partition, self.topics.get(topic))

    def vouched(self, topics: dict[str, str], partitions: dict[tuple[str, int], str]) -> LogIds:
        """This map, with what an operation checked or moved recorded over it.

        Args:
            topics: Whole topics the operation checked, every committed partition of
                each found on the log of this id (an ingest).
            partitions: Partitions the operation moved onto the log of this id (a seek).

        Returns:
            The new map (its `batch` is left to the commit that records it).
        """
        merged_topics = {**self.topics, **topics}
        merged: dict[str, dict[int, str]] = {
            t: dict(parts) for t, parts in self.partitions.items() if t not in topics
        }
        for (topic, partition), uid in partitions.items():
            merged.setdefault(topic, {})[partition] = uid
        # A partition whose log is its topic's needs no entry of its own.
        kept = {
            t: {p: uid for p, uid in parts.items() if uid != merged_topics.get(t)}
            for t, parts in merged.items()
        }
        return LogIds(self.batch, merged_topics, {t: ps for t, ps in kept.items() if ps})

    def metadata(self) -> dict[str, object]:
        """The commit metadata that records this map."""
        meta: dict[str, object] = {TOPIC_IDS_KEY: self.topics}
        if self.partitions:
            meta[PARTITION_IDS_KEY] = {
                t: {str(p): uid for p, uid in sorted(parts.items())}
                for t, parts in sorted(self.partitions.items())
            }
        return meta

    @classmethod
    def from_commit(cls, commit: dict[str, Any]) -> LogIds:
        """The map a ledger commit recorded (its info holds `TOPIC_IDS_KEY`)."""
        partitions = recorded(commit, PARTITION_IDS_KEY) if PARTITION_IDS_KEY in commit else {}
        return cls(
            int(commit.get(BATCH_KEY, 0)),
            dict(recorded(commit, TOPIC_IDS_KEY)),
            {t: {int(p): str(uid) for p, uid in parts.items()} for t, parts in partitions.items()},
        )
