"""The completeness rule over literal ledger rows: no broker, no Spark, no clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from strata.catalog.completeness import (
    MARKER,
    Completeness,
    partition_states,
    watermarks,
    write_markers,
)
from strata.store.ledger import LEDGER_SCHEMA

HOUR = timedelta(hours=1)
T0 = datetime(2025, 11, 22, 10, tzinfo=UTC)


def row(batch, partition, newest, *, end=100, high=100, messages=10, kind="ingest"):
    """A ledger row: `newest` is the newest event time read, in hours after T0."""
    return {
        "pipeline": "p",
        "batch": batch,
        "kind": kind,
        "topic": "t",
        "partition": partition,
        "start_offset": 0,
        "end_offset": end,
        "messages": messages,
        "rows": messages,
        "quarantined": 0,
        "gaps": 0,
        "bytes": 0,
        "late_rows": 0,
        "max_lateness_ms": 0,
        "min_event_time": None if newest is None else T0,
        "max_event_time": None if newest is None else T0 + newest * HOUR,
        "high_watermark": high,
        "committed_at": datetime(2026, 1, 1, tzinfo=UTC) + batch * timedelta(minutes=5),
        "note": None,
    }


def ledger(*rows):
    return pa.Table.from_pylist(list(rows), schema=LEDGER_SCHEMA)


def states(rows, partitions, lateness=HOUR, zone="UTC", held=None):
    return {
        s.partition: s
        for s in partition_states(partitions, watermarks(ledger(*rows)), lateness, zone, held)
    }


def test_the_watermark_is_the_slowest_partition_and_an_hour_completes_after_the_lateness():
    marks = watermarks(ledger(row(1, 0, 0.5), row(1, 1, 2.5)))
    assert [(m.batch, m.at, m.holding) for m in marks] == [(1, T0 + 0.5 * HOUR, "t:0")]

    hour = "dt=2025-11-22/hr=10"
    # Partition 0 has read to 11:59: past the hour's end (11:00) but not its lateness.
    rows = [row(1, 0, 0.5), row(1, 1, 2.5), row(2, 0, 1.99, end=200, high=200)]
    assert not states(rows, [hour])[hour].complete
    rows.append(row(3, 0, 2.0, end=300, high=300))
    done = states(rows, [hour])[hour]
    assert done.complete and done.completed_batch == 3
    assert done.watermark == "2025-11-22T12:00:00Z"
    assert done.completed_at == "2026-01-01T00:15:00Z"
    assert done.parameters()["strata.complete"] == "true"


def test_an_idle_partition_read_to_its_end_holds_nothing_back_but_a_capped_one_does():
    hour = "dt=2025-11-22/hr=10"
    # Partition 1 was read to its end in batch 1 with an event at 10:10, then nothing
    # came: from batch 2 on it no longer holds the watermark at 10:10.
    rows = [row(1, 0, 0.5), row(1, 1, 0.17), row(2, 0, 3.0, end=200, high=200)]
    marks = watermarks(ledger(*rows))
    assert [(m.at, m.holding) for m in marks] == [
        (T0 + 0.17 * HOUR, "t:1"),
        (T0 + 3 * HOUR, "t:0"),
    ]
    assert states(rows, [hour])[hour].complete

    # Read only to offset 50 of 100 (capped): it has more to give, so it still holds.
    capped = [row(1, 0, 0.5), row(1, 1, 0.17, end=50), row(2, 0, 3.0, end=200, high=200)]
    assert watermarks(ledger(*capped))[-1].holding == "t:1"
    assert not states(capped, [hour])[hour].complete


def test_the_watermark_never_goes_back_and_only_ingest_rows_count():
    rows = [
        row(1, 0, 3.0),
        row(1, 1, 3.0),
        # A partition read for the first time, with old events, holds the watermark at
        # them from now on, but what was complete stays complete.
        row(2, 2, 0.2, end=40, high=90),
        # Re-reads of committed offsets and losses bring no new event time.
        row(3, 0, 9.0, kind="backfill"),
        row(3, 1, None, kind="loss", messages=0),
    ]
    marks = watermarks(ledger(*rows))
    assert [m.at for m in marks] == [T0 + 3 * HOUR, T0 + 3 * HOUR]
    assert [m.holding for m in marks] == ["t:0", "t:2"]
    assert states(rows, ["dt=2025-11-22/hr=11"])["dt=2025-11-22/hr=11"].completed_batch == 1


def test_partitions_are_local_to_the_zone_and_a_day_partition_completes_after_its_last_hour():
    # Asia/Kolkata is UTC+05:30: local 15:00-16:00 on 2025-11-22 is 09:30-10:30 UTC, so
    # it is complete once every partition read 11:30 UTC.
    rows = [row(1, 0, 1.5), row(1, 1, 5.0)]
    local = states(rows, ["dt=2025-11-22/hr=15", "dt=2025-11-22/hr=16"], zone="Asia/Kolkata")
    assert local["dt=2025-11-22/hr=15"].complete
    assert local["dt=2025-11-22/hr=15"].end == "2025-11-22T10:30:00Z"
    assert not local["dt=2025-11-22/hr=16"].complete

    # `partitioning: dt`: the day ends at midnight local time, 18:30 UTC in Kolkata.
    day = "dt=2025-11-22"
    assert not states(rows + [row(2, 0, 9.4), row(2, 1, 9.4)], [day], zone="Asia/Kolkata")[
        day
    ].complete
    kolkata = states(rows + [row(2, 0, 9.5), row(2, 1, 9.5)], [day], zone="Asia/Kolkata")[day]
    assert kolkata.complete and kolkata.end == "2025-11-22T18:30:00Z"
    assert not states(rows + [row(2, 0, 9.5), row(2, 1, 9.5)], [day])[day].complete


def test_a_partition_a_failed_gate_marked_is_not_complete_while_the_mark_stands():
    rows = [row(1, 0, 5.0), row(1, 1, 5.0)]
    field = "dt=2025-11-22/hr=10/p_country=DE"
    held = states(rows, ["dt=2025-11-22/hr=10", field], held={field: [1]})
    assert held["dt=2025-11-22/hr=10"].complete
    assert not held[field].complete and held[field].held_by == [1]
    # The span passed its lateness all the same: the batch is known, no parameter is set.
    assert held[field].completed_batch == 1 and held[field].parameters() == {}


def test_no_event_time_no_watermark_and_a_stray_partition_is_left_out():
    rows = [row(1, 0, None, messages=3)]
    assert [m.at for m in watermarks(ledger(*rows))] == [None]
    found = states(rows, ["dt=2025-11-22/hr=10", "dt=bad/hr=xx"])
    assert list(found) == ["dt=2025-11-22/hr=10"] and not found["dt=2025-11-22/hr=10"].complete


def test_markers_go_to_complete_partitions_only_and_leave_when_a_gate_holds_one(tmp_path):
    from strata.config import CompletenessConfig
    from tests.conftest import clicks_config

    cfg = clicks_config(
        tmp_path, table_format="parquet", completeness=CompletenessConfig(marker=True)
    )
    table = tmp_path / "clicks"
    ref, settings = cfg.places().table("table"), cfg.completeness
    rows = [row(1, 0, 2.5), row(1, 1, 2.5)]
    parts = ["dt=2025-11-22/hr=10", "dt=2025-11-22/hr=11"]
    for part in parts:
        (table / part).mkdir(parents=True)
        pq.write_table(pa.table({"x": [1, 2]}), table / part / "part-b0000000001-t0.parquet")

    def found(held=None):
        now = states(rows, parts, held=held).values()
        return Completeness("clicks", "", "1h", 1, None, None, list(now))

    assert write_markers(ref, settings, found()) == ([parts[0]], [])
    assert '"strata.completed_batch": "1"' in (table / parts[0] / MARKER).read_text()
    assert not (table / parts[1] / MARKER).exists()
    assert write_markers(ref, settings, found()) == ([], [])
    # Arrow's discovery, as Spark's, Hive's and Trino's, skips a name beginning with `_`.
    assert ds.dataset(table, format="parquet", partitioning="hive").to_table().num_rows == 4

    assert write_markers(ref, settings, found(held={parts[0]: [2]})) == ([], [parts[0]])
    assert not (table / parts[0] / MARKER).exists()


def test_a_range_of_markers_only_that_reaches_the_end_drains_its_partition():
    # Partition 0 stopped one offset short of the end; the next range held only a
    # transaction marker (no message) and reached the end: the partition is idle, and
    # partition 1 alone moves the watermark on.
    rows = [
        row(1, 0, 0.5, end=1000, high=1001),
        row(1, 1, 0.5),
        row(2, 0, None, end=1001, high=1001, messages=0),
        row(2, 1, 2.5, end=200, high=200),
        row(3, 1, 4.5, end=300, high=300),
    ]
    marks = watermarks(ledger(*rows))
    assert [m.holding for m in marks] == ["t:0", "t:1", "t:1"]
    assert [m.at for m in marks] == [T0 + 0.5 * HOUR, T0 + 2.5 * HOUR, T0 + 4.5 * HOUR]


def test_a_batchs_completeness_is_had_from_its_ledger_commit_and_its_own_files(
    tmp_path, monkeypatch
):
    """What a run asks after its batch (late rows, partitions it completed) is what the
    whole ledger says, and is had without reading the ledger's rows."""
    from strata.catalog import completeness as module
    from strata.store.delta import commit_files, ensure_table
    from strata.store.ledger import commit_ledger, read_ledger, unread_row
    from strata.store.parquet import write_file
    from tests.conftest import clicks_config

    cfg = clicks_config(tmp_path)
    places = cfg.places()
    ref = places.table("table")
    schema = pa.schema([("_batch", pa.int64()), ("dt", pa.string()), ("hr", pa.string())])
    table = ensure_table(ref.uri, schema, ["dt", "hr"], ref.options, ref.name)
    fs, root = ref.filesystem()

    def batch(number, hours, newest):
        """Batch `number` lands `hours` ({hour: rows}); its newest event is `newest`h."""
        files = []
        for hour, count in hours.items():
            values = {"dt": "2025-11-22", "hr": f"{10 + hour:02d}"}
            rows = pa.table({"_batch": [number] * count})
            name = f"dt=2025-11-22/hr={10 + hour:02d}/part-b{number:010d}-h{hour}.parquet"
            files.append(write_file(fs, root, name, rows, values))
        commit_files(table, schema, ["dt", "hr"], files, "clicks", number, {})
        table.update_incremental()
        ledger = unread_row("ingest", "clicks", 0, number - 1, number, 0, None)
        ledger.update(messages=1, rows=1, high_watermark=number + 5)
        ledger["max_event_time"] = T0 + newest * HOUR
        commit_ledger(places, number, [ledger])

    batch(1, {0: 3, 1: 2, 2: 1}, 2.5)
    # Hour 10 was complete after batch 1 (due 12:00, watermark 12:30): these rows are
    # late. Hours 11 and 12 are due at 13:00 and 14:00: batch 2 (14:30) completes them.
    # Hour 13 stays open.
    batch(2, {0: 2, 3: 4}, 4.5)

    def asked(**how):
        return module.completeness(
            places, cfg.completeness, cfg.partitioning, "off", "", 2, totals=False, **how
        )

    full = asked(quality=False, ledger=read_ledger(places))
    monkeypatch.setattr(module, "read_ledger", lambda *a, **k: pytest.fail("the rows were read"))
    fast = asked(quality=False)
    assert fast.late == full.late == {"dt=2025-11-22/hr=10": 2}
    done = ["dt=2025-11-22/hr=11", "dt=2025-11-22/hr=12"]
    assert fast.completed == full.completed == done
    assert (fast.batch, fast.watermark, fast.holding) == (full.batch, full.watermark, full.holding)
    everything = {s.partition: s for s in full.partitions}
    assert fast.partitions == [everything[s.partition] for s in fast.partitions]
    # Those the batch changed: completed, or written and open; not those complete before.
    assert [s.partition for s in fast.partitions] == [*done, "dt=2025-11-22/hr=13"]
