"""The rules behind two of Kafka's traps, on literal values: a transaction left open (what
it holds back, and how the status and metrics say so) and tombstones (`on_tombstone`),
down to an old ledger gaining the count of skipped ones."""

from __future__ import annotations

import json
import time

import pyarrow as pa
import pytest
from confluent_kafka import OFFSET_END, TopicPartition
from deltalake import DeltaTable

from strata.batch.decode import DecodeRules, decode_chunk
from strata.batch.kafka import _log_ends
from strata.batch.outcome import RunOutcome, Seen
from strata.batch.plan import BatchPlan, PartitionState
from strata.batch.reconcile import batch_results, reconcile_files, span_problems
from strata.batch.task import RangeResult, SplitResult
from strata.config import EventTimeConfig, PipelineConfig
from strata.errors import ReconcileError, TombstoneRefused
from strata.operations.metrics import status_metrics
from strata.operations.report import render_summary, summary_dict
from strata.operations.status import _held_back
from strata.schema.avro import RAW_SCHEMA
from strata.store import ledger as ledger_module
from strata.store.ledger import (
    LEDGER_SCHEMA,
    LedgerState,
    commit_ledger,
    ledger_state,
    read_ledger,
    unread_row,
)
from strata.store.ranges import OffsetRange
from tests.conftest import ROOT, START_MS

# Transactions


def test_a_partition_held_back_plans_to_its_last_stable_offset_and_lags_to_its_high_watermark():
    held = PartitionState("t", 0, 0, 184, 100, log_end=335)
    assert (held.high, held.high_watermark, held.held_back) == (184, 335, 151)
    # A broker that answers both offsets alike holds nothing back.
    assert PartitionState("t", 1, 0, 50, 50).held_back == 0


def test_a_transaction_open_for_minutes_is_warned_of_with_kafkas_way_out():
    began = int(time.time() * 1000) - 10 * 60_000
    warnings: list[str] = []
    shown = _held_back(PartitionState("t", 0, 0, 184, 100, 0, 335, began), warnings)
    assert shown["held_back"] == 151 and shown["unstable_offset"] == 184
    assert 600 <= shown["unstable_age_s"] < 660
    [warning] = warnings
    assert warning.startswith("partition 0 of `t`: 151 messages are held back by a transaction")
    assert "find-hanging --topic t --partition 0" in warning
    assert "abort --topic t --partition 0 --start-offset 184" in warning


def test_a_transaction_open_for_moments_is_counted_but_not_warned_of():
    # A transactional producer has a transaction open most of the time.
    warnings: list[str] = []
    now = int(time.time() * 1000)
    shown = _held_back(PartitionState("t", 0, 0, 184, 100, 0, 190, now - 2000), warnings)
    assert shown["held_back"] == 6 and warnings == []


def test_held_back_messages_and_the_transactions_start_are_metrics():
    status = {
        "pipeline": "p",
        "last_batch": 1,
        "warnings": [],
        "partitions": [
            {
                "topic": "t",
                "partition": 0,
                "lag": 151,
                "held_back": 151,
                "unstable_since": "2026-01-01T00:00:00+00:00",
            },
            {"topic": "t", "partition": 1, "lag": 0},
        ],
    }
    text = status_metrics([status]).decode()
    assert 'strata_held_back_messages{partition="0",pipeline="p",topic="t"} 151.0' in text
    assert 'strata_held_back_messages{partition="1",pipeline="p",topic="t"} 0.0' in text
    assert (
        'strata_open_transaction_start_timestamp_seconds{partition="0",pipeline="p",topic="t"} '
        "1.7672256e+09" in text
    )


def test_an_idle_run_says_how_much_of_its_lag_an_open_transaction_holds_back():
    states = [PartitionState("t", 0, 0, 184, 184, log_end=335), PartitionState("t", 1, 0, 9, 9)]
    outcome = RunOutcome("p", "idle", lag={("t", 0): 151, ("t", 1): 0})
    outcome.seen = Seen(LEDGER_SCHEMA.empty_table(), LedgerState(1, {}), states)
    assert render_summary(outcome).splitlines()[0] == (
        "pipeline p: nothing new to read (lag 151 messages, 151 of them held back by an open "
        "transaction); no batch run"
    )


class Brokers:
    """A `read_uncommitted` consumer's `offsets_for_times`: each call recorded."""

    def __init__(self):
        self.calls: list[list[tuple[str, int, int]]] = []

    def offsets_for_times(self, asked, timeout):
        self.calls.append([(tp.topic, tp.partition, tp.offset) for tp in asked])
        return [TopicPartition(tp.topic, tp.partition, 1000 + tp.partition) for tp in asked]


def _pipeline(topic: str) -> PipelineConfig:
    return PipelineConfig(
        name="clicks",
        topics=[topic],
        schema_file="clicks.avsc",
        schemas_dir=str(ROOT / "schemas"),
        event_time=EventTimeConfig(field="ts"),
    )


def test_the_high_watermarks_of_every_partition_are_one_request():
    source = _pipeline("t").source()
    brokers = Brokers()
    asked = [TopicPartition("t", p) for p in range(3000)]
    ends = _log_ends(source, brokers, asked)
    assert ends == {("t", p): 1000 + p for p in range(3000)}
    assert len(brokers.calls) == 1 and len(brokers.calls[0]) == 3000
    assert {offset for _, _, offset in brokers.calls[0]} == {OFFSET_END}


# Tombstones


def _rules() -> DecodeRules:
    return DecodeRules.of_decoding(_pipeline("clicks").decoding())


def _raw(values: list[bytes | None]) -> pa.Table:
    n = len(values)
    return pa.table(
        [
            pa.array(["clicks"] * n),
            pa.array([0] * n, pa.int32()),
            pa.array(range(n), pa.int64()),
            pa.array([START_MS + 500] * n, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
            pa.array([b"k%d" % i for i in range(n)], pa.binary()),
            pa.array(values, pa.binary()),
            pa.array([None] * n, RAW_SCHEMA.field("_headers").type),
            pa.array([1] * n, pa.int64()),
            pa.nulls(n, pa.string()),
        ],
        schema=RAW_SCHEMA,
    )


CLICK = json.dumps(
    {"event_id": "e", "user_id": 1, "page": "/", "device": "mobile", "ts": START_MS}
).encode()
VALUES = [CLICK, None, CLICK, None, b"", None]


def _offsets(table: pa.Table) -> list[int]:
    return table.column("_offset").to_pylist()


def test_by_default_a_tombstone_is_quarantined_with_its_reason():
    out = decode_chunk(_raw(VALUES), _rules())
    assert _offsets(out.rows) == [0, 2]
    assert dict(zip(_offsets(out.quarantine), out.quarantine.column("reason").to_pylist())) == {
        1: "empty value (tombstone)",
        3: "empty value (tombstone)",
        4: "empty value",
        5: "empty value (tombstone)",
    }
    assert out.tombstones.num_rows == 0


@pytest.mark.parametrize("rule", ["skip", "fail"])
def test_under_another_rule_tombstones_are_handed_back_and_nothing_else_changes(rule):
    # Message 5's headers could not be read: it is quarantined for that, tombstone or not.
    out = decode_chunk(_raw(VALUES), _rules(), {5: "headers unreadable"}, rule)
    assert _offsets(out.rows) == [0, 2]
    assert dict(zip(_offsets(out.quarantine), out.quarantine.column("reason").to_pylist())) == {
        4: "empty value",
        5: "headers unreadable",
    }
    assert _offsets(out.tombstones) == [1, 3]
    assert out.tombstones.column("_partition").to_pylist() == [0, 0]


def test_every_offset_read_is_a_row_a_quarantined_row_a_skipped_tombstone_or_a_gap():
    assert span_problems(10, 8, 2, 5, 1, 2) == []
    assert span_problems(10, 8, 2, 5, 1) == ["read 8 messages but decoded 5 rows and 1 quarantined"]
    assert span_problems(10, 8, 2, 5, 1, 1) == [
        "read 8 messages but decoded 5 rows and 1 quarantined and 1 tombstones skipped"
    ]


def _plan() -> BatchPlan:
    planned = OffsetRange("clicks", 0, 0, 10)
    return BatchPlan("p", 3, [planned], [[planned]])


def _piece(start: int, end: int, **counts: int) -> SplitResult:
    return SplitResult(0, [RangeResult("clicks", 0, start, end, **counts)], {}, 0.0)


def test_skipped_tombstones_add_up_across_a_range_cut_between_tasks():
    [merged] = batch_results(
        _plan(),
        [
            _piece(0, 5, messages=5, rows=4, skipped=1, skipped_offset_sum=3),
            _piece(5, 10, messages=5, rows=3, skipped=2, skipped_offset_sum=15),
        ],
    )
    assert (merged.rows, merged.skipped, merged.skipped_offset_sum) == (7, 3, 18)


def test_a_skipped_tombstone_is_counted_among_the_offsets_the_files_must_hold():
    plan = _plan()
    # Offsets 0-9 read: 3 and 7 skipped, the rest in the data table's file.
    result = RangeResult("clicks", 0, 0, 10, messages=10, rows=8, skipped=2)
    result.offset_sum, result.skipped_offset_sum = 45, 10

    class File:
        offsets = {"clicks:0": (8, 35)}

    reconcile_files(plan, [result], {"table": [File()], "quarantine": []}, {"table", "quarantine"})
    result.skipped_offset_sum = 0
    with pytest.raises(ReconcileError, match="the data and quarantine files hold other offsets"):
        reconcile_files(
            plan, [result], {"table": [File()], "quarantine": []}, {"table", "quarantine"}
        )


def test_a_tombstone_under_fail_stops_the_batch_naming_the_first_one_and_the_setting():
    pieces = [
        _piece(0, 5, messages=5, rows=3, refused=2, first_refused=4),
        _piece(5, 10, messages=5, rows=4, refused=1, first_refused=6),
    ]
    with pytest.raises(TombstoneRefused) as stop:
        batch_results(_plan(), pieces)
    assert str(stop.value).startswith(
        "batch 3: partition 0 of `clicks`: 3 tombstones (null values), the first at offset 4; "
        "on_tombstone is `fail`, so nothing was committed. Set on_tombstone to `skip`"
    )


def test_the_summary_counts_skipped_tombstones():
    outcome = RunOutcome("p", "committed", 1)
    outcome.ranges = [RangeResult("clicks", 0, 0, 10, messages=10, rows=7, gaps=0, skipped=3)]
    assert summary_dict(outcome)["skipped"] == 3
    assert summary_dict(outcome)["ranges"][0]["skipped"] == 3
    assert ", 3 tombstones skipped, " in render_summary(outcome).splitlines()[0]


# The ledger's count of skipped tombstones, and a ledger older than it


def _places(tmp_path):
    from tests.conftest import clicks_config

    return clicks_config(tmp_path).places()


def _row(start: int, end: int, skipped: int) -> dict[str, object]:
    row = unread_row("ingest", "clicks", 0, start, end, 0, None)
    row.update(messages=end - start, rows=end - start - skipped, skipped=skipped)
    return row


def test_a_ledger_written_before_the_skipped_column_reads_and_gains_it_at_its_next_batch(
    tmp_path, monkeypatch
):
    places = _places(tmp_path)
    # The ledger as the release before wrote it: its schema without the column.
    with monkeypatch.context() as before:
        old = pa.schema([f for f in LEDGER_SCHEMA if f.name != "skipped"])
        before.setattr(ledger_module, "LEDGER_SCHEMA", old)
        before.setattr(ledger_module, "ADDED_COLUMNS", ())
        commit_ledger(places, 1, [_row(0, 10, 0)])
    assert "skipped" not in DeltaTable(places.ledger.uri).schema().to_arrow().names
    # Read as it is, before any new batch: the column is there, null.
    assert [r["skipped"] for r in read_ledger(places).to_pylist()] == [None]

    commit_ledger(places, 2, [_row(10, 20, 3)])

    # Delta's schema gained the column; every reader of the table sees both batches.
    table = DeltaTable(places.ledger.uri)
    assert table.schema().to_arrow().field("skipped").nullable
    by_delta = table.to_pyarrow_table(columns=["batch", "skipped"]).sort_by("batch").to_pylist()
    assert by_delta == [{"batch": 1, "skipped": None}, {"batch": 2, "skipped": 3}]
    assert sorted((r["batch"], r["skipped"]) for r in read_ledger(places).to_pylist()) == [
        (1, None),
        (2, 3),
    ]
    assert ledger_state(places).committed == {("clicks", 0): 20}
    # Committed again, nothing more changes (the column is added once).
    version = table.version()
    commit_ledger(places, 3, [_row(20, 25, 0)])
    assert DeltaTable(places.ledger.uri).version() == version + 1
