"""The data table's partition values: which partition a row lands in, and back.

Pure functions, Arrow in and out. `dt` and `hr` are the event's local date and hour in
`partitioning.timezone`; `partition_span` turns them back into the instants they
hold, so that everything that asks when a partition ends (compaction's settle time)
agrees with where the decoder put each row. A field partition's value is the field's
own when it is listed, and the `other` value for anything else.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.compute as pc

from strata.config import FieldPartitionConfig

US_PER_HOUR = 3_600_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LOCAL_EPOCH = datetime(1970, 1, 1)
# A zone's offset is looked up within these instants: Python cannot show a local time
# outside years 1-9999, and a zone's rules at the ends of that range are those of
# years 2 and 9998 (its first offset, and its last rule).
_LOOKUP_FIRST = datetime(2, 1, 1, tzinfo=UTC)
_LOOKUP_LAST = datetime(9998, 12, 31, tzinfo=UTC)
# Local hours, counted from 1970-01-01T00 local, that a `dt` can name (years 1-9999):
# an event within a few hours of those ends whose local date falls outside them lands
# in the first or last hour rather than in a date no reader can parse.
_FIRST_HOUR = (datetime(1, 1, 1) - _LOCAL_EPOCH) // timedelta(hours=1)
_LAST_HOUR = (datetime(9999, 12, 31, 23) - _LOCAL_EPOCH) // timedelta(hours=1)
_DT = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_HR = re.compile(r"^\d{2}$")


def floor_divide(values: pa.Array, by: int) -> pa.Array:
    """Integer division rounding down; Arrow's rounds toward zero, wrong before 1970."""
    quotient = pc.divide(values, by)
    if (pc.min(values).as_py() or 0) >= 0:
        return quotient
    short = pc.and_(pc.less(values, 0), pc.not_equal(pc.multiply(quotient, by), values))
    return pc.if_else(short, pc.subtract(quotient, 1), quotient)


def event_partitions(event_us: pa.Array, zone: str = "UTC") -> tuple[pa.Array, pa.Array]:
    """`dt` (YYYY-MM-DD) and `hr` (HH) strings of epoch-microsecond event times in a zone.

    The zone's offset is looked up once per distinct UTC hour (twice, and a search for
    the switch, in the rare hour where it changes), and each distinct local hour is
    formatted once; the columns are built by index, far cheaper than per row. When
    clocks go back, both passes through the repeated hour share its `hr`; the hour
    skipped when they go forward never occurs.

    Args:
        event_us: Event times, epoch microseconds, none null.
        zone: IANA zone of the partition values.

    Returns:
        The `dt` and `hr` columns.
    """
    hours = floor_divide(event_us, US_PER_HOUR)
    if zone != "UTC" and len(event_us):
        hours = _local_hours(event_us, hours, ZoneInfo(zone))
    distinct = pc.unique(hours)
    moments = [_LOCAL_EPOCH + timedelta(hours=h) for h in distinct.to_pylist()]
    where = pc.index_in(hours, value_set=distinct)
    # Formatted by hand: strftime leaves years before 1000 unpadded on some platforms.
    dt = pa.array([f"{m.year:04d}-{m.month:02d}-{m.day:02d}" for m in moments], pa.string())
    hr = pa.array([f"{m.hour:02d}" for m in moments], pa.string())
    return pc.take(dt, where), pc.take(hr, where)


def _local_hours(event_us: pa.Array, utc_hours: pa.Array, zone: ZoneInfo) -> pa.Array:
    """Each event's local hour in `zone`, counted from 1970-01-01T00 local."""
    distinct = pc.unique(utc_hours)
    first, last, switch = [], [], []
    for hour in distinct.to_pylist():
        start = hour * US_PER_HOUR
        before, after = _offset_us(start, zone), _offset_us(start + US_PER_HOUR - 1, zone)
        first.append(before)
        last.append(after)
        switch.append(start + US_PER_HOUR if before == after else _switch_us(start, before, zone))
    where = pc.index_in(utc_hours, value_set=distinct)
    early = pc.less(event_us, pc.take(pa.array(switch, pa.int64()), where))
    offset = pc.if_else(
        early,
        pc.take(pa.array(first, pa.int64()), where),
        pc.take(pa.array(last, pa.int64()), where),
    )
    local = floor_divide(pc.add(event_us, offset), US_PER_HOUR)
    return pc.max_element_wise(pc.min_element_wise(local, _LAST_HOUR), _FIRST_HOUR)


def _offset_us(instant_us: int, zone: ZoneInfo) -> int:
    """The zone's UTC offset at an instant, in microseconds."""
    moment = min(max(_EPOCH + timedelta(microseconds=instant_us), _LOOKUP_FIRST), _LOOKUP_LAST)
    offset = moment.astimezone(zone).utcoffset() or timedelta(0)
    return offset // timedelta(microseconds=1)


def _switch_us(start: int, before: int, zone: ZoneInfo) -> int:
    """The first instant of the UTC hour from `start` whose offset is no longer `before`."""
    low, high = start, start + US_PER_HOUR - 1
    while high - low > 1:
        middle = (low + high) // 2
        if _offset_us(middle, zone) == before:
            low = middle
        else:
            high = middle
    return high


def partition_span(dt: str, hr: str | None, zone: str) -> tuple[datetime, datetime] | None:
    """The instants `[start, end)` whose events land in partition `dt` (and `hr`) of a zone.

    The inverse of `event_partitions`: an instant lands in the partition exactly when it
    lies in the span. A local time that occurs twice is taken at its first occurrence
    and one that never occurs at the offset before the switch, so the hour that repeats
    when clocks go back spans two hours of instants, and the hour skipped when they go
    forward spans none.

    Args:
        dt: The local date, `YYYY-MM-DD`.
        hr: The local hour, `HH`; None for a whole day (`partitioning: dt`).
        zone: IANA zone of the partition values.

    Returns:
        The span's start and end, in UTC; None if the values are not a date and hour.
    """
    if not _DT.match(dt) or (hr is not None and not _HR.match(hr)):
        return None
    try:
        # Fields by position (the pattern matched): `strptime` cost more than the rest
        # here, once for each of the thousands of partitions a completeness looks at.
        start = datetime(int(dt[:4]), int(dt[5:7]), int(dt[8:10]))  # noqa: DTZ001 - local, zoned below
        length = timedelta(days=1)
        if hr is not None:
            if int(hr) > 23:
                return None
            start += timedelta(hours=int(hr))
            length = timedelta(hours=1)
        tz = ZoneInfo(zone)
        return (
            start.replace(tzinfo=tz).astimezone(UTC),
            (start + length).replace(tzinfo=tz).astimezone(UTC),
        )
    except (ValueError, OverflowError):
        return None


def field_partitions(values: pa.Array | pa.ChunkedArray, spec: FieldPartitionConfig) -> pa.Array:
    """A field partition's column: each value if `spec` lists it, else `spec.other`.

    Integers are compared as their decimal text; null and absent values take `other`.

    Args:
        values: The field's column (string, or integers).
        spec: The field partition's settings.

    Returns:
        The partition column, never null.
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    text = values if pa.types.is_string(values.type) else values.cast(pa.string())
    listed = pc.fill_null(pc.is_in(text, value_set=pa.array(spec.values, pa.string())), False)
    return pc.if_else(listed, text, pa.scalar(spec.other, pa.string()))
