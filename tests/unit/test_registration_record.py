"""The record a registration leaves in the data table's parameters (`Since`)."""

from __future__ import annotations

from datetime import UTC, datetime

from strata.catalog._partitions import REGISTERED_KEY, Since, moved_since
from strata.store.locations import Markers


def _markers() -> Markers:
    at = datetime(2026, 1, 1, 12, tzinfo=UTC)
    return Markers(
        stamps={"dt=2026-01-01/hr=10": ["a"], "dt=2026-01-01/hr=11": ["b"], "x": ["c"]},
        written={
            ("dt=2026-01-01/hr=10", "a"): at.replace(hour=10),
            ("dt=2026-01-01/hr=11", "b"): at,
            ("x", "c"): None,
        },
    )


def test_a_record_reads_back_as_written_and_only_under_the_same_settings():
    record = Since.after(7, _markers(), ["dt=2026-01-01/hr=10"], "s1")
    assert record.batch == 7 and record.held == ("dt=2026-01-01/hr=10",)
    # Markers written up to five minutes before the newest listed are looked at again.
    assert record.moved_ms == int(datetime(2026, 1, 1, 11, 55, tzinfo=UTC).timestamp() * 1000)
    assert Since.read({REGISTERED_KEY: record.text()}, "s1") == record
    assert Since.read({REGISTERED_KEY: record.text()}, "s2") is None
    for bad in ({}, None, {REGISTERED_KEY: "{"}, {REGISTERED_KEY: '{"batch": "x"}'}):
        assert Since.read(bad, "s1") is None


def test_too_many_held_partitions_are_not_kept_and_no_marker_means_no_instant():
    held = [f"dt=2026-01-{d:02}/hr={h:02}" for d in range(1, 29) for h in range(24)]
    record = Since.after(3, Markers(), held, "s")
    assert record.held is None and record.moved_ms is None
    assert len(record.text()) < 4_000


def test_only_registered_partitions_a_marker_moved_since_are_looked_at():
    markers = _markers()
    registered = {"dt=2026-01-01/hr=10", "dt=2026-01-01/hr=11", "x"}
    since = int(datetime(2026, 1, 1, 11, tzinfo=UTC).timestamp() * 1000)
    # hr=10's marker is older; `x`'s store gave no write time, so it is always looked at.
    assert moved_since(markers, registered, since) == ["dt=2026-01-01/hr=11", "x"]
    assert moved_since(markers, registered, None) == sorted(registered)
    assert moved_since(markers, {"x"}, since) == ["x"]
