"""Offset ranges: what a batch reads, the ledger commits, and a backfill replaces."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Offsets `[start, end)` of one topic partition.

    Attributes:
        topic: Kafka topic.
        partition: Partition number.
        start: First offset to read.
        end: First offset not to read.
    """

    topic: str
    partition: int
    start: int
    end: int

    @property
    def count(self) -> int:
        """How many offsets the range spans (messages plus gaps)."""
        return self.end - self.start

    def describe(self) -> str:
        """The range in words, for messages."""
        return f"offsets [{self.start}, {self.end}) of partition {self.partition} of `{self.topic}`"
