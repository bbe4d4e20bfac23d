"""When an event-time partition is complete: it will not change any more.

The rule is decided from ledger facts only, never the clock, so asking again gives
the same answer. Each Kafka partition's low-water event time is the newest event time
read from it so far. After every ingest batch the watermark is the lowest low-water
mark among the Kafka partitions that hold it back: a partition that was read to its
end when its batch was planned, and has read nothing in a later batch, holds nothing
back (an idle partition would otherwise stop completeness for ever), nor does one that
never yielded an event time. The watermark never goes back. A partition of the data
table (`dt=`/`hr=`, or `dt=` alone, in `partitioning.timezone`) is complete from the
first ingest batch whose watermark is at or past its end plus `completeness.lateness`,
unless a failed quality gate marked it incomplete, for as long as that mark stands.

Rows that land in a partition after the batch that completed it are late after
completion: counted per partition (from each row's `_batch`, which compaction keeps)
and reported, never hidden. Only partitions that hold rows are marked; a partition
whose first rows arrive after its completion is complete, and all its rows are late.

The pure rule (`watermarks`, `completing_batch`, `partition_states`) takes Arrow and
plain values; `completeness` reads the ledger, the data table's file list and the
quality marks, and `write_markers` writes the `_SUCCESS` files. What a run asks after
its batch (the partitions it completed, its rows late after completion) is had from
the watermarks its ledger commit recorded (`strata.store.ledger.batch_state`) and the
batch's own files, so it costs the same after years of batches.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from strata.catalog._files import DataFile, candidates, late_rows, table_files
from strata.config import CompletenessConfig, PartitioningConfig
from strata.durations import parse_duration_ms
from strata.quality.store import ResultStore
from strata.schema.avro import partition_columns
from strata.schema.partitions import partition_span
from strata.store.delta import open_table
from strata.store.files import write_bytes_atomically
from strata.store.ledger import (
    READ_KINDS,
    LedgerState,
    batch_state,
    from_us,
    ledger_state,
    read_ledger,
    recent_ledger,
)
from strata.store.locations import current_locations, place
from strata.store.places import Places, TableRef

if TYPE_CHECKING:
    from deltalake import DeltaTable

MARKER = "_SUCCESS"
# Metastore parameters of a complete partition (and of the data table, for Delta
# tables, whose partitions the metastore does not list).
COMPLETE_KEY = "strata.complete"
COMPLETED_AT_KEY = "strata.completed_at"
COMPLETED_BATCH_KEY = "strata.completed_batch"
WATERMARK_KEY = "strata.watermark"
COMPLETE_BEFORE_KEY = "strata.complete_before"
PARTITION_KEYS = (COMPLETE_KEY, COMPLETED_AT_KEY, COMPLETED_BATCH_KEY, WATERMARK_KEY)


@dataclass(frozen=True)
class Watermark:
    """The watermark as it stood after one ingest batch.

    Attributes:
        batch: The ingest batch.
        committed_at: When the batch was committed (a ledger fact).
        at: The watermark: every Kafka partition holding it back has read events at
            least this new. None until one has an event time.
        holding: The Kafka partition (`topic:partition`) with the lowest low-water mark
            after the batch, the one holding the watermark back; None if none does.
    """

    batch: int
    committed_at: datetime
    at: datetime | None
    holding: str | None


def watermarks(ledger: pa.Table) -> list[Watermark]:
    """The watermark after each ingest batch of the ledger, oldest batch first.

    The ledger's own fold (`strata.store.ledger.LedgerState.after`), which each ledger
    commit records for its batch, run over the rows.

    Args:
        ledger: Ledger rows (`strata.store.ledger.read_ledger`); kinds other than `ingest` are
            ignored: losses, seeks and re-reads of committed offsets bring no new event
            time.

    Returns:
        One entry per ingest batch; `at` never decreases from one to the next.
    """
    rows = ledger.filter(pc.equal(ledger.column("kind"), "ingest"))
    if rows.num_rows == 0:
        return []
    columns = ["batch", "kind", "topic", "partition", "messages", "end_offset"]
    ordered = (
        rows.select([*columns, "high_watermark", "max_event_time", "committed_at"])
        .sort_by([("batch", "ascending")])
        .to_pylist()
    )
    state = LedgerState(0, {})
    out: list[Watermark] = []
    at = 0
    while at < len(ordered):
        batch, committed_at = ordered[at]["batch"], ordered[at]["committed_at"]
        end = at
        while end < len(ordered) and ordered[end]["batch"] == batch:
            end += 1
        state = state.after(batch, committed_at, ordered[at:end])
        mark = state.mark
        assert mark is not None  # an ingest batch always leaves one
        out.append(Watermark(batch, committed_at, from_us(mark.at_us), mark.holding))
        at = end
    return out


def completing_batch(
    end: datetime, lateness: timedelta, marks: list[Watermark]
) -> Watermark | None:
    """The first ingest batch after which a partition ending at `end` was complete.

    Args:
        end: The partition's end (exclusive), as an instant.
        lateness: How long after its end rows may still come.
        marks: The watermarks of `watermarks`, oldest first.

    Returns:
        That batch's watermark, or None while the partition is not complete.
    """
    return _Due(marks).first(end + lateness)


class _Due:
    """The watermarks in a form that finds, by bisection, the first at or past an instant."""

    def __init__(self, marks: list[Watermark]) -> None:
        self.known = [m for m in marks if m.at is not None]
        self.instants = [m.at for m in self.known if m.at is not None]

    def first(self, due: datetime) -> Watermark | None:
        at = bisect.bisect_left(self.instants, due)
        return self.known[at] if at < len(self.known) else None


@dataclass
class PartitionState:
    """One partition of the data table, as completeness sees it.

    Attributes:
        partition: Its path, `dt=…/hr=…` (and a field partition's column).
        end: The end of its event-time span (exclusive), ISO-8601 in UTC.
        complete: Complete, and not held by a quality mark.
        completed_batch: The ingest batch after which its span was complete (a
            partition held by a mark has one too).
        completed_at: When that batch was committed, ISO-8601.
        watermark: The watermark after that batch, ISO-8601.
        held_by: Batches whose failed quality gate marked it incomplete.
        late_rows: Rows that landed after `completed_batch`, by ingest batches.
    """

    partition: str
    end: str
    complete: bool
    completed_batch: int | None = None
    completed_at: str | None = None
    watermark: str | None = None
    held_by: list[int] = field(default_factory=list)
    late_rows: int = 0

    def parameters(self) -> dict[str, str]:
        """The metastore partition parameters that say it is complete; empty if not."""
        if not self.complete or self.completed_at is None or self.watermark is None:
            return {}
        return {
            COMPLETE_KEY: "true",
            COMPLETED_AT_KEY: self.completed_at,
            COMPLETED_BATCH_KEY: str(self.completed_batch),
            WATERMARK_KEY: self.watermark,
        }


def partition_states(
    partitions: list[str],
    marks: list[Watermark],
    lateness: timedelta,
    zone: str,
    held: dict[str, list[int]] | None = None,
) -> list[PartitionState]:
    """Each partition's completeness from the watermarks and the quality marks.

    Args:
        partitions: Partition paths holding rows (`dt=…/hr=…/…`).
        marks: The watermarks of `watermarks`, oldest first.
        lateness: `completeness.lateness`.
        zone: `partitioning.timezone`: the zone `dt` and `hr` are local to.
        held: Partitions a failed quality gate marked incomplete, with those batches.

    Returns:
        The partitions that name an event-time span, in path order; anything else is
        left out.
    """
    due = _Due(marks)
    out = []
    for partition in sorted(partitions):
        values = dict(part.partition("=")[::2] for part in partition.split("/"))
        span = partition_span(values.get("dt", ""), values.get("hr"), zone)
        if span is None:
            continue
        done = due.first(span[1] + lateness)
        marked = sorted((held or {}).get(partition, []))
        out.append(
            PartitionState(
                partition,
                _iso(span[1]),
                done is not None and not marked,
                None if done is None else done.batch,
                None if done is None else _iso(done.committed_at),
                None if done is None or done.at is None else _iso(done.at),
                marked,
            )
        )
    return out


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


@dataclass
class Completeness:
    """A pipeline's completeness as the ledger stands.

    Attributes:
        pipeline: The pipeline (or table of a routed pipeline).
        asset: The URI of its Airflow Asset.
        lateness: `completeness.lateness`.
        batch: The newest ingest batch.
        watermark: The watermark after it, ISO-8601; None before any event time.
        holding: The Kafka partition holding the watermark back.
        partitions: Every partition of the data table holding rows.
        completed: Partitions that `batch` completed (and no mark holds).
        late: Rows per partition that `batch` landed after the partition's completion.
    """

    pipeline: str
    asset: str
    lateness: str
    batch: int | None
    watermark: str | None
    holding: str | None
    partitions: list[PartitionState]
    completed: list[str] = field(default_factory=list)
    late: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)

    def complete_before(self) -> str | None:
        """The instant before which every partition's span is complete (held ones aside)."""
        if self.watermark is None:
            return None
        return _iso(datetime.fromisoformat(self.watermark) - _lateness(self.lateness))


@dataclass(frozen=True)
class BatchFacts:
    """What one ingest batch's completeness reads of the tables, kept to be read once.

    A run works out its batch's completeness twice: for the rows late after completion
    (`strata.run`), and after the quality gate to mark and announce what it completed
    (`strata.catalog.register.publish_completeness`). Both read the same two things,
    which cost more than the rest: the state the batch's ledger commit recorded, and the
    data table's files after the batch's commit (a file per event hour and task).

    Attributes:
        batch: The batch.
        state: The state its ledger commit recorded.
        adds: The data table's add actions, flattened; None if it has no table.
    """

    batch: int
    state: LedgerState
    adds: pa.Table | None


def batch_facts(
    places: Places, batch: int, data: DeltaTable | None = None, state: LedgerState | None = None
) -> BatchFacts | None:
    """Read what the batch's completeness reads (`BatchFacts`); None where it reads rows.

    Args:
        places: The pipeline's (or routed table's) places.
        batch: The ingest batch just committed.
        data: The Delta data table opened already, at a snapshot holding the batch's
            commit (the run's own handle); opened here if not given.
        state: The state the batch's ledger commit recorded, as the run committed it;
            read from the ledger if not given.

    Returns:
        The facts, or None for a plain Parquet table or a batch whose ledger commit
        recorded no state (`_batch_completeness` then falls back to the rows).
    """
    table = places.table("table")
    if table.format != "delta":
        return None
    if state is None:
        state = batch_state(places, batch)
    if state is None:
        return None
    if data is None:
        data = open_table(table.uri, table.options)
    adds = pa.table(data.get_add_actions(flatten=True)) if data is not None else None
    return BatchFacts(batch, state, adds)


def watermark_now(settings: CompletenessConfig, state: LedgerState) -> dict[str, str | None] | None:
    """The watermark after the newest ingest batch, for `strata status` and the metrics.

    Args:
        settings: The pipeline's `completeness` settings.
        state: What the ledger says now (`strata.store.ledger.ledger_state`).

    Returns:
        `at`, `holding` (the Kafka partition holding it back) and `complete_before` (a
        partition ending by then is complete, unless the quality gate holds it); None
        when completeness is off or no event time was read yet.
    """
    if not settings.enabled or state.mark is None:
        return None
    at = from_us(state.mark.at_us)
    if at is None:
        return None
    return {
        "at": _iso(at),
        "holding": state.mark.holding,
        "complete_before": _iso(at - _lateness(settings.lateness)),
    }


def _lateness(lateness: str) -> timedelta:
    return timedelta(milliseconds=parse_duration_ms(lateness))


def completeness(
    places: Places,
    settings: CompletenessConfig,
    partitioning: PartitioningConfig,
    gate: str,
    asset: str,
    batch: int | None = None,
    ledger: pa.Table | None = None,
    *,
    totals: bool = True,
    quality: bool = True,
    since: int | None = None,
    facts: BatchFacts | None = None,
) -> Completeness:
    """Each partition's completeness, and what one ingest batch completed.

    Args:
        places: The pipeline's (or routed table's) places: its ledger, data table and
            quality results.
        settings: Its `completeness` settings (the lateness).
        partitioning: Its `partitioning` (the columns, and the zone `dt` and `hr` are
            local to).
        gate: Its `quality.gate`: under `fail`, a batch not checked yet holds the
            partitions it wrote.
        asset: The URI of the data table's Airflow Asset (`PipelineConfig.asset_uri`).
        batch: The batch whose newly complete partitions and late rows are wanted;
            None for the newest ingest batch. The partitions' states are as the ledger
            and the quality marks stand now.
        ledger: The ledger rows, if already read.
        totals: Count every partition's rows late after completion, not only the
            batch's (a run leaves this to the completeness view).
        quality: Read the quality marks (every batch's stored result); without them no
            partition is held, which is enough to count late rows.
        since: The last batch whose completed partitions were announced: `completed`
            then lists those completed by any batch after it up to `batch`, so a run
            that announced nothing (its gate failed, its task died) loses no partition.
            None lists those `batch` completed.
        facts: What the batch's completeness read of the tables already
            (`batch_facts`), used where it is of `batch`.

    Returns:
        The completeness.
    """
    if not totals and ledger is None and (since is None or batch is None or since >= batch - 1):
        found = _batch_completeness(
            places,
            settings,
            partitioning,
            gate,
            asset,
            batch,
            quality=quality,
            since=since,
            facts=facts if facts is not None and facts.batch == batch else None,
        )
        if found is not None:
            return found
    rows = read_ledger(places) if ledger is None else ledger
    marks = watermarks(rows)
    ingested = {m.batch for m in marks}
    if batch is None and marks:
        batch = marks[-1].batch
    table = places.table("table")
    files = table_files(table, partitioning)
    held = _held(ResultStore.of(places), gate, rows, files) if quality else {}
    states = partition_states(
        sorted({f.partition for f in files}),
        marks,
        _lateness(settings.lateness),
        partitioning.timezone,
        held,
    )
    since_batch = {s.partition: s.completed_batch for s in states if s.completed_batch is not None}
    if totals:
        by_name = {s.partition: s for s in states}
        for partition, count in late_rows(table, files, since_batch, ingested).items():
            by_name[partition].late_rows = count
    now = next((m for m in marks if m.batch == batch), None)
    found = Completeness(
        places.pipeline,
        asset,
        settings.lateness,
        batch,
        None if now is None or now.at is None else _iso(now.at),
        None if now is None else now.holding,
        states,
    )
    if batch is not None:
        after = batch - 1 if since is None else since
        found.completed = [
            s.partition
            for s in states
            if s.complete and s.completed_batch is not None and after < s.completed_batch <= batch
        ]
    if now is not None:
        found.late = late_rows(table, files, since_batch, ingested, only=batch)
    return found


def _batch_completeness(
    places: Places,
    settings: CompletenessConfig,
    partitioning: PartitioningConfig,
    gate: str,
    asset: str,
    batch: int | None,
    *,
    quality: bool,
    since: int | None,
    facts: BatchFacts | None = None,
) -> Completeness | None:
    """What one ingest batch changed, from the states its ledger commit recorded.

    The watermark only rises, so a partition due (its end plus the lateness) by the
    watermark before the batch was complete before it: the batch's rows there are
    late; one due between that watermark and the batch's own was completed by the
    batch. Only the batch's own files, the partitions whose spans end in that interval
    and those a quality mark holds are looked at, never the ledger's history, so a run
    costs the same after years of batches. `partitions` lists those alone.

    Returns:
        The completeness, or None where the rows must decide: a plain Parquet table
        (its files are listed from storage), a ledger whose commit of the batch
        recorded no state, or a batch that is not an ingest.
    """
    table = places.table("table")
    if table.format != "delta":
        return None
    if facts is not None:
        state: LedgerState | None = facts.state
    else:
        state = ledger_state(places) if batch is None else batch_state(places, batch)
    mark = None if state is None else state.mark
    if mark is None or (batch is not None and mark.batch != batch):
        return None
    lateness = _lateness(settings.lateness)
    now, before = from_us(mark.at_us), from_us(mark.before_us)
    if facts is not None:
        adds = facts.adds
    else:
        delta = open_table(table.uri, table.options)
        adds = pa.table(delta.get_add_actions(flatten=True)) if delta is not None else None
    columns = partition_columns(partitioning)
    held = ResultStore.of(places).incomplete() if quality else {}
    wrote = candidates(adds, columns, mark.batch, None, None, set())
    due = candidates(adds, columns, None, before, now, set(held), lateness)
    # By path, in a set: a batch over thousands of hours wrote thousands of files.
    seen = {f.path for f in wrote}
    files = wrote + [f for f in due if f.path not in seen]
    if quality and gate == "fail":
        rows = recent_ledger(places, ["batch", "kind", "rows"])
        held = _held(ResultStore.of(places), gate, rows, files)
    states = partition_states(
        sorted({f.partition for f in files}),
        []
        if now is None
        else [Watermark(mark.batch, from_us(mark.committed_at_us) or now, now, mark.holding)],
        lateness,
        partitioning.timezone,
        held,
    )
    earlier = {
        s.partition
        for s in states
        if before is not None
        and s.completed_batch is not None
        and datetime.fromisoformat(s.end) + lateness <= before
    }
    late = late_rows(
        table, wrote, {p: mark.batch - 1 for p in earlier}, {mark.batch}, only=mark.batch
    )
    # The batch completed those due after the watermark before it; the others were
    # complete before it, and their completing batch is not looked for.
    kept = [s for s in states if s.partition not in earlier]
    kept += [
        replace(s, completed_batch=None, completed_at=None, watermark=None)
        for s in states
        if s.partition in earlier and s.held_by
    ]
    announced = since is not None and since >= mark.batch
    return Completeness(
        places.pipeline,
        asset,
        settings.lateness,
        mark.batch,
        None if now is None else _iso(now),
        mark.holding,
        sorted(kept, key=lambda s: s.partition),
        [] if announced else [s.partition for s in kept if s.complete],
        late,
    )


def _held(
    store: ResultStore, gate: str, rows: pa.Table, files: list[DataFile]
) -> dict[str, list[int]]:
    """Partitions the quality gate holds, with the batches holding them.

    Those a failed check marked incomplete (under `quality.gate: fail`, when it was
    checked); and while the gate is `fail`, those a batch not checked yet wrote rows
    to: its check may still fail, so until it has run no partition it touched is said
    to be complete.
    """
    held = store.incomplete()
    if gate != "fail":
        return held
    wrote = rows.filter(
        pc.and_(pc.is_in(rows.column("kind"), pa.array(READ_KINDS)), pc.greater(rows["rows"], 0))
    )
    unchecked = sorted(set(wrote.column("batch").to_pylist()) - store.checked())
    for f in files:
        # A compacted file (no bounds) holds rows of settled partitions' old batches.
        if not unchecked or f.low is None or f.high is None:
            continue
        first = bisect.bisect_left(unchecked, f.low)
        if first < len(unchecked) and unchecked[first] <= f.high:
            batches = held.setdefault(f.partition, [])
            batches.extend(b for b in unchecked[first:] if b <= f.high and b not in batches)
    return held


def late_warnings(found: Completeness) -> list[str]:
    """The run summary's warnings about the batch's rows that landed after completion."""
    if not found.late:
        return []
    listed = ", ".join(f"{p} ({n})" for p, n in sorted(found.late.items())[:5])
    more = len(found.late) - 5
    return [
        f"batch {found.batch} landed {sum(found.late.values())} rows in "
        f"{len(found.late)} partitions already complete: {listed}"
        + (f" and {more} more" if more > 0 else "")
        + f" (later than completeness.lateness {found.lateness} allowed)"
    ]


def write_markers(
    ref: TableRef, settings: CompletenessConfig, found: Completeness
) -> tuple[list[str], list[str]]:
    """Write `_SUCCESS` into each complete partition's directory; remove it from held ones.

    The directory is the one readers read: a plain Parquet partition's directory in use
    (a compaction moves it). A name beginning with `_` is hidden from Spark, Hive,
    Trino and Arrow, and Delta readers read only the files of the log. Idempotent: a
    marker already there is left as it is.

    Args:
        ref: The data table.
        settings: The pipeline's `completeness` settings; nothing is written unless
            `marker` is on.
        found: Its completeness.

    Returns:
        The partitions marked now, and those whose marker was removed.
    """
    if not settings.marker:
        return [], []
    fs, root = ref.filesystem()
    where = current_locations(fs, root) if ref.format == "parquet" else {}
    paths = {s.partition: f"{root}/{place(s.partition, where)}/{MARKER}" for s in found.partitions}
    infos = {
        p: i.type != pafs.FileType.NotFound
        for p, i in zip(paths, fs.get_file_info(list(paths.values())), strict=True)
    }
    written, removed = [], []
    for state in found.partitions:
        path = paths[state.partition]
        if state.complete and not infos[state.partition]:
            body = json.dumps(state.parameters(), sort_keys=True).encode()
            write_bytes_atomically(fs, path, body)
            written.append(state.partition)
        elif not state.complete and infos[state.partition]:
            fs.delete_file(path)
            removed.append(state.partition)
    return written, removed


def render_completeness(found: Completeness, limit: int = 48) -> str:
    """The completeness for people: the watermark, then the newest partitions."""
    head = (
        f"{found.pipeline}: watermark {found.watermark or 'none yet'} after batch "
        f"{found.batch if found.batch is not None else '-'}"
        + (f", held back by {found.holding}" if found.holding else "")
        + f"; lateness {found.lateness}; Airflow Asset {found.asset}"
    )
    lines = [head]
    shown = found.partitions[-limit:]
    if len(found.partitions) > len(shown):
        lines.append(f"  ({len(found.partitions) - len(shown)} older partitions not shown)")
    for s in shown:
        if s.complete:
            what = f"complete since batch {s.completed_batch} ({s.completed_at})"
        elif s.held_by:
            what = f"incomplete: failed quality in batch {', '.join(map(str, s.held_by))}"
        else:
            what = f"open until the watermark reaches {s.end} + {found.lateness}"
        late = f"; {s.late_rows} rows late after completion" if s.late_rows else ""
        lines.append(f"  {s.partition}  {what}{late}")
    if found.completed:
        lines.append(f"completed by batch {found.batch}: {', '.join(found.completed)}")
    lines.extend(late_warnings(found))
    return "\n".join(lines)
