"""Where a batch's time goes: wall and CPU seconds per stage.

Each Spark task times its own stages (fetch, decode, writes, statistics) and the
driver times its own (plan, Spark start-up, commits); the run summary sums them, and
`make bench` prints them beside the whole process tree's CPU.

CPU is the timing thread's own (`time.thread_time`), so a stage is charged only what
it did itself. What other threads of the process did meanwhile (librdkafka fetching
in the background, Arrow's and Parquet's thread pools) is counted once, as
`background`: the process's CPU less the stages'.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

BACKGROUND = "background"


@dataclass
class Stages:
    """Wall and CPU seconds per stage, added up over every time it ran.

    Attributes:
        wall: Wall seconds per stage.
        cpu: CPU seconds of the timing thread per stage.
    """

    wall: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Charge what the block takes to stage `name`."""
        wall, cpu = time.monotonic(), time.thread_time()
        try:
            yield
        finally:
            self.add(name, time.monotonic() - wall, time.thread_time() - cpu)

    def add(self, name: str, wall: float, cpu: float) -> None:
        """Charge seconds to a stage."""
        self.wall[name] = self.wall.get(name, 0.0) + wall
        self.cpu[name] = self.cpu.get(name, 0.0) + cpu

    def merge(self, other: Stages) -> None:
        """Add another set of stages (another task's) to these."""
        for name in other.wall:
            self.add(name, other.wall[name], other.cpu.get(name, 0.0))

    @classmethod
    def from_dict(cls, stages: dict[str, dict[str, float]]) -> Stages:
        """Stages from `as_dict`'s form (a task's, sent back to the driver)."""
        out = cls()
        for name, seconds in stages.items():
            out.add(name, seconds.get("wall", 0.0), seconds.get("cpu", 0.0))
        return out

    def as_dict(self) -> dict[str, dict[str, float]]:
        """`{stage: {"wall": s, "cpu": s}}`, rounded to milliseconds."""
        return {
            name: {"wall": round(self.wall[name], 3), "cpu": round(self.cpu.get(name, 0.0), 3)}
            for name in self.wall
        }
