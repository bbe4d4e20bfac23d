"""What a HiveServer2/Presto-style client sees: the Spark Thrift Server on the same metastore.

The embedded engine's answers are compared with Trino's own in
tests/integration/test_trino_answers.py.
"""

from __future__ import annotations

import math
from collections import Counter
from datetime import timedelta
from functools import partial

from pyhive import hive

from strata.catalog.metastore import MetastoreClient
from strata.catalog.query import on_pipeline, only_query, ready_query
from strata.catalog.register import location_uri, register_tables
from strata.edge import registration
from strata.maintenance.compact import Compaction, compact
from strata.maintenance.vacuum import sweep_moved, vacuum
from strata.run import run_batch
from strata.store.files import filesystem
from strata.store.ledger import read_ledger
from strata.store.locations import current_files, current_locations, visible_files
from strata.store.lock import run_lock
from strata.store.parquet import partition_path
from tests.conftest import START_MS, produce_clicks
from tests.maintenance_runs import compacted


def spark_sql(name: str, pipeline: str) -> str:
    """A ready query, renamed for this pipeline's tables, in Spark's dialect."""
    return on_pipeline(only_query(ready_query(name)), pipeline, "strata").sql("spark")


def test_the_thrift_server_sees_what_the_ledger_says(
    make_pipeline, broker, spark, metastore, thriftserver
):
    p = make_pipeline(
        partitions=2, overrides={"table_format": "parquet", "metastore": {"uri": metastore.uri}}
    )
    produce_clicks(broker, p.topic, 2, 1200, hours=4, late=5, malformed=4)
    assert run_batch(p.cfg(), session=lambda _: spark).register_error is None
    produce_clicks(
        broker, p.topic, 2, 600, seed=2, start_ms=START_MS + 4 * 3_600_000, hours=2, late=2
    )
    assert run_batch(p.cfg(), session=lambda _: spark).register_error is None
    ledger = read_ledger(p.cfg().places()).to_pylist()
    assert sorted({r["batch"] for r in ledger}) == [1, 2]

    cursor = hive.connect("127.0.0.1", port=thriftserver.port, auth="NOSASL").cursor()

    def query(sql: str) -> list[tuple]:
        cursor.execute(sql)
        return cursor.fetchall()

    per_partition = Counter()
    for r in ledger:
        per_partition[r["partition"]] += r["rows"]
    assert (
        dict(query(f"SELECT _partition, count(*) FROM strata.{p.name} GROUP BY _partition"))
        == per_partition
    )
    total_rows = sum(per_partition.values())

    hours = query(spark_sql("rows_per_hour", p.name))
    assert len(hours) == 6 and sum(n for _, _, n in hours) == total_rows

    fresh = query(spark_sql("freshness_per_partition", p.name))
    assert max(row[4] for row in fresh) == 2 and sum(row[5] for row in fresh) == total_rows

    late = query(spark_sql("late_arrivals", p.name))
    assert (
        sum(n for hours_late, n in late if hours_late >= 1)
        == sum(r["late_rows"] for r in ledger)
        == 7
    )

    reasons = query(spark_sql("quarantine_reasons", p.name))
    assert sum(row[1] for row in reasons) == sum(r["quarantined"] for r in ledger) == 4

    ranges = query(spark_sql("ledger_ranges", p.name))
    assert [(b, part, s, e, rows, q, g) for b, _, _, part, s, e, _, rows, q, g, _, _ in ranges] == [
        (
            r["batch"],
            r["partition"],
            r["start_offset"],
            r["end_offset"],
            r["rows"],
            r["quarantined"],
            r["gaps"],
        )
        for r in sorted(ledger, key=lambda r: (r["batch"], r["partition"]))
    ]
    assert all(row[10] == 0 for row in ranges)

    lag = query(spark_sql("lag_per_partition", p.name))
    newest = {r["partition"]: r for r in ledger if r["batch"] == 2}
    assert [(row[1], row[2], row[4]) for row in lag] == [
        (q, newest[q]["end_offset"], newest[q]["high_watermark"] - newest[q]["end_offset"])
        for q in sorted(newest)
    ]


def test_compacting_plain_parquet_moves_partitions_and_no_query_sees_a_difference(
    make_pipeline, broker, spark, metastore, thriftserver
):
    p = make_pipeline(
        partitions=2, overrides={"table_format": "parquet", "metastore": {"uri": metastore.uri}}
    )
    cfg = p.cfg()
    for seed in range(3):
        produce_clicks(broker, p.topic, 2, 150, seed=seed + 1, hours=3)
        assert run_batch(cfg, session=lambda _: spark).register_error is None
    cursor = hive.connect("127.0.0.1", port=thriftserver.port, auth="NOSASL").cursor()

    def query(sql: str) -> list[tuple]:
        cursor.execute(sql)
        return cursor.fetchall()

    every_row = f"SELECT * FROM strata.{p.name} ORDER BY _partition, _offset"
    before = query(every_row)
    assert len(before) == sum(r["rows"] for r in read_ledger(cfg.places()).to_pylist()) > 0
    with MetastoreClient(metastore.uri, 30) as client:
        names = client.partition_names("strata", p.name)
    fs, root = filesystem(cfg.location("table"), cfg.storage_options)
    files_before = Counter(f.partition for f in current_files(fs, root))
    assert len(names) == 3 and all(files_before[n] >= 3 for n in names), files_before

    settings = Compaction.of(cfg.maintenance, cfg.limits, cfg.partitioning)
    register = partial(register_tables, registration(cfg))
    report = compact(cfg.places(), settings, lambda: spark, register, older_than="0s")
    assert {e.table: e.outcome for e in report.partitions} == {"table": "compacted"}
    assert [e.partition for e in report.partitions] == sorted(names)
    assert set(report.skipped) == {"raw", "quarantine", "ledger"}

    # The metastore lists the same partitions, each at its new directory, which holds
    # ceil(size / target) files; the old files stay for queries that listed them.
    moved = current_locations(fs, root)
    with MetastoreClient(metastore.uri, 30) as client:
        parts = client.partitions_by_names("strata", p.name, names)
        assert sorted(client.partition_names("strata", p.name)) == sorted(names)
    table_uri = location_uri(cfg.location("table"))
    assert sorted((partition_path(["dt", "hr"], x.values), x.sd.location) for x in parts) == sorted(
        (n, f"{table_uri}/{moved[n]}") for n in names
    )
    assert all(moved[n].startswith(f"{n}/_c") for n in names)
    target = cfg.limits.target_file_mb << 20
    now = [f for f in current_files(fs, root)]
    for n in names:
        sizes = [f.size for f in now if f.partition == n]
        assert len(sizes) == math.ceil(sum(sizes) / target) < files_before[n]
    assert query(every_row) == before

    # Late rows into a compacted hour land in its directory in use, and are seen.
    late = produce_clicks(broker, p.topic, 2, 40, seed=9, hours=1)
    assert run_batch(cfg, session=lambda _: spark).register_error is None
    # Spark caches a directory's listing until told its files changed.
    query(f"REFRESH TABLE strata.{p.name}")
    after_late = query(every_row)
    assert len(after_late) == len(before) + sum(late.values())
    coordinates = query(f"SELECT _partition, _offset FROM strata.{p.name}")
    assert len(set(coordinates)) == len(coordinates) == len(after_late)
    assert set(p.landed().values()) == {1}

    # Within the grace period vacuum keeps the old files; past it they go, and no query
    # sees a difference.
    swept = vacuum(cfg.places(), cfg.maintenance.vacuum_retention, cfg.metastore)
    assert swept.tables["table"].removed_files == 0
    with run_lock(cfg.places(), "maintenance") as lock:
        swept = sweep_moved(cfg.places(), cfg.metastore, timedelta(0), lock)
    assert swept.removed_files == sum(files_before.values())
    assert all(f.directory != f.partition for f in visible_files(fs, root))
    query(f"REFRESH TABLE strata.{p.name}")
    assert query(every_row) == after_late
    assert set(p.landed().values()) == {1}


def test_pyhive_reads_strata_delta_tables_through_deltas_log(
    make_pipeline, broker, spark, metastore, thriftserver
):
    from deltalake import DeltaTable

    p = make_pipeline(partitions=2, overrides={"metastore": {"uri": metastore.uri}})
    for seed in (1, 2):
        produce_clicks(broker, p.topic, 2, 300, seed=seed, malformed=2)
        assert run_batch(p.cfg(), session=lambda _: spark).register_error is None
    cfg = p.cfg()
    report = compacted(cfg, spark, older_than="0s")
    assert "compacted" in {e.outcome for e in report.partitions if e.table == "table"}
    # The files compaction replaced are still on disk: read as a directory, each row
    # that landed would count twice. Through Delta's log, once.
    table = DeltaTable(cfg.location("table"))
    assert len(table.file_uris()) < sum(1 for _ in filesystem_files(cfg.location("table")))

    cursor = hive.connect("127.0.0.1", port=thriftserver.port, auth="NOSASL").cursor()
    for which, suffix in (("table", ""), ("raw", "_raw"), ("quarantine", "_quarantine")):
        rows = DeltaTable(cfg.location(which)).to_pyarrow_table(columns=["_partition", "_offset"])
        cursor.execute(
            f"SELECT _partition, _offset FROM strata.{p.name}{suffix} ORDER BY _partition, _offset"
        )
        expected = sorted(zip(*(rows.column(c).to_pylist() for c in rows.column_names)))
        assert cursor.fetchall() == [tuple(r) for r in expected], which
    cursor.execute(f"SELECT batch, count(*) FROM strata.{p.name}_ledger GROUP BY batch ORDER BY 1")
    assert cursor.fetchall() == [(1, 2), (2, 2)]
    # Delta's own SQL, through HiveServer2: each batch's commit and the compaction's.
    cursor.execute(f"DESCRIBE HISTORY strata.{p.name}")
    names = [d[0] for d in cursor.description]
    history = [dict(zip(names, row)) for row in cursor.fetchall()]
    # Every version of the log, newest first, as delta-rs lists them.
    assert [h["version"] for h in history] == [h["version"] for h in table.history()]
    assert len(history) == table.version() + 1 >= 3


def filesystem_files(location: str):
    """Every Parquet file under a table's directory, its log aside."""
    from pathlib import Path

    return (f for f in Path(location).rglob("*.parquet") if "_delta_log" not in f.parts)
