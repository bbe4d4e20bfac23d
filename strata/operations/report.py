"""The run summary: a table for people and one JSON line for scripts and Airflow."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from strata.batch.kafka import client_version
from strata.batch.outcome import RunOutcome
from strata.durations import human_duration


def _iso(us: int | None) -> str | None:
    if us is None:
        return None
    return datetime.fromtimestamp(us / 1_000_000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def summary_dict(outcome: RunOutcome) -> dict[str, Any]:
    """The outcome as JSON-ready values (callers that print or hand it on redact it)."""
    total_bytes = sum(r.bytes for r in outcome.ranges)
    messages = sum(r.messages for r in outcome.ranges)
    busy = outcome.read_seconds or outcome.seconds
    return {
        "pipeline": outcome.pipeline,
        "status": outcome.status,
        "batch": outcome.batch,
        "messages": messages,
        "rows": sum(r.rows for r in outcome.ranges),
        "quarantined": sum(r.quarantined for r in outcome.ranges),
        "gaps": sum(r.gaps for r in outcome.ranges),
        "skipped": sum(r.skipped for r in outcome.ranges),
        "late_rows": sum(r.late_rows for r in outcome.ranges),
        "max_lateness_ms": max((r.max_lateness_ms for r in outcome.ranges), default=0),
        "bytes": total_bytes,
        "seconds": round(outcome.seconds, 3),
        "spark_start_seconds": round(outcome.spark_seconds, 3),
        "read_seconds": round(outcome.read_seconds, 3),
        "stages": {"driver": outcome.stages.as_dict(), "tasks": outcome.task_stages.as_dict()},
        "mb_per_s": round(total_bytes / 1e6 / busy, 2) if busy and total_bytes else 0.0,
        "msgs_per_s": round(messages / busy) if busy and messages else 0,
        "files": outcome.files,
        "new_partitions": [f"{t}:{p}" for t, p in outcome.new_partitions],
        "lag_after": {f"{t}:{p}": lag for (t, p), lag in sorted(outcome.lag.items())},
        "ranges": [
            {
                "topic": r.topic,
                "partition": r.partition,
                "start": r.start,
                "end": r.end,
                "messages": r.messages,
                "rows": r.rows,
                "quarantined": r.quarantined,
                "gaps": r.gaps,
                "skipped": r.skipped,
                "bytes": r.bytes,
                "late_rows": r.late_rows,
                "max_lateness_ms": r.max_lateness_ms,
                "min_event_time": _iso(r.min_event_us),
                "max_event_time": _iso(r.max_event_us),
            }
            for r in outcome.ranges
        ],
        "late_after_completion": outcome.late_after_completion,
        "warnings": outcome.warnings,
        # Old clients make brokers down-convert every fetch; say which one read the data.
        "kafka_client": client_version(),
        "registered": outcome.registered,
        "register_error": outcome.register_error,
    }


def render_summary(outcome: RunOutcome) -> str:
    """A human-readable summary of a run."""
    s = summary_dict(outcome)
    if outcome.status == "idle":
        lag = sum(outcome.lag.values())
        states = outcome.seen.states if outcome.seen is not None else None
        held = sum(s.held_back for s in states or [])
        # Lag a run cannot read is not lag it left: say what holds it (the warning says more).
        why = f", {held:,} of them held back by an open transaction" if held else ""
        lines = [
            f"pipeline {outcome.pipeline}: nothing new to read (lag {lag:,} messages{why}); "
            "no batch run"
        ]
        lines.extend(f"warning: {w}" for w in s["warnings"])
        if s["registered"]:
            lines.append(s["registered"])
        return "\n".join(lines)
    head = (
        f"pipeline {outcome.pipeline}: batch {outcome.batch} {outcome.status}: "
        f"{s['messages']:,} messages, {s['rows']:,} rows, {s['quarantined']:,} quarantined, "
        f"{s['gaps']:,} gaps, "
        + (f"{s['skipped']:,} tombstones skipped, " if s["skipped"] else "")
        + f"{s['bytes'] / 1e6:,.1f} MB in {outcome.seconds:.1f}s "
        f"(Spark start {outcome.spark_seconds:.1f}s; {s['mb_per_s']} MB/s, "
        f"{s['msgs_per_s']:,} msgs/s while reading)"
    )
    cols = [
        "topic",
        "part",
        "start",
        "end",
        "rows",
        "quar",
        "gaps",
        "late",
        "max late",
        "MB",
        "lag",
    ]
    rows = []
    for r in outcome.ranges:
        rows.append(
            [
                r.topic,
                str(r.partition),
                str(r.start),
                str(r.end),
                f"{r.rows:,}",
                f"{r.quarantined:,}",
                f"{r.gaps:,}",
                f"{r.late_rows:,}",
                human_duration(r.max_lateness_ms) if r.late_rows else "-",
                f"{r.bytes / 1e6:.1f}",
                f"{outcome.lag.get((r.topic, r.partition), 0):,}",
            ]
        )
    widths = [
        max(len(c), *(len(row[i]) for row in rows)) if rows else len(c) for i, c in enumerate(cols)
    ]
    table = ["  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True))]
    table += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    files = ", ".join(f"{n} {k}" for k, n in outcome.files.items())
    out = [head, *table, f"read with {s['kafka_client']}"]
    if files:
        out.append(f"files committed: {files}")
    if outcome.new_partitions:
        starts = {(r.topic, r.partition): r.start for r in outcome.ranges}
        out.append(
            "new partitions, read from: "
            + ", ".join(
                f"{t}:{p} offset {starts.get((t, p), '?')}" for t, p in outcome.new_partitions
            )
        )
    out.extend(f"warning: {w}" for w in s["warnings"])
    if s["registered"]:
        out.append(s["registered"])
    return "\n".join(out)
