"""End to end against Apache Kafka and real Spark."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
import yaml
from confluent_kafka import Producer
from deltalake import DeltaTable

from strata.errors import SchemaError
from strata.operations.report import summary_dict
from strata.run import run_batch
from strata.store.ledger import read_ledger
from tests.conftest import ROOT, START_MS, expected_offsets, produce_clicks


def test_a_batch_lands_every_message_once_routing_late_and_quarantining_bad(
    make_pipeline, broker, spark
):
    p = make_pipeline(partitions=4)
    per = produce_clicks(broker, p.topic, 4, 3000, late=10, malformed=7, future=2)
    outcome = run_batch(p.cfg(), session=lambda _: spark)

    assert outcome.status == "committed" and outcome.batch == 1
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)
    quarantine = p.table_rows("quarantine")
    assert quarantine.num_rows == 9
    reasons = quarantine.column("reason").to_pylist()
    assert sum("ahead of its Kafka timestamp" in r for r in reasons) == 2
    assert all(v is not None for v in quarantine.column("_value").to_pylist())

    data = p.table_rows("table")
    # Every row sits in the partition of its own event time, late ones included.
    hours = pc.strftime(data.column("_event_time"), format="%Y-%m-%d/%H").to_pylist()
    assert hours == [
        f"{d}/{h}"
        for d, h in zip(data.column("dt").to_pylist(), data.column("hr").to_pylist(), strict=True)
    ]
    summary = summary_dict(outcome)
    assert summary["late_rows"] == 10 and summary["max_lateness_ms"] >= 3 * 3_600_000
    assert summary["rows"] + summary["quarantined"] + summary["gaps"] == sum(per.values())
    # Where the time went: every stage of the tasks and of the driver, timed.
    tasks, driver = summary["stages"]["tasks"], summary["stages"]["driver"]
    assert {"fetch", "decode", "write_raw", "write_data", "statistics", "close"} <= set(tasks)
    assert {"plan", "spark_start", "tasks", "commit", "ledger", "read_back"} <= set(driver)
    assert all(s["wall"] >= 0 and s["cpu"] >= 0 for s in [*tasks.values(), *driver.values()])
    assert tasks["decode"]["cpu"] > 0 and tasks["background"]["wall"] == 0
    # Each task's stages run one after another within the tasks' wall time.
    staged = sum(s["wall"] for s in tasks.values())
    assert 0 < staged <= driver["tasks"]["wall"] * 2 + 0.5

    ledger = read_ledger(p.cfg().places()).to_pylist()
    assert sorted((r["partition"], r["start_offset"], r["end_offset"]) for r in ledger) == [
        (q, 0, n) for q, n in sorted(per.items())
    ]
    for r in ledger:
        assert r["end_offset"] - r["start_offset"] == r["rows"] + r["quarantined"] + r["gaps"]
        assert r["min_event_time"] is not None and r["max_event_time"] >= r["min_event_time"]

    dt = DeltaTable(p.cfg().location("table"))
    assert dt.transaction_version(p.name) == 1
    # Full file statistics: delta-rs's own reader prunes by them, and a column missing
    # from them would make any filter on it find nothing.
    everything = dt.to_pyarrow_table(columns=["page", "_event_time", "country"])
    for column, value in (("page", "/"), ("country", "DE")):
        expected = sum(1 for v in everything.column(column).to_pylist() if v == value)
        assert (
            expected
            and dt.to_pyarrow_dataset().count_rows(filter=ds.field(column) == value) == expected
        )
    newest = pc.max(everything.column("_event_time"))
    assert dt.to_pyarrow_dataset().count_rows(filter=ds.field("_event_time") == newest) >= 1
    ledger_dt = DeltaTable(p.cfg().location("ledger"))
    assert ledger_dt.to_pyarrow_dataset().count_rows(filter=ds.field("topic") == p.topic) == 4
    # Plain Delta: no table features that Trino's or delta-spark's readers could lack.
    protocol = dt.protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)
    adds = pa.table(dt.get_add_actions(flatten=True))
    per_hour = Counter(
        zip(
            adds.column("partition.dt").to_pylist(),
            adds.column("partition.hr").to_pylist(),
            strict=True,
        )
    )
    assert sorted(per_hour) == [("2025-11-22", "10"), ("2025-11-22", "11"), ("2025-11-22", "12")]
    assert max(per_hour.values()) <= 2, "at most one file per task per event hour"
    commit = dt.history(1)[0]
    ranges = json.loads(commit["strata.ranges"])
    assert sorted((r["partition"], r["start"], r["end"]) for r in ranges) == [
        (q, 0, n) for q, n in sorted(per.items())
    ]


def test_the_next_run_reads_only_new_offsets(make_pipeline, broker, spark):
    p = make_pipeline(partitions=2)
    first = produce_clicks(broker, p.topic, 2, 500, seed=1)
    assert run_batch(p.cfg(), session=lambda _: spark).batch == 1
    second = produce_clicks(broker, p.topic, 2, 300, seed=2, start_ms=START_MS + 3 * 3_600_000)
    outcome = run_batch(p.cfg(), session=lambda _: spark)
    assert outcome.batch == 2
    assert [(r.partition, r.start) for r in outcome.ranges] == [(0, first[0]), (1, first[1])]
    total = {q: first[q] + second[q] for q in first}
    assert p.landed() == expected_offsets(total)
    assert run_batch(p.cfg(), session=lambda _: spark).status == "idle"


def test_saved_plans_stay_a_bounded_tail_however_many_batches_commit(
    make_pipeline, broker, spark, monkeypatch
):
    monkeypatch.setattr("strata.run.KEPT_PLANS", 2)
    p = make_pipeline(partitions=1, overrides={"limits": {"max_offsets_per_partition": 100}})
    per = produce_clicks(broker, p.topic, 1, 450)
    batches = []
    while (outcome := run_batch(p.cfg(), session=lambda _: spark)).status != "idle":
        batches.append(outcome.batch)
    assert batches == [1, 2, 3, 4, 5]
    assert p.landed() == expected_offsets(per)
    # Each committed ingest batch forgot the plan of the batch two before it.
    saved = sorted(f.name for f in p.warehouse.rglob("plans/batch-*.json"))
    assert saved == ["batch-0000000004.json", "batch-0000000005.json"]


def test_offset_gaps_from_transactions_are_counted_not_waited_for(make_pipeline, broker, spark):
    p = make_pipeline(partitions=1)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": p.name})
    producer.init_transactions(30)
    kept, dropped = [], []
    for txn, (n, commit) in enumerate([(5, True), (3, False), (4, True), (2, False), (6, True)]):
        producer.begin_transaction()
        for i in range(n):
            body = {
                "event_id": f"x{txn}-{i}",
                "user_id": i,
                "page": "/",
                "device": "mobile",
                "ts": START_MS + i,
            }
            producer.produce(
                p.topic, json.dumps(body).encode(), partition=0, timestamp=START_MS + i
            )
            (kept if commit else dropped).append(body["event_id"])
        # Sent before an abort: an abort purges what the client still holds.
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    broker.wait_until_stable(p.topic)

    outcome = run_batch(p.cfg(), session=lambda _: spark)
    [r] = outcome.ranges
    # 20 records and 5 markers; the aborted records stay in the log, unread.
    assert (r.start, r.end) == (0, 25)
    assert r.gaps == len(dropped) + 5
    assert r.end - r.start == r.rows + r.quarantined + r.gaps
    assert sorted(p.table_rows("table").column("event_id").to_pylist()) == sorted(kept)
    assert r.messages == len(kept)


def test_a_run_with_nothing_new_starts_no_jvm(make_pipeline, broker, spark, tmp_path):
    p = make_pipeline(partitions=1)
    produce_clicks(broker, p.topic, 1, 50)
    run_batch(p.cfg(), session=lambda _: spark)
    # A java that leaves a mark: if anything tried to start Spark, we would see it.
    fake = tmp_path / "fake-java"
    (fake / "bin").mkdir(parents=True)
    marker = tmp_path / "java-was-called"
    (fake / "bin" / "java").write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    (fake / "bin" / "java").chmod(0o755)
    path = ":".join(d for d in os.environ["PATH"].split(":") if not Path(d, "java").exists())
    done = p.cli("run", "--json", env=p.env(JAVA_HOME=str(fake), PATH=f"{fake / 'bin'}:{path}"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["status"] == "idle"
    assert "nothing new to read" in done.stdout
    assert not marker.exists()


def test_a_second_run_while_one_is_in_flight_fails_cleanly(make_pipeline, broker):
    p = make_pipeline(partitions=2)
    per = produce_clicks(broker, p.topic, 2, 20_000)
    first = p.spawn("run")
    lock = p.cfg().lock_path
    deadline = time.monotonic() + 60
    while not (lock.exists() and f'"pid": {first.pid}' in lock.read_text()):
        assert time.monotonic() < deadline and first.poll() is None, (
            "the first run never took the lock"
        )
        time.sleep(0.05)
    second = p.cli("run", "--json")
    assert second.returncode == 3
    assert "another run is in flight" in second.stderr and f'"pid": {first.pid}' in second.stderr
    assert "Traceback" not in second.stderr
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert p.landed() == expected_offsets(per)
    assert [r["batch"] for r in read_ledger(p.cfg().places()).to_pylist()] == [1, 1]


def test_the_shuffle_layout_writes_one_file_per_event_hour(make_pipeline, broker, spark):
    p = make_pipeline(partitions=4, overrides={"layout": "shuffle"})
    per = produce_clicks(broker, p.topic, 4, 4000, malformed=4, late=6)
    outcome = run_batch(p.cfg(), session=lambda _: spark)
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)
    adds = pa.table(DeltaTable(p.cfg().location("table")).get_add_actions(flatten=True))
    hours = list(
        zip(
            adds.column("partition.dt").to_pylist(),
            adds.column("partition.hr").to_pylist(),
            strict=True,
        )
    )
    assert sorted(hours) == [("2025-11-22", "10"), ("2025-11-22", "11"), ("2025-11-22", "12")]
    assert all("-r0000" in path for path in adds.column("path").to_pylist())
    assert outcome.files["table"] == 3
    assert summary_dict(outcome)["late_rows"] == 6


def test_latest_start_records_where_new_partitions_begin_without_spark(
    make_pipeline, broker, spark
):
    p = make_pipeline(partitions=2, overrides={"starting_offsets": "latest"})
    old = produce_clicks(broker, p.topic, 2, 200)

    def no_spark(_):
        raise AssertionError("nothing to read: Spark must not start")

    first = run_batch(p.cfg(), session=no_spark)
    assert first.status == "committed" and first.new_partitions == [(p.topic, 0), (p.topic, 1)]
    assert [(r.start, r.end) for r in first.ranges] == [(old[0], old[0]), (old[1], old[1])]
    new = produce_clicks(broker, p.topic, 2, 60, seed=5)
    second = run_batch(p.cfg(), session=lambda _: spark)
    assert [(r.start, r.end) for r in second.ranges] == [
        (old[q], old[q] + new[q]) for q in range(2)
    ]
    landed = p.landed()
    assert landed == Counter({(q, o): 1 for q in range(2) for o in range(old[q], old[q] + new[q])})


def test_confluent_avro_lands_and_the_raw_copy_keeps_keys_headers_and_timestamps(
    make_pipeline, broker, spark
):
    import io
    import struct

    from fastavro import parse_schema, schemaless_writer

    p = make_pipeline(partitions=1, overrides={"format": "confluent_avro", "schema_id": 7})
    schema = parse_schema(json.loads((ROOT / "schemas" / "clicks.avsc").read_text()))
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    sent = []
    for i in range(30):
        record = {
            "event_id": f"a{i}",
            "user_id": i,
            "session_id": None,
            "page": "/",
            "referrer": None,
            "country": "DE",
            "device": "tablet",
            "latency_ms": i,
            "ts": START_MS + i * 1000,
        }
        buf = io.BytesIO()
        schemaless_writer(buf, schema, record)
        value = b"\x00" + struct.pack(">I", 7) + buf.getvalue()
        if i == 13:
            value = buf.getvalue()  # plain Avro without the wire-format header
        headers = [("trace", f"t{i}".encode()), ("source", b"web")]
        producer.produce(
            p.topic,
            value,
            f"k{i}".encode(),
            partition=0,
            timestamp=START_MS + i * 1000 + 7,
            headers=headers,
        )
        sent.append((f"k{i}".encode(), value, headers, START_MS + i * 1000 + 7))
    producer.flush(30)

    outcome = run_batch(p.cfg(), session=lambda _: spark)
    assert summary_dict(outcome)["rows"] == 29 and summary_dict(outcome)["quarantined"] == 1
    rows = p.table_rows("table").sort_by("_offset").to_pylist()
    assert [r["event_id"] for r in rows] == [f"a{i}" for i in range(30) if i != 13]
    assert rows[0]["device"] == "tablet" and rows[0]["_key"] == b"k0"
    reasons = p.table_rows("quarantine").sort_by("_offset").column("reason").to_pylist()
    assert reasons[0] == "not in Confluent wire format (expected magic byte 0 and a schema id)"

    raw = p.table_rows("raw").sort_by("_offset").to_pylist()
    for r, (key, value, headers, ts) in zip(raw, sent, strict=True):
        assert r["_key"] == key and r["_value"] == value
        assert [(h["key"], h["value"]) for h in r["_headers"]] == headers
        assert int(r["_kafka_ts"].timestamp() * 1000) == ts


def test_an_accepted_loss_is_recorded_in_the_ledger_and_shown_by_status(
    make_pipeline, broker, spark
):
    from strata.edge import status_settings
    from strata.errors import PlanError
    from strata.operations.status import pipeline_status, render_status

    # The first batch records where reading starts (an empty topic, read from its end);
    # then offsets [0, 120) are deleted (DeleteRecords, as retention would) before batch
    # 2 reads them.
    p = make_pipeline(partitions=1, overrides={"starting_offsets": "latest"})
    assert run_batch(p.cfg(), session=lambda _: spark).batch == 1
    per = produce_clicks(broker, p.topic, 1, 300)
    assert broker.delete_records(p.topic, {0: 120}) == {0: 120}
    cfg = p.cfg()
    with pytest.raises(
        PlanError,
        match=r"committed offset 0 is below the log start 120; 120 messages were deleted by "
        r"retention before they were read\. Nothing was read\. Re-run with --accept-loss",
    ):
        run_batch(cfg, session=lambda _: spark)
    assert [r["batch"] for r in read_ledger(cfg.places()).to_pylist()] == [1]

    outcome = run_batch(cfg, session=lambda _: spark, accept_loss="oncall@host: INC-7")
    assert outcome.batch == 2
    assert "120 messages were deleted by retention" in outcome.warnings[0]
    rows = {r["kind"]: r for r in read_ledger(cfg.places()).to_pylist() if r["batch"] == 2}
    assert (rows["loss"]["start_offset"], rows["loss"]["end_offset"], rows["loss"]["gaps"]) == (
        0,
        120,
        120,
    )
    assert rows["loss"]["note"] == "loss accepted by oncall@host: INC-7"
    assert (rows["ingest"]["start_offset"], rows["ingest"]["end_offset"]) == (120, per[0])
    assert p.landed() == expected_offsets(per, first={0: 120})
    status = pipeline_status(cfg.places(), status_settings(cfg))
    assert status["losses"][0]["messages_lost"] == 120
    assert "LOSS: batch 2: offsets [0, 120)" in render_status(status)
    assert status["partitions"][0]["committed"] == per[0]
    # The quality report shows the loss, and the loss explains the ledger's gap.
    from strata.quality.checks import render_quality
    from strata.quality.run import run_quality

    result = run_quality(cfg.places(), cfg.quality, cfg.schemas(), cfg.metastore, cfg.warehouse)
    assert [(x["start_offset"], x["end_offset"]) for x in result.losses] == [(0, 120)]
    assert "LOSS: offsets [0, 120) of partition 0" in render_quality(result)
    holes = next(c for c in result.checks if c.name == "reconcile: no unexplained holes")
    assert holes.success
    page = (Path(cfg.location("quality")) / "index.html").read_text()
    assert "offsets [0, 120) of partition 0" in page


def test_partitions_in_a_zone_and_by_a_field_land_every_offset_once_and_stay_put(
    make_pipeline, broker, spark
):
    kolkata = ZoneInfo("Asia/Kolkata")  # +05:30: each UTC hour spans two local hours
    partitioning = {
        "timezone": "Asia/Kolkata",
        "field": {"name": "country", "values": ["DE", "US"]},
    }
    p = make_pipeline(partitions=2, overrides={"partitioning": partitioning})
    per = produce_clicks(broker, p.topic, 2, 600, malformed=3)
    outcome = run_batch(p.cfg(), session=lambda _: spark)

    assert outcome.status == "committed"
    assert p.landed() == expected_offsets(per)
    data = p.table_rows("table").to_pylist()
    for row in data:
        local = row["_event_time"].astimezone(kolkata)
        assert (row["dt"], row["hr"]) == (f"{local:%Y-%m-%d}", f"{local:%H}"), row
        listed = row["country"] in ("DE", "US")
        assert row["p_country"] == (row["country"] if listed else "__other__"), row
    # 10:00Z to 13:00Z is 15:30 to 18:30 in Kolkata; unlisted countries and nulls share one.
    assert {r["hr"] for r in data} == {"15", "16", "17", "18"}
    assert {r["p_country"] for r in data} == {"DE", "US", "__other__"}
    assert any(r["country"] is None for r in data) and any(r["country"] == "JP" for r in data)

    table = DeltaTable(p.cfg().location("table"))
    assert table.metadata().partition_columns == ["dt", "hr", "p_country"]
    adds = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    for add in adds:
        values = (add["partition.dt"], add["partition.hr"], add["partition.p_country"])
        assert add["path"].startswith("dt={}/hr={}/p_country={}/".format(*values)), add["path"]
    assert {a["partition.p_country"] for a in adds} == {"DE", "US", "__other__"}

    # The table keeps its partitioning: a new zone is refused before anything is read.
    path = p.conf_dir / "pipelines" / f"{p.name}.yaml"
    body = yaml.safe_load(path.read_text())
    body["partitioning"]["timezone"] = "UTC"
    path.write_text(yaml.safe_dump(body))
    produce_clicks(broker, p.topic, 2, 50, seed=3)
    with pytest.raises(SchemaError, match=r"column dt was in Asia/Kolkata, is now in UTC"):
        run_batch(p.cfg(), session=lambda _: spark)
    assert len(read_ledger(p.cfg().places()).to_pylist()) == 2
