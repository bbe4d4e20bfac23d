"""Event times read as epoch microseconds, and checked against the message's own timestamp.

An event time that is missing, unreadable, before `event_time.min_valid`, too far
ahead of its Kafka timestamp or (with `event_time.max_lateness`) too far behind it
sends its message to quarantine. The comparison is with the message's timestamp, not
the clock, so a re-run of a batch decides as the first run did.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.compute as pc

from strata.batch._rules import EPOCH, MAX_US, MIN_US, DecodeRules, quote
from strata.durations import human_duration
from strata.schema.partitions import floor_divide

_US_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": 0}
# Kafka timestamps are clamped to this many epoch milliseconds (about year 33,000)
# before any arithmetic, so that a producer-set timestamp cannot overflow int64; an
# event time is within years 1-9999, so no comparison changes.
_KAFKA_CLAMP_MS = 10**15


def event_time_us(col: pa.ChunkedArray, rules: DecodeRules) -> tuple[pa.Array, pa.Array]:
    """Event times as epoch microseconds (int64), and which ones lie beyond years 1-9999.

    Returns:
        The times, null where absent, unreadable or out of range; and a mask of the
        values that were read but lie outside 0001-01-01 to 9999-12-31T23:59:59Z.
    """
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_timestamp(col.type):
        if col.type.tz is None:
            # A local timestamp is a wall-clock time, in the zone of ISO strings without one.
            col = pc.assume_timezone(
                col, rules.timezone, ambiguous="earliest", nonexistent="earliest"
            )
        us = col.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    elif rules.event_unit == "iso8601":
        zone = ZoneInfo(rules.timezone)
        us = pa.array([_parse_iso_us(text, zone) for text in col.to_pylist()], pa.int64())
    elif pa.types.is_integer(col.type):
        whole = col.cast(pa.int64())
        per = _US_PER_UNIT[rules.event_unit]
        if per == 0:
            us = floor_divide(whole, 1000)
        else:
            # Out-of-range values wrap here, and are told apart by the bounds below.
            inside = pc.and_(
                pc.greater_equal(whole, -(-MIN_US // per)), pc.less_equal(whole, MAX_US // per)
            )
            us = pc.if_else(inside, pc.multiply(whole, per), pa.scalar(MAX_US + 1, pa.int64()))
    else:
        as_float = pc.cast(col, pa.float64())
        per = _US_PER_UNIT[rules.event_unit]
        scaled = pc.divide(as_float, 1000.0) if per == 0 else pc.multiply(as_float, float(per))
        finite = pc.is_finite(scaled)
        inside = pc.and_(
            finite,
            pc.and_(pc.greater_equal(scaled, float(MIN_US)), pc.less_equal(scaled, float(MAX_US))),
        )
        us = pc.if_else(
            inside,
            pc.cast(pc.floor(scaled), pa.int64()),
            pc.if_else(finite, pa.scalar(MAX_US + 1, pa.int64()), pa.scalar(None, pa.int64())),
        )
    beyond = pc.fill_null(pc.or_(pc.less(us, MIN_US), pc.greater(us, MAX_US)), False)
    return pc.if_else(beyond, pa.scalar(None, pa.int64()), us), beyond


def _parse_iso_us(text: str | None, zone: ZoneInfo) -> int | None:
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=zone)
        return (moment - EPOCH) // timedelta(microseconds=1)
    except (ValueError, OverflowError):
        return None


def check_event_time(
    event_us: pa.Array,
    beyond: pa.Array,
    event_col: pa.ChunkedArray,
    coords: pa.Table,
    idx: list[int],
    rules: DecodeRules,
    reasons: list[str | None],
) -> list[bool]:
    """Keep the rows whose event time is present and believable; quarantine the rest.

    The bounds on how far an event may lie ahead of, or trail, its Kafka timestamp
    are checked against the message's own timestamp, so a re-run decides the same;
    a message without a Kafka timestamp has nothing to be compared with, and skips
    both.
    """
    kafka_ms = coords.column("_kafka_ts").combine_chunks().cast(pa.int64())
    kafka_ms = pc.min_element_wise(
        pc.max_element_wise(kafka_ms, -_KAFKA_CLAMP_MS, skip_nulls=False),
        _KAFKA_CLAMP_MS,
        skip_nulls=False,
    )
    kafka_us = pc.multiply(kafka_ms, 1000)
    missing = pc.is_null(event_us)
    too_early = pc.fill_null(pc.less(event_us, rules.min_valid_us), False)
    limit = pc.add(kafka_us, rules.max_future_skew_ms * 1000)
    too_far = pc.fill_null(pc.greater(event_us, limit), False)
    bad = pc.or_(pc.or_(missing, too_early), too_far)
    too_late = pa.repeat(pa.scalar(False), len(event_us))
    if rules.max_lateness_ms is not None:
        lateness = pc.subtract(kafka_us, event_us)
        too_late = pc.fill_null(pc.greater(lateness, rules.max_lateness_ms * 1000), False)
        bad = pc.or_(bad, too_late)
    keep = [True] * len(idx)
    if not pc.any(bad).as_py():
        return keep
    events = event_us.to_pylist()
    kafka = kafka_us.to_pylist()
    beyond_l, early_l, far_l = beyond.to_pylist(), too_early.to_pylist(), too_far.to_pylist()
    field = rules.event_field
    for pos in pc.indices_nonzero(bad).to_pylist():
        keep[pos] = False
        if beyond_l[pos]:
            unit = "" if rules.event_unit == "iso8601" else f" ({rules.event_unit})"
            reasons[idx[pos]] = (
                f"event time `{field}` {quote(str(event_col[pos].as_py()))}{unit} lies outside "
                "0001-01-01 to 9999-12-31T23:59:59Z"
            )
        elif events[pos] is None:
            reasons[idx[pos]] = f"missing or unreadable event time `{field}`"
        elif early_l[pos]:
            reasons[idx[pos]] = (
                f"event time {_iso(events[pos])} is before "
                f"{_iso(rules.min_valid_us)} (epoch zero or an unset clock)"
            )
        elif far_l[pos]:
            ahead = (events[pos] - kafka[pos]) // 1000
            reasons[idx[pos]] = (
                f"event time {_iso(events[pos])} is {human_duration(ahead)} ahead of its Kafka "
                f"timestamp {_iso(kafka[pos])} "
                f"(allowed skew {human_duration(rules.max_future_skew_ms)})"
            )
        else:
            late = (kafka[pos] - events[pos]) // 1000
            reasons[idx[pos]] = (
                f"event time {_iso(events[pos])} is {human_duration(late)} before its Kafka "
                f"timestamp {_iso(kafka[pos])}, beyond event_time.max_lateness "
                f"{rules.max_lateness}"
            )
    return keep


def _iso(us: int) -> str:
    try:
        moment = EPOCH + timedelta(microseconds=us)
    except OverflowError:
        return f"{us // 1000} ms after 1970-01-01"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
