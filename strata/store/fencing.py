"""Fencing tokens: what a lease holder's acts carry, so that one taken over acts no more.

A check of the lease before an act leaves a gap: a holder paused right after its check
acts when it wakes, whoever holds the lease by then. So the acts that would destroy
data are made conditional on the holder's `Fence`: the store of the act (a Delta table's
app transaction, an Iceberg table's property) records the token of each, and refuses an
act whose token is below the one it holds (`Fence.admit`). The lease hands out the
tokens (`strata.store.lease`); the stores apply the rule (`strata.store.delta`,
`strata.store.iceberg_swap`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from strata.errors import LeaseLost


@dataclass
class Fence:
    """What a lease holder's fenced acts carry, so that one taken over can act no more.

    A store that records the token of each act (a Delta app transaction, an Iceberg
    table property) refuses a holder whose token is below the one it holds. A token
    equal to the one it holds is this holder's only where this holder wrote it: its own
    earlier commit in this process (`landed`), or, after a commit whose reply was lost,
    a commit recording its run id. Two holders can share a token only if the lease's
    folder was removed while one of them was in flight; then neither passes as the
    other.

    Attributes:
        token: The fencing token: above every earlier holder's, and above `floor`.
        run: The holder's run id, recorded beside the token in each fenced commit.
        floor: The highest fence the tables held when the lease was taken; None where
            they were not read (then a fence above the token may be an earlier run's).
    """

    token: int
    run: str
    floor: int | None = None
    _landed: set[str] = field(default_factory=set, repr=False)

    def landed(self, where: str) -> None:
        """Remember that a commit of this holder's carrying its token landed at `where`."""
        self._landed.add(where)

    def wrote(self, where: str) -> bool:
        """Whether this holder, in this process, committed its token at `where`."""
        return where in self._landed

    def record(self, what: str) -> dict[str, Any]:
        """What a fenced commit records beside the token (`FenceRecord.of` reads it back)."""
        return {"token": self.token, "by": what, "run": self.run}

    def admit(
        self,
        pipeline: str,
        where: str,
        stands: int | None,
        newest: Callable[[], FenceRecord | None],
    ) -> None:
        """Let this holder act on a store holding fence `stands`, or stop it.

        Args:
            pipeline: The pipeline, for the message.
            where: The store (a table), as the message names it.
            stands: The fencing token it holds; None for none.
            newest: Reads the record of its newest fenced commit (read only when the
                token it holds is not below this holder's).

        Raises:
            LeaseLost: If the store holds a higher token, or this holder's token
                written by another run: saying what fenced it.
        """
        if stands is None or stands < self.token or (stands == self.token and self.wrote(where)):
            return
        found = newest()
        if stands == self.token and found is not None and found.ours(self):
            # A commit of this holder's whose reply was lost landed after all.
            self.landed(where)
            return
        raise LeaseLost(self._refusal(pipeline, where, stands, found))

    def _refusal(self, pipeline: str, where: str, stands: int, found: FenceRecord | None) -> str:
        left = ""
        if found is not None and found.token == stands:
            left = f" (left by {found.by} run {found.run}{f' at {found.at}' if found.at else ''})"
        if stands == self.token:
            why = (
                "another maintenance run wrote that same token: two runs were given one "
                "token, which happens only when the lease's folder is removed while a "
                "maintenance run is in flight"
            )
        elif self.floor is not None:
            why = (
                f"the tables held fences up to {self.floor} when this run took its lease, so "
                "a later maintenance run fenced it: this run was paused or cut off from the "
                "store longer than lock_lease, and the lease was taken over"
            )
        else:
            why = "another maintenance run left that fence"
        relation = "equal to" if stands == self.token else "above"
        return (
            f"pipeline {pipeline}: this maintenance run lost its lease: {where} holds the "
            f"maintenance fence {stands}{left}, {relation} this run's fencing token "
            f"{self.token}; {why}. Nothing more was committed by it; what it left is picked "
            "up by the next compaction, and its files are deleted by vacuum. Run the "
            "command again."
        )


@dataclass(frozen=True)
class FenceRecord:
    """What a fenced commit recorded beside its token: who fenced, and when.

    Attributes:
        token: The token.
        by: What fenced (`vacuum`, `compaction`).
        run: The holder's run id; empty in a record written before run ids were.
        at: When the commit landed (UTC, ISO 8601), where the store says.
    """

    token: int
    by: str
    run: str
    at: str = ""

    @classmethod
    def of(cls, text: str, at_ms: int | None = None) -> FenceRecord | None:
        """A record as a commit holds it (JSON), or None if it is not one."""
        try:
            body = json.loads(text)
            token = int(body["token"])
        except (ValueError, KeyError, TypeError):
            return None
        at = (
            ""
            if at_ms is None
            else datetime.fromtimestamp(at_ms / 1000, UTC).isoformat(timespec="seconds")
        )
        return cls(token, str(body.get("by", "")), str(body.get("run", "")), at)

    def ours(self, fence: Fence) -> bool:
        """Whether the holder of `fence` wrote this record."""
        return bool(self.run) and (self.token, self.run) == (fence.token, fence.run)
