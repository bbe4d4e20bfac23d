"""Data quality on real batches: the Great Expectations suite, reconciliation, reports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from strata.batch.reconcile import ledger_continuity
from strata.errors import QualityError
from strata.local.events import HOUR_MS
from strata.quality.run import run_quality
from strata.quality.store import ResultStore
from strata.run import run_batch
from strata.store.ledger import LEDGER_SCHEMA, read_ledger
from tests.conftest import produce_clicks

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def recent_start() -> int:
    """An event-time start three hours before the current hour, inside the default window."""
    return (int(time.time() * 1000) // HOUR_MS - 3) * HOUR_MS


def check(cfg, batch=None):
    """Check a batch with the pipeline's places and sections, as the entry points do."""
    return run_quality(
        cfg.places(), cfg.quality, cfg.schemas(), cfg.metastore, cfg.warehouse, batch
    )


def failed(result) -> dict[str, str]:
    return {f"{c.name} {c.column or ''}".strip(): c.detail for c in result.failed}


def test_a_clean_batch_passes_and_writes_its_reports(make_pipeline, broker, spark):
    p = make_pipeline(partitions=2)
    produce_clicks(broker, p.topic, 2, 1500, start_ms=recent_start(), malformed=2)
    run_batch(p.cfg(), session=lambda _: spark)

    result = check(p.cfg())
    assert result.success, failed(result)
    assert result.batch == 1 and result.rows == result.validated_rows == 1500
    names = {c.name for c in result.checks}
    for expected in (
        "expect_table_columns_to_match_set",
        "expect_column_values_to_not_be_null",
        "expect_compound_columns_to_be_unique",
        "expect_column_values_to_be_between",
        "reconcile: offsets = rows + quarantined + gaps",
        "reconcile: raw copy rows = ledger",
        "reconcile: no unexplained holes",
    ):
        assert expected in names
    not_null = {c.column for c in result.checks if c.name == "expect_column_values_to_not_be_null"}
    assert {"event_id", "user_id", "page", "device", "ts", "_offset"} <= not_null
    assert result.ledger["quarantined"] == 2 and sum(result.partitions.values()) == result.rows

    quality = Path(p.cfg().location("quality"))
    stored = json.loads((quality / "results" / "batch-0000000001.json").read_text())
    assert stored["success"] is True and stored["ledger"]["rows"] == result.rows
    assert (quality / result.docs).is_file() and (quality / "index.html").is_file()


def test_a_bad_batch_fails_the_right_expectations_and_the_report_names_them(
    make_pipeline, broker, spark
):
    p = make_pipeline(
        partitions=2,
        overrides={
            "quality": {
                "gate": "fail",
                "ranges": {"latency_ms": {"min": 0, "max": 500}},
                "value_sets": {"device": ["desktop", "mobile", "tablet"]},
                "expectations": [
                    {
                        "type": "expect_column_values_to_match_regex",
                        "kwargs": {"column": "page", "regex": "^/"},
                    }
                ],
            }
        },
    )
    produce_clicks(broker, p.topic, 2, 600, start_ms=recent_start())
    run_batch(p.cfg(), session=lambda _: spark)
    first = check(p.cfg())
    # The generator draws latencies up to 900 ms: out of the declared range.
    assert set(failed(first)) == {"expect_column_values_to_be_between latency_ms"}

    # A forced re-ingest past the ledger: 40 of batch 1's rows land again as batch 2,
    # ten of them with no user_id, and the ledger is told of a range it already holds.
    table = DeltaTable(p.cfg().location("table"))
    again = table.to_pyarrow_table().filter(pc.equal(pc.field("_partition"), 0)).slice(0, 40)
    again = again.set_column(again.schema.get_field_index("_batch"), "_batch", pa.array([2] * 40))
    users = again.column("user_id").to_pylist()
    again = again.set_column(
        again.schema.get_field_index("user_id"),
        "user_id",
        pa.array([None] * 10 + users[10:], pa.int64()),
    )
    write_deltalake(table, again, mode="append")
    offsets = again.column("_offset").to_pylist()
    row = {name: 0 for name in LEDGER_SCHEMA.names}
    row.update(
        pipeline=p.name,
        batch=2,
        kind="ingest",
        topic=p.topic,
        partition=0,
        start_offset=min(offsets),
        end_offset=max(offsets) + 1,
        messages=40,
        rows=40,
        min_event_time=None,
        max_event_time=None,
        high_watermark=None,
        committed_at=pa.scalar(int(time.time() * 1e6), pa.timestamp("us", tz="UTC")).as_py(),
        note="forced re-ingest",
    )
    write_deltalake(
        p.cfg().location("ledger"), pa.Table.from_pylist([row], LEDGER_SCHEMA), mode="append"
    )

    done = p.cli("quality", "--batch", "2", "--json")
    assert done.returncode == 1, done.stderr
    body = json.loads(done.stdout.strip().splitlines()[-1])
    names = {f"{c['name']} {c['column'] or ''}".strip() for c in body["checks"] if not c["success"]}
    assert {
        "expect_column_values_to_not_be_null user_id",
        "expect_compound_columns_to_be_unique _topic,_partition,_offset",
        "expect_column_values_to_be_between latency_ms",
        "reconcile: no overlapping batches",
        "reconcile: raw copy rows = ledger",
    } <= names
    assert "expect_column_values_to_match_regex page" not in names
    unique = next(c for c in body["checks"] if c["name"].startswith("expect_compound"))
    assert unique["unexpected"] == 80  # each duplicated message counts twice
    assert "FAILED expect_column_values_to_not_be_null on user_id: 10 unexpected" in done.stdout
    assert "batch 2 is committed" not in done.stderr and "(gate: fail)" in done.stderr
    assert body["incomplete"] and set(body["incomplete"]) == set(body["partitions"])
    # Batch 1 failed under the same gate: its partitions were marked too.
    marks = ResultStore.of(p.cfg().places()).incomplete()
    assert set(body["incomplete"]) <= marks.keys() == set(first.partitions)
    assert all(marks[name] == [1, 2] for name in body["incomplete"])


def test_reconciliation_catches_a_deleted_data_file(make_pipeline, broker, spark):
    p = make_pipeline(partitions=2)
    produce_clicks(broker, p.topic, 2, 800, start_ms=recent_start())
    run_batch(p.cfg(), session=lambda _: spark)
    [victim, *_] = sorted(Path(p.cfg().location("table")).rglob("part-*.parquet"))
    lost = pq.read_metadata(victim).num_rows
    os.remove(victim)

    result = check(p.cfg())
    problems = failed(result)
    assert victim.name in problems["reconcile: data files present"]
    assert "the ledger says" in problems["reconcile: data table rows = ledger"]
    assert result.rows == 800 - lost


def test_overlaps_and_holes_are_decided_on_the_ledger_alone():
    def row(batch, kind, start, end):
        return {"batch": batch, "kind": kind, "topic": "t", "partition": 0,
                "start_offset": start, "end_offset": end}  # fmt: skip

    clean = pa.Table.from_pylist([row(1, "ingest", 0, 10), row(2, "ingest", 10, 20)])
    assert ledger_continuity(clean) == ([], [])
    explained = pa.Table.from_pylist(
        [row(1, "ingest", 0, 10), row(2, "loss", 10, 15), row(2, "ingest", 15, 20)]
    )
    assert ledger_continuity(explained) == ([], [])
    holed = pa.Table.from_pylist([row(1, "ingest", 0, 10), row(2, "ingest", 15, 20)])
    assert ledger_continuity(holed)[1] == [
        "partition 0 of `t`: offsets [10, 15) between batch 1 and batch 2 were never read and "
        "no loss is recorded for them"
    ]
    overlapping = pa.Table.from_pylist([row(1, "ingest", 0, 10), row(2, "ingest", 5, 20)])
    assert "batch 2 [5, 20) overlaps batch 1 [0, 10)" in ledger_continuity(overlapping)[0][0]
    # A recorded seek forward explains the offsets it skips; one back to the start of a
    # re-created topic starts the partition over, so re-used offsets are no overlap.
    skipped = pa.Table.from_pylist(
        [row(1, "ingest", 0, 10), row(2, "seek", 10, 15), row(3, "ingest", 15, 20)]
    )
    assert ledger_continuity(skipped) == ([], [])
    restarted = pa.Table.from_pylist(
        [row(1, "ingest", 0, 10), row(2, "seek", 0, 0), row(3, "ingest", 0, 4)]
    )
    assert ledger_continuity(restarted) == ([], [])
    # An empty first range (a `latest` start) records where reading begins.
    late_start = pa.Table.from_pylist([row(1, "ingest", 50, 50), row(2, "ingest", 60, 70)])
    assert ledger_continuity(late_start)[1] == [
        "partition 0 of `t`: offsets [50, 60) between batch 1 and batch 2 were never read and "
        "no loss is recorded for them"
    ]


def test_an_unknown_expectation_is_named_with_its_key(make_pipeline, broker, spark):
    p = make_pipeline(
        partitions=1,
        overrides={"quality": {"expectations": [{"type": "expect_rows_to_be_lovely"}]}},
    )
    produce_clicks(broker, p.topic, 1, 50, start_ms=recent_start())
    run_batch(p.cfg(), session=lambda _: spark)
    with pytest.raises(QualityError, match=r"quality.expectations\[0\].type 'expect_rows_to_be"):
        check(p.cfg())


def chromium(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    profile = cwd / "chromium-profile"
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def test_the_reports_render_in_headless_chromium_with_the_ledger_figures(
    make_pipeline, broker, spark, tmp_path
):
    assert os.path.exists(CHROMIUM), "`make test` installs Debian's chromium (make chromium)"
    p = make_pipeline(partitions=2)
    # Late events reach Kafka up to 30 hours after they happen, and Kafka refuses a
    # timestamp more than an hour ahead of its clock: these happened that long ago.
    start = recent_start() - 30 * HOUR_MS
    produce_clicks(broker, p.topic, 2, 700, start_ms=start, malformed=3, late=4)
    run_batch(p.cfg(), session=lambda _: spark)
    check(p.cfg())
    produce_clicks(broker, p.topic, 2, 300, start_ms=start, seed=4)
    run_batch(p.cfg(), session=lambda _: spark)
    second = check(p.cfg())

    quality = Path(p.cfg().location("quality"))
    page = chromium("--dump-dom", (quality / "index.html").as_uri(), cwd=tmp_path)
    assert page.returncode == 0, page.stderr
    dom = page.stdout
    ledger = read_ledger(p.cfg().places()).to_pylist()
    for batch in (1, 2):
        recs = [r for r in ledger if r["batch"] == batch]
        for key in ("messages", "rows", "quarantined"):
            assert f'<td class="num">{sum(r[key] for r in recs):,}</td>' in dom, (batch, key)
    assert "not valid JSON for the schema" in dom
    # Rows, MB, lag, late arrivals and quarantine reasons are plots; hours are tiles.
    assert dom.count("<svg") == 5 and "Late arrivals" in dom and 'class="hour"' in dom

    docs = chromium("--dump-dom", (quality / second.docs).as_uri(), cwd=tmp_path)
    assert docs.returncode == 0, docs.stderr
    assert "values must never be null" in docs.stdout and "Succeeded" in docs.stdout

    shot = tmp_path / "quality.png"
    done = chromium(
        f"--screenshot={shot}", "--window-size=1200,1800", (quality / "index.html").as_uri(),
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0 and shot.stat().st_size > 10_000
