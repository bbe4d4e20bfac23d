"""`strata status`: committed ranges, batch history and lag, from the ledger."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from strata.config import PipelineConfig
from strata.kafka import KafkaUnavailable, partition_states
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
    out: dict[str, Any] = {"pipeline": cfg.name, "last_batch": state.last_batch}
    partitions = []
    lag: dict[tuple[str, int], dict[str, int]] = {}
    try:
        for s in partition_states(cfg, state.committed):
            committed = state.committed.get((s.topic, s.partition))
            lag[(s.topic, s.partition)] = {
                "low": s.low,
                "high": s.high,
                "lag": max(s.high - (committed if committed is not None else s.low), 0),
            }
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
    return out


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
    lines.append(f"{'topic':>16} {'part':>4} {'committed':>12} {'high':>12} {'lag':>10}")
    for p in status["partitions"]:
        committed = "-" if p["committed"] is None else str(p["committed"])
        lines.append(
            f"{p['topic']:>16} {p['partition']:>4} {committed:>12} "
            f"{p.get('high', '?')!s:>12} {p.get('lag', '?')!s:>10}"
        )
    if status["total_lag"] is not None:
        lines.append(f"total lag: {status['total_lag']:,} messages")
    if status["batches"]:
        lines.append("recent batches:")
        for b in status["batches"]:
            lines.append(
                f"  batch {b['batch']:>5} {b['kind']:<8} {b['messages']:>10,} msgs "
                f"{b['rows']:>10,} rows {b['quarantined']:>6,} quarantined "
                f"{b['gaps']:>6,} gaps  {b['committed_at']}"
            )
    return "\n".join(lines)
