"""`strata status`: committed ranges, batch history and lag, from the ledger.

The part a run watches too (`pipeline_view`: lag, time to retention, a lag that keeps
growing, and their warnings) goes into every run's summary and metrics.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from strata.batch.kafka import first_messages_ms, partition_states, retention_limits
from strata.batch.plan import PartitionState, PlanStore, vanished_topics
from strata.catalog.completeness import watermark_now
from strata.config import CompletenessConfig, KafkaSource
from strata.durations import human_duration
from strata.errors import KafkaUnavailable, PlanError, StrataError
from strata.maintenance.vacuum import table_health
from strata.store.identity import describe, table_problems
from strata.store.ledger import (
    RECENT_BATCHES,
    RUN_COLUMNS,
    LedgerState,
    lag_after,
    ledger_state,
    read_ledger,
    recent_state,
)
from strata.store.places import Places

if TYPE_CHECKING:
    from strata.batch.outcome import Seen


@dataclass(frozen=True)
class StatusSettings:
    """What a pipeline's status (and a run's view of it) reads besides its places.

    The entry points build it from the pipeline's (or routed table's) configuration,
    in one place: `strata.edge.status_settings`.

    Attributes:
        source: The brokers and topics the lag is measured against.
        lag_growth_runs: A lag that grew over this many batches in a row is warned of
            (`airflow.lag_growth_runs`).
        completeness: The `completeness` settings, for the watermark.
        small_file_bytes: Files under this many bytes count as small
            (`strata.maintenance.compact.small_bytes`).
    """

    source: KafkaSource
    lag_growth_runs: int
    completeness: CompletenessConfig
    small_file_bytes: int


def pipeline_status(places: Places, settings: StatusSettings, history: int = 10) -> dict[str, Any]:
    """What is committed, the latest batches, and the lag behind the brokers.

    Args:
        places: The pipeline's (or routed table's) places.
        settings: What else the status reads (`StatusSettings`).
        history: How many recent batches to list.

    Returns:
        JSON-ready status. `lag` is absent, and `broker_error` says why, when the
        brokers cannot be reached: the ledger alone still answers.
    """
    rows = read_ledger(places)
    state = ledger_state(places, rows)
    out = _view(places, settings, rows, state, listed=True)
    out["batches"] = _history(rows, history)
    losses = rows.filter(pc.equal(rows.column("kind"), "loss")) if rows.num_rows else rows
    out["losses"] = [
        {
            "batch": r["batch"],
            "topic": r["topic"],
            "partition": r["partition"],
            "start_offset": r["start_offset"],
            "end_offset": r["end_offset"],
            "messages_lost": r["end_offset"] - r["start_offset"],
            "note": r["note"],
        }
        for r in losses.to_pylist()
    ]
    edits = rows.filter(pc.is_in(rows.column("kind"), pa.array(["seek", "abandon", "reset"])))
    out["edits"] = [
        {
            "batch": r["batch"],
            "kind": r["kind"],
            "topic": r["topic"],
            "partition": r["partition"],
            "start_offset": r["start_offset"],
            "end_offset": r["end_offset"],
            "note": r["note"],
            "committed_at": r["committed_at"].isoformat(timespec="seconds"),
        }
        for r in (edits.to_pylist() if rows.num_rows else [])
    ]
    problems = table_problems(places, state)
    out["table_problems"] = [vars(p) for p in problems]
    if problems:
        # The tables are not those the ledger's batches went to: the next run stops, and
        # so does this command's exit code (the text says why and the ways out).
        out["identity_error"] = describe(places, problems)
    out["unfinished"] = _unfinished(places, state.last_batch + 1)
    out["watermark"] = watermark_now(settings.completeness, state)
    try:
        out["tables"] = table_health(places, settings.small_file_bytes)
    except StrataError as exc:
        # A table gone under its metastore entry cannot be measured; the problem is said.
        if not problems:
            raise
        out["tables"] = {}
        out["warnings"].append(f"the tables' files not counted: {exc}")
    small = sum(t["small_files"] for name, t in out["tables"].items() if name != "ledger")
    if small >= 100:
        out["warnings"].append(
            f"{small:,} small files in the tables: Trino and Spark scans slow down; "
            f"`strata compact --pipeline {places.pipeline}` merges them "
            "(the maintenance DAG does daily)"
        )
    return out


def pipeline_view(
    places: Places, settings: StatusSettings, watermark: bool = False, seen: Seen | None = None
) -> dict[str, Any]:
    """What a run leaves to watch: `pipeline_status` without the history and the tables.

    Args:
        places: The pipeline's (or routed table's) places.
        settings: What else the view reads (`StatusSettings`).
        watermark: Also give the completeness watermark (for the metrics).
        seen: What an idle run just read of the ledger and the brokers, taken instead
            of reading them again.

    Returns:
        The status's `pipeline`, `last_batch`, `last_committed_at`, `partitions`,
        `total_lag`, `lag_growth_runs`, `warnings` (retention and growing lag) and
        `broker_error`; with `watermark`, `watermark` too.
    """
    if seen is not None:
        state = seen.state
        out = _view(places, settings, seen.rows, state, listed=False, states=seen.states)
    else:
        # The newest batches are all the view shows: a ledger of years is not read. Both
        # from one snapshot: opening the ledger loads its file list, a file per batch.
        rows, state = recent_state(places, RUN_COLUMNS)
        out = _view(places, settings, rows, state, listed=False)
    if watermark:
        out["watermark"] = watermark_now(settings.completeness, state)
    return out


def _view(
    places: Places,
    settings: StatusSettings,
    rows: pa.Table,
    state: LedgerState,
    listed: bool,
    states: list[PartitionState] | None = None,
) -> dict[str, Any]:
    """Per partition the committed offset, lag and time to retention; warnings of both.

    Args:
        places: The pipeline's places.
        settings: What else the view reads.
        rows: The ledger.
        state: What it says is committed.
        listed: Also warn of topics a pattern no longer matches (a run warns of them
            itself).
        states: The partitions' watermarks, if just read; else the brokers are asked.
    """
    committed_at = rows.column("committed_at") if rows.num_rows else None
    last = pc.max(committed_at).as_py() if committed_at is not None else None
    out: dict[str, Any] = {
        "pipeline": places.pipeline,
        "last_batch": state.last_batch,
        "last_committed_at": None if last is None else last.isoformat(timespec="seconds"),
        "warnings": [],
    }
    lag: dict[tuple[str, int], dict[str, Any]] = {}
    try:
        unread: dict[tuple[str, int], int] = {}
        if states is None:
            states = partition_states(settings.source, state.committed)
        for s in states:
            committed = state.committed.get((s.topic, s.partition))
            position = committed if committed is not None else s.low
            lag[(s.topic, s.partition)] = {
                "low": s.low,
                "stable": s.high,
                "high": s.high_watermark,
                "lag": max(s.high_watermark - position, 0),
            }
            if s.held_back:
                lag[(s.topic, s.partition)].update(_held_back(s, out["warnings"]))
            # What a reader can read now: a message behind an open transaction would be
            # waited for in vain.
            if s.high > position:
                unread[(s.topic, s.partition)] = max(position, s.low)
        # Sizes and rates matter only where something is unread; a caught-up pipeline
        # skips the pass over every ingest row.
        seen = _observed(rows, state) if unread else {}
        _retention(settings.source, unread, lag, out["warnings"], seen)
        if listed:
            out["warnings"] += [
                f"topic `{topic}` matched topics_pattern and has committed offsets, but the "
                "brokers no longer list it (deleted); it is no longer read"
                for topic in vanished_topics(settings.source, states, state.committed)
            ]
    except KafkaUnavailable as exc:
        out["broker_error"] = str(exc)
    partitions = []
    for key in sorted(set(state.committed) | set(lag)):
        entry: dict[str, Any] = {
            "topic": key[0],
            "partition": key[1],
            "committed": state.committed.get(key),
        }
        entry.update(lag.get(key, {}))
        partitions.append(entry)
    out["partitions"] = partitions
    out["total_lag"] = sum(v["lag"] for v in lag.values()) if lag else None
    lags = ingest_lags(rows)
    out["lag_growth_runs"] = streak = lag_growth(lags)
    if streak >= settings.lag_growth_runs:
        out["warnings"].append(
            f"the lag left behind has grown {streak} batches in a row "
            f"({' -> '.join(f'{n:,}' for n in lags[-streak - 1 :] if n is not None)} messages): "
            "the pipeline reads less than arrives. Run it more often, raise "
            "limits.max_offsets_per_partition, or give it more Spark cores"
        )
    return out


TRANSACTIONS_TOOL = "kafka-transactions.sh --bootstrap-server BROKERS"
"""Kafka's own tool for transactions (`org.apache.kafka.tools.TransactionsCommand`)."""


OPEN_TRANSACTION_WARNING_S = 60
"""A transaction open longer than this (a Kafka producer's default `transaction.timeout.ms`)
is warned of; a transactional producer's transactions are open for moments all the time."""


def _held_back(s: PartitionState, warnings: list[str]) -> dict[str, Any]:
    """What a transaction left open holds back in a partition: figures, and a warning once
    it has been open longer than `OPEN_TRANSACTION_WARNING_S` (or since when is unknown).

    Args:
        s: The partition, held back (`PartitionState.held_back`).
        warnings: Where its warning goes.

    Returns:
        The status's `held_back` (messages between the last stable offset and the high
        watermark), `unstable_offset` (the open transaction's first offset) and, when
        the brokers gave its message's timestamp, `unstable_since` and
        `unstable_age_s`.
    """
    out: dict[str, Any] = {"held_back": s.held_back, "unstable_offset": s.high}
    since = ""
    if s.unstable_since_ms is not None:
        at = datetime.fromtimestamp(s.unstable_since_ms / 1000, tz=UTC)
        out["unstable_since"] = at.isoformat(timespec="seconds")
        age_ms = max(int(time.time() * 1000) - s.unstable_since_ms, 0)
        out["unstable_age_s"] = age_ms // 1000
        if out["unstable_age_s"] < OPEN_TRANSACTION_WARNING_S:
            return out
        since = f" since {out['unstable_since']} ({human_duration(age_ms)} ago)"
    warnings.append(
        f"partition {s.partition} of `{s.topic}`: {s.held_back:,} messages are held back by a "
        f"transaction open{since} at offset {s.high} (the last stable offset; the high "
        f"watermark is {s.high_watermark}): no read_committed reader gets past it until it "
        "commits, aborts or times out. If its producer is gone, find it with "
        f"`{TRANSACTIONS_TOOL} find-hanging --topic {s.topic} --partition {s.partition}` "
        f"and abort it with `{TRANSACTIONS_TOOL} abort --topic {s.topic} --partition "
        f"{s.partition} --start-offset {s.high}`; the next run then reads on"
    )
    return out


LAG_HISTORY = 64
"""Ingest batches `ingest_lags` looks back over: a growing lag's streak counts up to one less."""


def ingest_lags(rows: pa.Table) -> list[int | None]:
    """The messages each ingest batch left behind its planned high watermarks, oldest first.

    Args:
        rows: The ledger.

    Returns:
        One figure per ingest batch of the newest `LAG_HISTORY`
        (`strata.store.ledger.lag_after`), None where its watermarks were not recorded.
    """
    if rows.num_rows == 0:
        return []
    ingested = rows.filter(pc.equal(rows.column("kind"), "ingest")).select(
        ["batch", "high_watermark", "end_offset"]
    )
    # The newest batches are enough for any streak worth a warning; a ledger of years
    # is not turned into Python rows on every run.
    batches = pc.unique(ingested.column("batch")).sort()
    if len(batches) > LAG_HISTORY:
        newest = batches[-LAG_HISTORY].as_py()
        ingested = ingested.filter(pc.greater_equal(ingested.column("batch"), newest))
    by_batch: dict[int, list[dict[str, Any]]] = {}
    for r in ingested.to_pylist():
        by_batch.setdefault(r["batch"], []).append(r)
    return [lag_after(by_batch[b]) for b in sorted(by_batch)]


def lag_growth(lags: Sequence[int | None]) -> int:
    """How many of the newest batches in a row each left more lag behind than the one before.

    Args:
        lags: The lag each batch left, oldest first (`ingest_lags`).

    Returns:
        The length of the streak that ends with the newest batch; a batch whose lag is
        unknown, or not larger than the one before, ends it (0: the newest did not grow).
    """
    streak = 0
    for before, after in reversed(list(itertools.pairwise(lags))):
        if before is None or after is None or after <= before:
            break
        streak += 1
    return streak


def _unfinished(places: Places, batch: int) -> dict[str, Any] | None:
    """The saved plan of the batch that is planned but not committed, if any."""
    store = PlanStore(places)
    try:
        plan = store.load(batch)
    except PlanError as exc:
        return {"batch": batch, "file": store.describe(batch), "error": str(exc)}
    if plan is None:
        return None
    return {
        "batch": batch,
        "file": store.describe(batch),
        "kind": plan.kind,
        "source": plan.source,
        "created_at": plan.created_at,
        "note": plan.note,
        "ranges": [f"{r.topic}:{r.partition} [{r.start}, {r.end})" for r in plan.ranges],
    }


@dataclass(frozen=True)
class Observed:
    """What the ledger shows of a partition's traffic.

    Attributes:
        bytes_per_message: Mean key + value bytes of the messages read.
        since_offset: The high watermark at an earlier batch, to measure the rate from.
        since_s: When that batch committed (epoch seconds).
    """

    bytes_per_message: float
    since_offset: int | None
    since_s: float | None


# How many recent batches the produce rate is measured over.
RATE_WINDOW = 10


def _observed(rows: pa.Table, state: LedgerState) -> dict[tuple[str, int], Observed]:
    """Per partition: mean message size, and a past high watermark with its time.

    The size is of every message ingested (the ledger's state counts them); the rate is
    measured over the newest rows, of the newest `RECENT_BATCHES` batches at most.
    """
    recent: dict[tuple[str, int], list[dict[str, Any]]] = {}
    if rows.num_rows:
        ingested = rows.filter(pc.equal(rows.column("kind"), "ingest"))
        newest = pc.max(ingested.column("batch")).as_py() if ingested.num_rows else None
        if newest is not None:
            ingested = ingested.filter(
                pc.greater(ingested.column("batch"), newest - RECENT_BATCHES)
            ).sort_by([("batch", "descending")])
        for r in ingested.to_pylist():
            recent.setdefault((r["topic"], r["partition"]), []).append(r)
    out = {}
    for name, traffic in state.traffic.items():
        topic, _, partition = name.rpartition(":")
        key = (topic, int(partition))
        if not traffic.messages:
            continue
        marked = [r for r in recent.get(key, [])[:RATE_WINDOW] if r["high_watermark"] is not None]
        since = marked[-1] if marked else None
        out[key] = Observed(
            traffic.bytes / traffic.messages,
            since["high_watermark"] if since else None,
            since["committed_at"].timestamp() if since else None,
        )
    return out


def size_time_left(
    retention_bytes: int, lag: int, bytes_per_message: float, rate: float | None
) -> float | None:
    """Seconds until `retention.bytes` deletes the first unread message of a partition.

    The broker keeps about the newest `retention.bytes` of each partition: the first
    unread message goes once the unread bytes plus what arrives after them pass it.

    Args:
        retention_bytes: The topic's `retention.bytes` (per partition).
        lag: Unread messages.
        bytes_per_message: Mean message size.
        rate: Messages produced per second, if known.

    Returns:
        0 when the unread bytes already reach the limit, None when the partition is
        not growing (or its rate is unknown) and they do not, else the seconds left.
    """
    unread = lag * bytes_per_message
    if unread >= retention_bytes:
        return 0.0
    if not rate or rate <= 0 or bytes_per_message <= 0:
        return None
    return (retention_bytes - unread) / (rate * bytes_per_message)


def _retention(
    source: KafkaSource,
    unread: dict[tuple[str, int], int],
    lag: dict[tuple[str, int], dict[str, Any]],
    warnings: list[str],
    observed: dict[tuple[str, int], Observed],
) -> None:
    """Age of the oldest unread message, and how long until retention deletes it.

    By time, a message is deleted about `retention.ms` after its timestamp (the broker
    drops whole segments, so it may live a little longer, never shorter). By size, the
    estimate uses the mean message size and the produce rate the ledger shows; the
    broker's stored size adds per-record overhead and compression takes some away, so
    it is an estimate, and the warning comes early (at three quarters of the limit).
    """
    # The topics status listed already: a pattern's are not asked of the brokers again.
    limits = retention_limits(source, {topic for topic, _ in lag})
    oldest = first_messages_ms(source, unread) if unread else {}
    now_ms = int(time.time() * 1000)
    for (topic, partition), info in lag.items():
        keep_ms = limits.get(topic, {}).get("ms")
        keep_bytes = limits.get(topic, {}).get("bytes")
        info["retention_ms"] = keep_ms
        info["retention_bytes"] = keep_bytes
        where = f"partition {partition} of `{topic}`"
        left: list[tuple[float, str]] = []
        ts = oldest.get((topic, partition))
        if ts is not None:
            info["oldest_unread_age_s"] = max(now_ms - ts, 0) // 1000
            if keep_ms is not None:
                left_s = (ts + keep_ms - now_ms) // 1000
                left.append((left_s, "retention.ms"))
                if left_s < keep_ms // 1000 // 4:
                    warnings.append(
                        f"{where}: unread messages are deleted by retention in "
                        f"{human_duration(max(left_s, 0) * 1000)} ({info['lag']:,} messages "
                        "behind); run the pipeline or raise retention.ms"
                    )
        seen = observed.get((topic, partition))
        if keep_bytes is not None and seen is not None and info["lag"] > 0:
            rate = None
            if seen.since_offset is not None and seen.since_s is not None:
                elapsed = now_ms / 1000 - seen.since_s
                if elapsed >= 1:
                    rate = max(info["high"] - seen.since_offset, 0) / elapsed
            unread_bytes = int(info["lag"] * seen.bytes_per_message)
            info["unread_bytes"] = unread_bytes
            info["produce_rate_msgs_s"] = None if rate is None else round(rate, 3)
            by_size = size_time_left(keep_bytes, info["lag"], seen.bytes_per_message, rate)
            if by_size is not None:
                left.append((int(by_size), "retention.bytes"))
            if unread_bytes >= keep_bytes * 3 // 4:
                if by_size == 0:
                    when = "may be deleting them now"
                elif by_size is None:
                    when = "deletes them once the partition grows"
                else:
                    when = f"deletes them in about {human_duration(int(by_size * 1000))}"
                warnings.append(
                    f"{where}: about {unread_bytes / 1e6:,.1f} MB are unread "
                    f"({info['lag']:,} messages) against retention.bytes of "
                    f"{keep_bytes / 1e6:,.1f} MB per partition; size-based retention {when}. "
                    "Run the pipeline or raise retention.bytes"
                )
        if left:
            seconds, basis = min(left)
            info["time_to_retention_s"] = int(seconds)
            info["retention_basis"] = basis


def _history(rows: pa.Table, limit: int) -> list[dict[str, Any]]:
    if rows.num_rows == 0:
        return []
    grouped = rows.group_by(["batch", "kind"]).aggregate(
        [
            ("messages", "sum"),
            ("rows", "sum"),
            ("quarantined", "sum"),
            ("gaps", "sum"),
            ("skipped", "sum"),
            ("bytes", "sum"),
            ("late_rows", "sum"),
            ("committed_at", "max"),
        ]
    )
    grouped = grouped.sort_by([("batch", "descending")]).slice(0, limit)
    out = []
    for rec in grouped.to_pylist():
        out.append(
            {
                "batch": rec["batch"],
                "kind": rec["kind"],
                "messages": rec["messages_sum"],
                "rows": rec["rows_sum"],
                "quarantined": rec["quarantined_sum"],
                "gaps": rec["gaps_sum"],
                "skipped": rec["skipped_sum"] or 0,
                "bytes": rec["bytes_sum"],
                "late_rows": rec["late_rows_sum"],
                "committed_at": rec["committed_at_max"].isoformat(timespec="seconds"),
            }
        )
    return out


def render_status(status: dict[str, Any]) -> str:
    """The status as text."""
    lines = [f"pipeline {status['pipeline']}: last committed batch {status['last_batch']}"]
    if "broker_error" in status:
        # The error itself is the command's last line, on stderr.
        lines.append("lag unknown: the brokers did not answer")
    for warning in status.get("warnings", []):
        lines.append(f"WARNING: {warning}")
    for problem in status.get("table_problems", []):
        lines.append(f"TABLE {problem['problem'].upper()}: {problem['text']}")
    lines.append(
        f"{'topic':>16} {'part':>4} {'committed':>12} {'stable':>12} {'high':>12} {'lag':>10} "
        f"{'held back':>10} {'oldest unread':>14} {'to retention':>13} {'by':<15}"
    )
    for p in status["partitions"]:
        committed = "-" if p["committed"] is None else str(p["committed"])
        age = p.get("oldest_unread_age_s")
        left = p.get("time_to_retention_s")
        lines.append(
            f"{p['topic']:>16} {p['partition']:>4} {committed:>12} "
            f"{p.get('stable', '?')!s:>12} {p.get('high', '?')!s:>12} {p.get('lag', '?')!s:>10} "
            f"{p.get('held_back', 0):>10} "
            f"{'-' if age is None else human_duration(age * 1000):>14} "
            f"{'-' if left is None else human_duration(max(left, 0) * 1000):>13} "
            f"{p.get('retention_basis', '-'):<15}"
        )
    if status["total_lag"] is not None:
        lines.append(f"total lag: {status['total_lag']:,} messages")
    mark = status.get("watermark")
    if mark is not None:
        lines.append(
            f"complete before {mark['complete_before']} (watermark {mark['at']}, held back by "
            f"{mark['holding'] or 'no partition'}); `strata completeness` lists the partitions"
        )
    for lost in status.get("losses", []):
        lines.append(
            f"LOSS: batch {lost['batch']}: offsets [{lost['start_offset']}, {lost['end_offset']}) "
            f"of partition {lost['partition']} of `{lost['topic']}` "
            f"({lost['messages_lost']:,} messages) were deleted by retention before they were "
            f"read; {lost['note']}"
        )
    for edit in status.get("edits", []):
        lines.append(
            f"EDIT: batch {edit['batch']} {edit['kind']} {edit['topic']}:{edit['partition']} "
            f"[{edit['start_offset']}, {edit['end_offset']}) at {edit['committed_at']}: "
            f"{edit['note']}"
        )
    unfinished = status.get("unfinished")
    if unfinished is not None:
        if "error" in unfinished:
            lines.append(f"UNFINISHED: batch {unfinished['batch']}: {unfinished['error']}")
        else:
            lines.append(
                f"UNFINISHED: batch {unfinished['batch']}, a {unfinished['kind']} planned at "
                f"{unfinished['created_at']} ({', '.join(unfinished['ranges'])}); the next "
                "`strata run` finishes it"
            )
    if status.get("tables"):
        lines.append(
            f"{'table':>16} {'files':>8} {'mean MB':>9} {'small':>8} {'log since checkpoint':>21}"
        )
        for name, t in status["tables"].items():
            log = t["log_since_checkpoint"]
            lines.append(
                f"{name:>16} {t['files']:>8,} {t['mean_file_mb']:>9.2f} {t['small_files']:>8,} "
                f"{'-' if log is None else f'{log:,} commits':>21}"
            )
    if status["batches"]:
        lines.append("recent batches:")
        for b in status["batches"]:
            lines.append(
                f"  batch {b['batch']:>5} {b['kind']:<8} {b['messages']:>10,} msgs "
                f"{b['rows']:>10,} rows {b['quarantined']:>6,} quarantined "
                f"{b['gaps']:>6,} gaps "
                + (f"{b['skipped']:,} tombstones skipped " if b["skipped"] else "")
                + f" {b['committed_at']}"
            )
    return "\n".join(lines)
