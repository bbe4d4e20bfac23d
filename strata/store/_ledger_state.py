"""What the ledger says now, kept compact: the state after each batch, folded from its rows.

A run needs where reading goes on in every partition and the facts the completeness
watermark is made of, not the ledger's history. Each ledger commit records the whole
state after its batch in its commit info, folded from the state before and the batch's
own rows, in the same transaction as the rows: the newest commit holds the truth, and
a run reads one commit's info however long the pipeline has run.

The fold is pure (`LedgerState.after`) and is the one definition of both positions and
watermarks: `strata.catalog.completeness.watermarks` folds the ledger's rows with it.

The state also records which table each of the pipeline's tables is (`Vouched`): the
identity a table had when a batch was committed to it, and that batch. A table deleted,
dropped or replaced by hand is told from the one the ledger's batches went to
(`strata.store.identity`); rows cannot say this, so a state folded from rows has none,
and the next commit records the tables as it finds them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from strata.errors import LedgerDamaged

if TYPE_CHECKING:
    import pyarrow as pa

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_us(moment: datetime | None) -> int | None:
    """An instant as microseconds since the epoch (the state's unit), or None."""
    return None if moment is None else (moment - _EPOCH) // timedelta(microseconds=1)


def from_us(us: int | None) -> datetime | None:
    """Microseconds since the epoch as an instant in UTC, or None."""
    return None if us is None else _EPOCH + timedelta(microseconds=us)


@dataclass(frozen=True)
class Traffic:
    """What the ingest batches read from one Kafka partition, for the watermark and status.

    Attributes:
        newest_us: The newest event time read from it (its low-water mark), or None.
        read: The last ingest batch that read a message from it, or None.
        drained: Whether the last batch that read it (or reached its end) ended at the
            high watermark planned: an idle partition then holds no watermark back.
        messages: Messages read from it by every ingest batch.
        bytes: Their key and value bytes.
    """

    newest_us: int | None = None
    read: int | None = None
    drained: bool = False
    messages: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class Mark:
    """The completeness watermark after an ingest batch.

    Attributes:
        batch: The ingest batch.
        committed_at_us: When it was committed.
        at_us: The watermark; None until a partition yielded an event time.
        holding: The Kafka partition (`topic:partition`) holding it back, if any.
        before_us: The watermark after the ingest batch before it: a partition whose
            span ended (plus the lateness) by then was complete before this batch.
    """

    batch: int
    committed_at_us: int
    at_us: int | None
    holding: str | None
    before_us: int | None = None


@dataclass(frozen=True)
class Vouched:
    """What the ledger vouches for of one of the pipeline's tables.

    Attributes:
        identity: The table's identity when the batch was committed to it
            (`strata.store.identity`), e.g. `delta:<metaData.id>`; empty where an
            operator's recorded reset left the table to be created afresh.
        batch: The newest batch the ledger knows the table to hold (0: none yet).
    """

    identity: str
    batch: int = 0


@dataclass(frozen=True)
class LedgerState:
    """What the ledger says about a pipeline, as of its newest batch.

    Attributes:
        last_batch: Highest committed batch (of any kind), or 0 if none.
        committed: Where reading goes on per (topic, partition): the end of the latest
            ingested range, or where an operator's seek put it. Backfills and replays
            re-read old offsets and never move it.
        traffic: Per Kafka partition (`topic:partition`), what ingest batches read.
        mark: The watermark after the newest ingest batch; None before any.
        tables: Per table (`raw`, `quarantine`, `table`), what the ledger vouches for
            (`Vouched`); empty in a state folded from rows, or recorded before tables
            were.
    """

    last_batch: int
    committed: dict[tuple[str, int], int]
    traffic: dict[str, Traffic] = field(default_factory=dict)
    mark: Mark | None = None
    tables: dict[str, Vouched] = field(default_factory=dict)

    def vouching(self, found: Mapping[str, Vouched]) -> LedgerState:
        """This state with the tables found at a commit recorded over those it held."""
        return replace(self, tables={**self.tables, **found})

    def after(
        self, batch: int, committed_at: datetime, rows: Iterable[Mapping[str, Any]]
    ) -> LedgerState:
        """The state once a batch's rows are committed.

        Args:
            batch: The batch.
            committed_at: When it was committed.
            rows: Its ledger rows (`kind`, `topic`, `partition`, `end_offset`; for an
                ingest also `messages`, `bytes`, `high_watermark`, `max_event_time`).

        Returns:
            The new state (this one is left as it is).
        """
        committed = dict(self.committed)
        traffic = dict(self.traffic)
        ingested = False
        for r in rows:
            key = (r["topic"], r["partition"])
            kind = r["kind"]
            if kind in ("ingest", "seek"):
                committed[key] = r["end_offset"]
            elif kind == "abandon" and key not in committed:
                # An abandoned plan read nothing, but where it would have started a
                # partition never read before is where that partition starts: the next
                # plan must not start it elsewhere and skip offsets without a record.
                committed[key] = r["end_offset"]
            if kind == "ingest":
                ingested = True
                name = f"{key[0]}:{key[1]}"
                traffic[name] = _read(traffic.get(name, Traffic()), batch, r)
        mark = self.mark
        if ingested:
            mark = _mark(traffic, batch, to_us(committed_at) or 0, self.mark)
        return LedgerState(max(self.last_batch, batch), committed, traffic, mark, self.tables)

    def record(self) -> dict[str, Any]:
        """The state as JSON-ready commit info (`from_record` reads it back)."""
        positions: dict[str, dict[str, int]] = {}
        for (topic, partition), end in sorted(self.committed.items()):
            positions.setdefault(topic, {})[str(partition)] = end
        return {
            "batch": self.last_batch,
            "committed": positions,
            "traffic": {
                k: [t.newest_us, t.read, t.drained, t.messages, t.bytes]
                for k, t in sorted(self.traffic.items())
            },
            "mark": None if self.mark is None else list(vars(self.mark).values()),
            "tables": {k: [v.identity, v.batch] for k, v in sorted(self.tables.items())},
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> LedgerState:
        """The state a ledger commit recorded (`record`)."""
        mark = record.get("mark")
        return cls(
            int(record["batch"]),
            {
                (topic, int(p)): int(end)
                for topic, parts in record["committed"].items()
                for p, end in parts.items()
            },
            {k: Traffic(*v) for k, v in record.get("traffic", {}).items()},
            None if mark is None else Mark(*mark),
            {k: Vouched(str(v[0]), int(v[1])) for k, v in record.get("tables", {}).items()},
        )


@dataclass(frozen=True)
class LedgerCommit:
    """A batch's ledger commit as it landed: what reading the ledger back would find.

    Attributes:
        state: The state the commit recorded (as `batch_state` reads it back).
        rows: The batch's rows as committed (`LEDGER_SCHEMA`).
    """

    state: LedgerState
    rows: pa.Table


def _read(before: Traffic, batch: int, r: Mapping[str, Any]) -> Traffic:
    """A Kafka partition's traffic once an ingest row of `batch` is counted."""
    messages = r.get("messages") or 0
    high = r.get("high_watermark")
    newest = to_us(r.get("max_event_time"))
    drained = before.drained
    # A range that read nothing but reached the end (its last offsets were transaction
    # markers or compacted away) drains the partition all the same.
    if high is not None and r["end_offset"] >= high:
        drained = True
    elif messages > 0:
        drained = False
    if newest is None or (before.newest_us is not None and newest <= before.newest_us):
        newest = before.newest_us
    return replace(
        before,
        newest_us=newest,
        read=batch if messages > 0 else before.read,
        drained=drained,
        messages=before.messages + messages,
        bytes=before.bytes + (r.get("bytes") or 0),
    )


def _mark(
    traffic: Mapping[str, Traffic], batch: int, committed_at_us: int, before: Mark | None
) -> Mark:
    """The watermark after an ingest batch: the lowest low-water mark of the Kafka
    partitions holding it back, never lower than it was."""
    holding = [
        (t.newest_us, key)
        for key, t in traffic.items()
        if t.newest_us is not None
        # A partition read to its end, and not read by this batch, holds nothing back.
        and not (t.drained and (t.read if t.read is not None else batch) < batch)
    ]
    low = min(holding, default=None)
    was = None if before is None else before.at_us
    at = was
    if low is not None and (was is None or low[0] > was):
        at = low[0]
    return Mark(batch, committed_at_us, at, None if low is None else low[1], was)


def fold_rows(rows: pa.Table, last: int = 0) -> LedgerState:
    """The state after every batch of the rows, folded batch by batch (`LedgerState.after`).

    Args:
        rows: Ledger rows, with at least `batch`, `kind`, `topic`, `partition` and
            `end_offset`; the watermark's columns (`RUN_COLUMNS`) where present.
        last: The ledger's last batch, when a batch without rows may be newer.
    """
    state = LedgerState(last, {})
    if rows.num_rows == 0:
        return state
    ordered = rows.sort_by([("batch", "ascending")]).to_pylist()
    at = 0
    while at < len(ordered):
        batch = ordered[at]["batch"]
        end = at
        while end < len(ordered) and ordered[end]["batch"] == batch:
            end += 1
        times = [r["committed_at"] for r in ordered[at:end] if r.get("committed_at")]
        when = max(times) if times else from_us(0)
        assert when is not None
        state = state.after(batch, when, ordered[at:end])
        at = end
    return state


def recorded(commit: dict[str, Any], key: str) -> Any:  # noqa: ANN401 - JSON as recorded
    """What a ledger commit recorded under `key`, read back from its commit info.

    Raises:
        LedgerDamaged: If it cannot be read: the commit's log entry was edited or
            damaged. Every plan reads it, so none is made until it is restored.
    """
    try:
        return json.loads(commit[key])
    except (TypeError, ValueError) as exc:
        version = commit.get("version")
        entry = "its log entry" if version is None else f"_delta_log/{int(version):020d}.json"
        batch = commit.get("strata.batch", "?")
        raise LedgerDamaged(
            f"the ledger's commit of batch {batch} records `{key}` in a form "
            f"that cannot be read ({type(exc).__name__}: {str(exc)[:120]}): {entry} was edited "
            "or damaged. Nothing was read or written. Restore that file of the ledger from a "
            "copy (or the store's object versions), then run again"
        ) from None
