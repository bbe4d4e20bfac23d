"""`strata status`: committed ranges, batch history and lag, from the ledger."""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from strata.config import PipelineConfig
from strata.decode import human_duration
from strata.kafka import KafkaUnavailable, oldest_unread_ms, partition_states, retention_ms
from strata.ledger import ledger_state, read_ledger


def pipeline_status(cfg: PipelineConfig, history: int = 10) -> dict[str, Any]:
    """What is committed, the latest batches, and the lag behind the brokers.

    Args:
        cfg: The pipeline configuration.
        history: How many recent batches to list.

    Returns:
        JSON-ready status. `lag` is absent, and `broker_error` says why, when the
        brokers cannot be reached: the ledger alone still answers.
    """
    rows = read_ledger(cfg)
    state = ledger_state(cfg, rows)
    out: dict[str, Any] = {"pipeline": cfg.name, "last_batch": state.last_batch, "warnings": []}
    partitions = []
    lag: dict[tuple[str, int], dict[str, Any]] = {}
    try:
        unread: dict[tuple[str, int], int] = {}
        for s in partition_states(cfg, state.committed):
            committed = state.committed.get((s.topic, s.partition))
            position = committed if committed is not None else s.low
            lag[(s.topic, s.partition)] = {
                "low": s.low,
                "high": s.high,
                "lag": max(s.high - position, 0),
            }
            if s.high > position:
                unread[(s.topic, s.partition)] = max(position, s.low)
        _retention(cfg, unread, lag, out["warnings"])
    except KafkaUnavailable as exc:
        out["broker_error"] = str(exc)
    keys = sorted(set(state.committed) | set(lag))
    for key in keys:
        entry: dict[str, Any] = {
            "topic": key[0],
            "partition": key[1],
            "committed": state.committed.get(key),
        }
        entry.update(lag.get(key, {}))
        partitions.append(entry)
    out["partitions"] = partitions
    out["total_lag"] = sum(v["lag"] for v in lag.values()) if lag else None
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
    return out


def _retention(
    cfg: PipelineConfig,
    unread: dict[tuple[str, int], int],
    lag: dict[tuple[str, int], dict[str, Any]],
    warnings: list[str],
) -> None:
    """Age of the oldest unread message, and how long until retention deletes it.

    A message is deleted about `retention.ms` after its timestamp (the broker drops
    whole segments, so it may live a little longer, never shorter).
    """
    if not unread:
        return
    retention = retention_ms(cfg)
    oldest = oldest_unread_ms(cfg, unread)
    now_ms = int(time.time() * 1000)
    for (topic, partition), info in lag.items():
        ts = oldest.get((topic, partition))
        info["retention_ms"] = retention.get(topic)
        if ts is None:
            continue
        info["oldest_unread_age_s"] = max(now_ms - ts, 0) // 1000
        keep = retention.get(topic)
        if keep is None:
            continue
        left_s = (ts + keep - now_ms) // 1000
        info["time_to_retention_s"] = left_s
        if left_s < keep // 1000 // 4:
            warnings.append(
                f"partition {partition} of `{topic}`: unread messages are deleted by retention "
                f"in {human_duration(max(left_s, 0) * 1000)} ({info['lag']:,} messages behind); "
                "run the pipeline or raise retention.ms"
            )


def _history(rows: pa.Table, limit: int) -> list[dict[str, Any]]:
    if rows.num_rows == 0:
        return []
    grouped = rows.group_by(["batch", "kind"]).aggregate(
        [
            ("messages", "sum"),
            ("rows", "sum"),
            ("quarantined", "sum"),
            ("gaps", "sum"),
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
        lines.append(f"warning: lag unknown: {status['broker_error']}")
    for warning in status.get("warnings", []):
        lines.append(f"WARNING: {warning}")
    lines.append(
        f"{'topic':>16} {'part':>4} {'committed':>12} {'high':>12} {'lag':>10} "
        f"{'oldest unread':>14} {'to retention':>13}"
    )
    for p in status["partitions"]:
        committed = "-" if p["committed"] is None else str(p["committed"])
        age = p.get("oldest_unread_age_s")
        left = p.get("time_to_retention_s")
        lines.append(
            f"{p['topic']:>16} {p['partition']:>4} {committed:>12} "
            f"{p.get('high', '?')!s:>12} {p.get('lag', '?')!s:>10} "
            f"{'-' if age is None else human_duration(age * 1000):>14} "
            f"{'-' if left is None else human_duration(max(left, 0) * 1000):>13}"
        )
    if status["total_lag"] is not None:
        lines.append(f"total lag: {status['total_lag']:,} messages")
    for lost in status.get("losses", []):
        lines.append(
            f"LOSS: batch {lost['batch']}: offsets [{lost['start_offset']}, {lost['end_offset']}) "
            f"of partition {lost['partition']} of `{lost['topic']}` "
            f"({lost['messages_lost']:,} messages) were deleted by retention before they were "
            f"read; {lost['note']}"
        )
    if status["batches"]:
        lines.append("recent batches:")
        for b in status["batches"]:
            lines.append(
                f"  batch {b['batch']:>5} {b['kind']:<8} {b['messages']:>10,} msgs "
                f"{b['rows']:>10,} rows {b['quarantined']:>6,} quarantined "
                f"{b['gaps']:>6,} gaps  {b['committed_at']}"
            )
    return "\n".join(lines)
