"""What a HiveServer2/Presto-style client sees: the Spark Thrift Server on the same metastore.

And the same Trino statements answered alike by `strata sql query`'s embedded engine.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from datetime import UTC, datetime, timedelta, timezone
from functools import partial

from pyhive import hive
from sqlglot import exp

from strata.catalog._answers import json_value
from strata.catalog.metastore import MetastoreClient
from strata.catalog.query import on_pipeline, only_query, ready_query
from strata.catalog.register import location_uri, register_tables
from strata.edge import answer_query, registration
from strata.local.events import HOUR_MS
from strata.maintenance.compact import Compaction, compact
from strata.maintenance.vacuum import sweep_moved, vacuum
from strata.run import run_batch
from strata.store.files import filesystem
from strata.store.ledger import read_ledger
from strata.store.locations import current_files, current_locations, visible_files
from strata.store.lock import run_lock
from strata.store.parquet import partition_path
from tests.conftest import START_MS, produce_clicks


def spark_sql(name: str, pipeline: str) -> str:
    """A ready query, renamed for this pipeline's tables, in Spark's dialect."""
    return on_pipeline(only_query(ready_query(name)), pipeline, "strata").sql("spark")


def trino_to_spark(statement: str) -> str:
    """A Trino statement in Spark's dialect, as sqlglot writes it.

    But for `format_datetime`, which sqlglot leaves as it is and Spark lacks: Spark's
    `date_format` takes the same pattern letters (java.time's, Joda-Time's for those
    the tests use).
    """

    def spark_name(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Anonymous) and node.name.lower() == "format_datetime":
            return exp.Anonymous(this="date_format", expressions=node.expressions)
        return node

    return only_query(statement).transform(spark_name).sql("spark")


def _iso(ms: int, hours: float) -> str:
    """An instant in ISO-8601, written with an offset of some hours from UTC."""
    return datetime.fromtimestamp(ms / 1000, timezone(timedelta(hours=hours))).isoformat()


def _same_answers_embedded_and_in_spark(cfg, cursor, pipeline: str) -> None:
    """Trino statements with functions DuckDB spells differently answer alike in both.

    Each runs as `strata sql query` runs it embedded (DuckDB) and, transpiled to
    Spark's dialect by sqlglot, in the Thrift Server. Both sessions are in UTC, the
    zone of Strata's partitions and of Trino reading them. The rows are compared as
    the command's JSON writes them, sorted.
    """
    cursor.execute("SET spark.sql.session.timeZone")
    # The server's own setting (`LocalThriftServer`), not the machine's zone.
    assert cursor.fetchall()[0][1] == "UTC"

    def in_spark(statement: str) -> tuple[list[str], list[tuple]]:
        cursor.execute(trino_to_spark(statement))
        names = [d[0] for d in cursor.description]
        # pyhive gives timestamps as naive datetimes, in the session's zone (UTC).
        rows = [
            tuple(json_value(v.replace(tzinfo=UTC) if isinstance(v, datetime) else v) for v in row)
            for row in cursor.fetchall()
        ]
        return names, sorted(rows, key=repr)

    def embedded(statement: str) -> tuple[list[str], list[tuple]]:
        text, body = answer_query(cfg, None, None, statement, "json", engine="embedded")
        assert body["engine"] == "embedded"
        rows = [tuple(r.values()) for r in json.loads(text)]
        return body["columns"], sorted(rows, key=repr)

    table, ledger = f"strata.{pipeline}", f"strata.{pipeline}_ledger"
    third_hour = START_MS + 2 * HOUR_MS
    # Both engines in the zone of Strata's partitions.
    assert embedded("SELECT current_timezone() AS zone") == in_spark(
        "SELECT current_timezone() AS zone"
    )
    assert in_spark("SELECT current_timezone() AS zone")[1] == [("UTC",)]

    # Event hours from the third on, the bound written at +05:30: a zone's half hour
    # must not move it. approx_distinct is compared three ways (see below).
    per_hour = f"""
        SELECT date_trunc('hour', _event_time) AS hour,
               approx_distinct(device) AS devices,
               approx_distinct(country) AS countries,
               approx_distinct(user_id) AS users,
               count(DISTINCT user_id) AS distinct_users,
               count_if(regexp_like(page, '^/products/[0-9]+$')) AS product_views,
               count(*) AS n
        FROM {table}
        WHERE _event_time >= from_iso8601_timestamp('{_iso(third_hour, 5.5)}')
        GROUP BY 1
    """
    columns, ours = embedded(per_hour)
    spark_columns, theirs = in_spark(per_hour)
    assert columns == spark_columns
    assert len(ours) == 4 and all(row[columns.index("product_views")] > 0 for row in ours)
    users = columns.index("users")
    exact = [row[:users] + row[users + 1 :] for row in ours]
    # A handful of devices and countries: an approximate count is exact in both.
    assert exact == [row[:users] + row[users + 1 :] for row in theirs]
    # Hundreds of users an hour: the embedded count is exact (Trino's is within 2.3%),
    # Spark's within its documented relative standard deviation, 5% (three of them).
    assert [row[users] for row in ours] == [row[users + 1] for row in theirs]
    assert all(
        abs(spark[users] - row[users]) <= 3 * 0.05 * row[users]
        for row, spark in zip(ours, theirs, strict=True)
    )

    statements = {
        "pages": f"""
            SELECT page,
                   cardinality(split(page, '/')) AS parts,
                   element_at(split(page, '/'), -1) AS last_part,
                   split(page, '/')[2] AS section,
                   regexp_like(page, '^/(cart|checkout)$') AS buying,
                   count(*) AS n
            FROM {table}
            GROUP BY 1, 2, 3, 4, 5
        """,
        "formatted": f"""
            SELECT date_format(_event_time, '%Y-%m-%d %H:%i') AS minute,
                   format_datetime(_event_time, 'yyyy-MM-dd''T''HH EEE') AS hour_text,
                   hour(_event_time) AS hour_of_day,
                   date(_event_time) AS day,
                   count(*) AS n
            FROM {table}
            WHERE _kafka_ts < from_iso8601_timestamp('{_iso(START_MS + 5 * HOUR_MS, -3)}')
              AND regexp_like(page, 'c')
            GROUP BY 1, 2, 3, 4
        """,
        "ledger": f"""
            SELECT batch,
                   date_trunc('hour', committed_at) AS committed_hour,
                   format_datetime(committed_at, 'yyyy-MM-dd HH:mm:ss.SSS') AS committed,
                   approx_distinct("partition") AS partitions,
                   sum("rows") AS "rows",
                   min(min_event_time) >= from_iso8601_timestamp('{_iso(third_hour, 1)}') AS later
            FROM {ledger}
            GROUP BY 1, 2, 3
        """,
    }
    for name, statement in statements.items():
        answer = embedded(statement)
        assert answer == in_spark(statement), name
        assert len(answer[1]) >= 2, name


def test_the_thrift_server_sees_what_the_ledger_says_and_sql_query_answers_alike(
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

    # On the same tables, `strata sql query` answers what the Thrift Server does.
    _same_answers_embedded_and_in_spark(p.cfg(), cursor, p.name)


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
