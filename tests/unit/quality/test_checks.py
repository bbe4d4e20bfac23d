"""The pure part of quality: reconciliation over figures, summaries of rows, the text report."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

from strata.batch.decode import decode_chunk
from strata.quality.checks import (
    LATENESS_BUCKETS,
    LATENESS_LABELS,
    Check,
    QualityResult,
    incomplete_marks,
    lateness_bucket,
    lateness_counts,
    partition_counts,
    reason_class,
    reason_counts,
    recent_batches,
    reconcile_checks,
    render_quality,
    spread_sample,
)
from strata.store.ledger import LEDGER_SCHEMA, lag_after
from tests.unit.test_decode import T0, click, enc, raw, rules

COMMITTED = datetime(2025, 11, 22, 10, tzinfo=UTC)


def entry(batch, partition, start, end, *, kind="ingest", quarantined=0, gaps=0, **over):
    """A ledger row whose figures add up unless `over` says otherwise."""
    messages = end - start - gaps
    row = {name: 0 for name in LEDGER_SCHEMA.names}
    row.update(
        pipeline="clicks", batch=batch, kind=kind, topic="t", partition=partition,
        start_offset=start, end_offset=end, messages=messages, rows=messages - quarantined,
        quarantined=quarantined, gaps=gaps, committed_at=COMMITTED, note=None,
        min_event_time=None, max_event_time=None, high_watermark=None,
    )  # fmt: skip
    row.update(over)
    return row


def ledger(*rows):
    return pa.Table.from_pylist(list(rows), LEDGER_SCHEMA)


def counts_of(rows, column):
    """What each table would hold if it held exactly what the ledger says."""
    return {("t", r["partition"]): r[column] for r in rows if r[column]}


def consistent(rows):
    return {
        "table": counts_of(rows, "rows"),
        "quarantine": counts_of(rows, "quarantined"),
        "raw": counts_of(rows, "messages"),
    }


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


BATCH_2 = [
    entry(2, 0, 100, 160, quarantined=3),
    entry(2, 1, 40, 90, gaps=5),
]
HISTORY = [entry(1, 0, 0, 100), entry(1, 1, 0, 40)]


def test_consistent_figures_pass_every_reconciliation_check():
    checks = reconcile_checks(ledger(*HISTORY, *BATCH_2), 2, consistent(BATCH_2), [])
    assert [c.name for c in checks] == [
        "reconcile: offsets = rows + quarantined + gaps",
        "reconcile: data files present",
        "reconcile: data table rows = ledger",
        "reconcile: quarantine rows = ledger",
        "reconcile: raw copy rows = ledger",
        "reconcile: no overlapping batches",
        "reconcile: no unexplained holes",
    ]
    assert [(c.name, c.detail, c.unexpected) for c in checks if not c.success] == []


@pytest.mark.parametrize(
    "change",
    [
        {"rows": 56},  # a message neither decoded nor quarantined
        {"gaps": 1},  # offsets = rows + quarantined + gaps no longer holds
        {"messages": 59},  # messages read disagree with rows + quarantined
    ],
)
def test_a_range_that_does_not_add_up_fails_the_offsets_check_naming_its_partition(change):
    bad = {**BATCH_2[0], **change}
    checks = by_name(
        reconcile_checks(ledger(*HISTORY, bad, BATCH_2[1]), 2, consistent([bad, BATCH_2[1]]), [])
    )
    offsets = checks["reconcile: offsets = rows + quarantined + gaps"]
    assert not offsets.success and offsets.unexpected == 1
    assert offsets.detail.startswith("partition 0 of `t` [100, 160): ")
    assert "partition 1" not in offsets.detail
    # The tables hold what the (wrong) ledger says: only the offsets check fails.
    assert [c.name for c in checks.values() if not c.success] == [offsets.name]


@pytest.mark.parametrize(
    ("table", "label", "column"),
    [
        ("table", "data table", "rows"),
        ("quarantine", "quarantine", "quarantined"),
        ("raw", "raw copy", "messages"),
    ],
)
def test_a_table_holding_other_rows_than_the_ledger_fails_its_check_naming_the_partition(
    table, label, column
):
    counted = consistent(BATCH_2)
    want = BATCH_2[0][column]
    counted[table] = {**counted[table], ("t", 0): want - 2}
    checks = by_name(reconcile_checks(ledger(*HISTORY, *BATCH_2), 2, counted, []))
    check = checks[f"reconcile: {label} rows = ledger"]
    assert not check.success and check.unexpected == 1
    assert check.detail == f"partition 0 of `t`: {want - 2} rows, the ledger says {want}"
    assert [c.name for c in checks.values() if not c.success] == [check.name]


def test_a_partition_missing_from_a_table_counts_as_none_of_its_rows():
    counted = consistent(BATCH_2)
    del counted["table"][("t", 1)]
    check = by_name(reconcile_checks(ledger(*HISTORY, *BATCH_2), 2, counted, []))[
        "reconcile: data table rows = ledger"
    ]
    assert check.detail == f"partition 1 of `t`: 0 rows, the ledger says {BATCH_2[1]['rows']}"


def test_a_table_left_out_is_not_reconciled():
    counted = consistent(BATCH_2)
    del counted["raw"]  # a replay from the raw copy writes no raw copy
    names = [c.name for c in reconcile_checks(ledger(*HISTORY, *BATCH_2), 2, counted, [])]
    assert "reconcile: raw copy rows = ledger" not in names
    assert "reconcile: quarantine rows = ledger" in names


def test_only_the_checked_batch_is_reconciled_against_the_tables():
    # Batch 1's rows are not in the counts (they are another batch's), and a loss row
    # of batch 2 reads nothing: neither is expected in the tables.
    loss = entry(2, 2, 0, 7, kind="loss", gaps=7)
    checks = reconcile_checks(ledger(*HISTORY, *BATCH_2, loss), 2, consistent(BATCH_2), [])
    assert all(c.success for c in checks), [c.detail for c in checks if not c.success]


def test_lost_data_files_are_counted_and_the_first_five_named():
    missing = [f"dt=2025-11-22/part-{i}.parquet" for i in range(7)]
    check = by_name(reconcile_checks(ledger(*HISTORY, *BATCH_2), 2, consistent(BATCH_2), missing))[
        "reconcile: data files present"
    ]
    assert not check.success and check.unexpected == 7
    assert check.detail.startswith("the table lists 7 data file(s) that are gone: ")
    assert all(name in check.detail for name in missing[:5])
    assert missing[5] not in check.detail and missing[6] not in check.detail


def test_an_overlap_and_a_hole_between_batches_fail_naming_the_partition():
    overlapping = [entry(2, 0, 90, 160), BATCH_2[1]]
    checks = by_name(
        reconcile_checks(ledger(*HISTORY, *overlapping), 2, consistent(overlapping), [])
    )
    overlap = checks["reconcile: no overlapping batches"]
    assert not overlap.success and overlap.unexpected == 1
    assert overlap.detail.startswith("partition 0 of `t`: batch 2 [90, 160) overlaps batch 1")
    assert checks["reconcile: no unexplained holes"].success

    holed = [BATCH_2[0], entry(2, 1, 45, 90)]
    checks = by_name(reconcile_checks(ledger(*HISTORY, *holed), 2, consistent(holed), []))
    hole = checks["reconcile: no unexplained holes"]
    assert not hole.success and hole.unexpected == 1
    assert hole.detail.startswith("partition 1 of `t`: offsets [40, 45) between batch 1")
    assert checks["reconcile: no overlapping batches"].success


def test_a_recorded_loss_explains_a_hole():
    explained = [BATCH_2[0], entry(2, 1, 40, 45, kind="loss", gaps=5), entry(2, 1, 45, 90)]
    reads = [explained[0], explained[2]]
    checks = reconcile_checks(ledger(*HISTORY, *explained), 2, consistent(reads), [])
    assert all(c.success for c in checks), [c.detail for c in checks if not c.success]


@pytest.mark.parametrize(
    ("seconds", "label"),
    [
        (-120, "<1m"),  # Kafka's clock behind the producer's: not late at all
        (0, "<1m"),
        (59, "<1m"),
        (60, "1-10m"),
        (599, "1-10m"),
        (600, "10m-1h"),
        (3599, "10m-1h"),
        (3600, "1-6h"),
        (6 * 3600 - 1, "1-6h"),
        (6 * 3600, "6-24h"),
        (86_399, "6-24h"),
        (86_400, ">24h"),
        (10 * 86_400, ">24h"),
    ],
)
def test_lateness_buckets_hold_their_lower_bound_and_not_their_upper(seconds, label):
    assert lateness_bucket(seconds) == label


def test_the_bucket_labels_follow_the_bounds_in_order():
    assert LATENESS_LABELS[: len(LATENESS_BUCKETS)] == [label for _, label in LATENESS_BUCKETS]
    assert [lateness_bucket(bound) for bound, _ in LATENESS_BUCKETS] == LATENESS_LABELS[1:5]


def test_lateness_counts_rows_per_bucket_from_kafka_and_event_times():
    event = datetime(2025, 11, 22, 10, tzinfo=UTC)
    late = [0, 59.5, 60, 600, 3600, 6 * 3600, 86_400, 2 * 86_400]
    data = pa.table(
        {
            "_kafka_ts": pa.array(
                [event + timedelta(seconds=s) for s in late] + [event],
                pa.timestamp("ms", tz="UTC"),
            ),
            "_event_time": pa.array([event] * len(late) + [None], pa.timestamp("us", tz="UTC")),
        }
    )
    counts = lateness_counts(data)
    assert list(counts) == LATENESS_LABELS
    # A row with no event time is in no bucket.
    assert counts == {"<1m": 2, "1-10m": 1, "10m-1h": 1, "1-6h": 1, "6-24h": 1, ">24h": 2}
    assert lateness_counts(data.slice(0, 0)) == dict.fromkeys(LATENESS_LABELS, 0)


def test_partition_counts_key_rows_by_their_partition_path():
    data = pa.table(
        {
            "dt": ["2025-11-22", "2025-11-22", "2025-11-22", "2025-11-23"],
            "hr": ["10", "10", "11", "10"],
        }
    )
    assert partition_counts(data, ["dt", "hr"]) == {
        "dt=2025-11-22/hr=10": 2,
        "dt=2025-11-22/hr=11": 1,
        "dt=2025-11-23/hr=10": 1,
    }
    assert partition_counts(data, ["dt"]) == {"dt=2025-11-22": 3, "dt=2025-11-23": 1}
    assert partition_counts(data.slice(0, 0), ["dt"]) == {}


def test_lag_after_sums_what_each_partition_left_behind_its_watermark():
    rows = [
        {"high_watermark": 500, "end_offset": 450},
        {"high_watermark": 90, "end_offset": 100},  # read past a stale watermark: no lag
        {"high_watermark": None, "end_offset": 7},
        {"high_watermark": 30, "end_offset": 10},
    ]
    assert lag_after(rows) == 50 + 0 + 20
    assert lag_after([{"high_watermark": None, "end_offset": 7}]) is None
    assert lag_after([]) is None


def test_incomplete_marks_collect_every_batch_that_marked_a_partition():
    results = [
        {"batch": 3, "incomplete": ["dt=a/hr=01", "dt=a/hr=02"]},
        {"batch": 4},
        {"batch": 5, "incomplete": ["dt=a/hr=02"]},
    ]
    assert incomplete_marks(results) == {"dt=a/hr=01": [3], "dt=a/hr=02": [3, 5]}
    assert incomplete_marks([]) == {}


def test_recent_batches_are_the_newest_distinct_ones_oldest_first():
    rows = [{"batch": b} for b in (3, 1, 2, 3, 5, 4, 5)]
    assert recent_batches(rows, 3) == [3, 4, 5]
    assert recent_batches(rows, 10) == [1, 2, 3, 4, 5]
    assert recent_batches([], 3) == []


def test_a_sample_is_spread_evenly_over_the_rows():
    data = pa.table({"n": list(range(10))})
    sample = spread_sample(data, 4)
    taken = sample.column("n").to_pylist()
    assert len(taken) == 4 and taken[0] == 0 and taken == sorted(set(taken))
    assert [b - a for a, b in zip(taken, taken[1:], strict=False)] in ([2, 3, 2], [3, 2, 3])
    assert spread_sample(data, 10) is data and spread_sample(data, 50) is data


def quarantined(values: list[bytes], kafka_ts: list[int] | None = None) -> list[str]:
    """The reasons the decoder gives for the messages, in offset order."""
    out = decode_chunk(raw(values, kafka_ts), rules()).quarantine.sort_by("_offset")
    assert out.num_rows == len(values)
    return out.column("reason").to_pylist()


def test_quarantine_reasons_group_by_their_whole_class_across_values_and_moments():
    day = 86_400_000
    reasons = quarantined(
        [
            enc(click(0, device="tv")),
            enc(click(1, device="fridge")),
            enc(click(2, user_id=12.5)),
            enc(click(3, user_id=7.25)),
            enc(click(4, user_id="abc")),
            enc(click(5, page=3)),
            enc(click(6, ts=T0 - 30 * day)),
            enc(click(7, ts=T0 - 90 * day)),
            enc(click(8, ts=0)),
            b"{\x00",
            b"\x00",
        ]
    )
    # Messages broken the same way, each reason quoting its own value or moment.
    for pair in (reasons[0:2], reasons[2:4], reasons[6:8], reasons[9:11]):
        assert len(set(pair)) == 2, pair
    counts = reason_counts(pa.array(reasons), top=20)
    assert counts == {
        "field `device`: <value> is not a symbol of the enum (desktop, mobile, tablet)": 2,
        "not valid JSON for the schema: field `user_id`: <n> is not written as an integer": 2,
        "event time <time> is <n> before its Kafka timestamp <time>, beyond "
        "event_time.max_lateness <n>": 2,
        "not valid JSON: a NUL byte at position <n>": 2,
        "not valid JSON for the schema: field `user_id` should be a number, not a string": 1,
        "not valid JSON for the schema: field `page` should be a string, not a number": 1,
        "event time <time> is before <time> (epoch zero or an unset clock)": 1,
    }
    assert len(reason_counts(pa.array(reasons), top=3)) == 3
    assert reason_counts(pa.array([], pa.string())) == {}


def test_a_reason_class_keeps_field_names_and_type_widths_and_hides_values_ids_and_times():
    assert reason_class("field `ts_2`: 'a \\'b\\' 7' is not a UUID") == (
        "field `ts_2`: <value> is not a UUID"
    )
    # A value cut short by the decoder has no closing quote.
    cut = reason_class("field `e`: 'xxxxxxxx... is not a UUID")
    assert cut == "field `e`: <value> is not a UUID"
    assert reason_class(
        "written with schema id 7, not the configured schema_id 42; decoding it with another "
        "schema would misread its fields"
    ) == (
        "written with schema id <n>, not the configured schema_id <n>; decoding it with "
        "another schema would misread its fields"
    )
    assert reason_class("field `n`: -2147483649 is out of range for int (32 bits)") == (
        "field `n`: <n> is out of range for int (32 bits)"
    )
    assert reason_class("not valid JSON: not UTF-8 text (byte 3)") == (
        "not valid JSON: not UTF-8 text (byte <n>)"
    )
    assert reason_class("event time 2025-11-22T10:00:00Z is 3.5h ahead (allowed skew 1.0h)") == (
        "event time <time> is <n> ahead (allowed skew <n>)"
    )


def result(**over) -> QualityResult:
    base = dict(
        pipeline="clicks", batch=7, kind="ingest", gate="warn", success=True,
        checked_at="2025-11-22T10:05:00+00:00", committed_at="2025-11-22T10:00:00+00:00",
        rows=12_345, validated_rows=12_345, sampled=False, ledger={}, lag_after=None,
    )  # fmt: skip
    return QualityResult(**{**base, **over})


def test_the_text_report_names_each_failure_the_marks_and_the_losses():
    passed = Check("expect_table_columns_to_match_set", True)
    failed = Check("expect_column_values_to_not_be_null", False, "user_id", "10 unexpected", 10)
    reconcile = Check("reconcile: data files present", False, None, "the table lists 1", 1)
    text = render_quality(
        result(
            success=False, gate="fail", sampled=True, validated_rows=1_000,
            checks=[passed, failed, reconcile], incomplete=["dt=2025-11-22/hr=10"],
            losses=[{"topic": "t", "partition": 2, "start_offset": 5, "end_offset": 9,
                     "note": "accepted"}],
            docs="docs/validations/x.html",
            docs_location="s3://lake/quality/docs/validations/x.html",
        )
    ).splitlines()  # fmt: skip
    assert text[0] == (
        "pipeline clicks: batch 7 (ingest) quality FAILED: 1 of 3 checks passed on 12,345 "
        "rows (a sample of 1,000); gate fail"
    )
    assert "  FAILED expect_column_values_to_not_be_null on user_id: 10 unexpected" in text
    assert "  FAILED reconcile: data files present: the table lists 1" in text
    assert "partitions marked incomplete: dt=2025-11-22/hr=10" in text
    assert any(line.startswith("  LOSS: offsets [5, 9) of partition 2 of `t`") for line in text)
    # Where a user opens it, not the link the summary page follows.
    assert text[-1] == "data docs: s3://lake/quality/docs/validations/x.html"
    assert not any("expect_table_columns" in line for line in text)


def test_a_passed_result_reports_in_one_line():
    text = render_quality(result(checks=[Check("a", True), Check("b", True)]))
    assert text == (
        "pipeline clicks: batch 7 (ingest) quality passed: 2 of 2 checks passed on 12,345 "
        "rows; gate warn"
    )
