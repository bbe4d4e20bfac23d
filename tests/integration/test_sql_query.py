"""`strata sql query` on landed tables: every ready query answers what the tables hold.

Each answer is compared with what the test computes itself from the tables (read with
deltalake and pyarrow, as `Pipeline.table_rows` reads them) and the ledger
(`read_ledger`), never with another answer of the command.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import UTC, date, datetime, timedelta

from deltalake import DeltaTable

from strata.catalog.query import ready_query_names
from strata.cli import main
from strata.local.events import HOUR_MS
from strata.run import run_batch
from strata.store.ledger import read_ledger
from tests.conftest import START_MS, produce_clicks
from tests.maintenance_runs import compacted


def _plain(value):
    """A value as the command's JSON writes it."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    return value


def _as_trino_reads(at: datetime) -> str:
    """A Delta table's timestamp as Trino's Delta Lake connector reads it, and so the
    embedded engine: at milliseconds, rounded half up."""
    millis = (at.microsecond + 500) // 1000
    return (at.replace(microsecond=0) + timedelta(milliseconds=millis)).isoformat()


def _querying(p, capsys):
    """`strata sql query --format json` on the pipeline, answering the parsed rows."""

    def query(*args: str) -> list[dict]:
        capsys.readouterr()
        argv = ["sql", "query", "--pipeline", p.name, "--conf-dir", str(p.conf_dir)]
        code = main([*argv, "--format", "json", *args])
        out = capsys.readouterr()
        assert code == 0, out.err
        return json.loads(out.out)

    return query


def _land(p, broker, spark) -> None:
    """Two batches over six event hours, with late events and poison messages."""
    produce_clicks(broker, p.topic, 2, 700, hours=4, late=5, malformed=4)
    assert run_batch(p.cfg(), session=lambda _: spark).register_error is None
    produce_clicks(
        broker, p.topic, 2, 300, seed=2, start_ms=START_MS + 4 * HOUR_MS, hours=2, late=2,
        malformed=3,
    )  # fmt: skip
    assert run_batch(p.cfg(), session=lambda _: spark).register_error is None


def test_every_ready_query_answers_what_the_tables_and_the_ledger_hold(
    make_pipeline, broker, spark, capsys
):
    p = make_pipeline(partitions=2)
    _land(p, broker, spark)
    query = _querying(p, capsys)
    ledger = read_ledger(p.cfg().places()).to_pylist()
    assert sorted({r["batch"] for r in ledger}) == [1, 2]
    data = p.table_rows(
        "table", ["dt", "hr", "_event_time", "_kafka_ts", "_batch", "user_id", "page"]
    ).to_pylist()
    quarantine = p.table_rows("quarantine", ["reason", "_batch"]).to_pylist()
    assert len(data) == sum(r["rows"] for r in ledger) > 0
    assert len(quarantine) == sum(r["quarantined"] for r in ledger) == 7
    answered = set()

    # rows_per_hour, and the same by hand.
    per_hour = Counter((r["dt"], r["hr"]) for r in data)
    assert len(per_hour) == 6
    expected = [
        {"dt": _plain(dt), "hr": hr, "row_count": n}
        for (dt, hr), n in sorted(per_hour.items(), reverse=True)
    ]
    assert query("rows_per_hour") == expected
    answered.add("rows_per_hour")
    by_hand = query("-e", f"SELECT dt, hr, count(*) AS n FROM strata.{p.name} GROUP BY dt, hr")
    assert Counter({(r["dt"], r["hr"]): r["n"] for r in by_hand}) == Counter(
        {(_plain(dt), hr): n for (dt, hr), n in per_hour.items()}
    )
    # Named alone, a table is the pipeline's database's, as in a Trino session on it.
    alone = query("-e", f"SELECT dt, hr, count(*) AS n FROM {p.name} GROUP BY dt, hr")
    assert sorted(map(str, alone)) == sorted(map(str, by_hand))

    # freshness_per_partition
    fresh: dict[tuple, list[dict]] = {}
    for r in data:
        fresh.setdefault((r["dt"], r["hr"]), []).append(r)
    assert query("freshness_per_partition") == [
        {
            "dt": _plain(dt),
            "hr": hr,
            "newest_event": max(r["_event_time"] for r in rows).isoformat(),
            "last_arrival": max(r["_kafka_ts"] for r in rows).isoformat(),
            "last_batch": max(r["_batch"] for r in rows),
            "row_count": len(rows),
        }
        for (dt, hr), rows in sorted(fresh.items(), reverse=True)
    ]
    answered.add("freshness_per_partition")

    # late_arrivals: Trino's date_diff counts whole hours elapsed.
    def lateness(r: dict) -> int:
        whole = int((r["_kafka_ts"] - r["_event_time"]) / timedelta(hours=1))
        return min(max(whole, 0), 48)

    late = Counter(lateness(r) for r in data)
    assert query("late_arrivals") == [
        {"lateness_hours": h, "row_count": n} for h, n in sorted(late.items())
    ]
    assert sum(n for h, n in late.items() if h >= 3) == 7  # the late events, 3 to 30 hours
    answered.add("late_arrivals")

    # quarantine_reasons
    reasons: dict[str, list[int]] = {}
    for r in quarantine:
        reasons.setdefault(r["reason"], []).append(r["_batch"])
    assert query("quarantine_reasons") == [
        {"reason": reason, "messages": len(b), "first_batch": min(b), "last_batch": max(b)}
        for reason, b in sorted(reasons.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    ]
    answered.add("quarantine_reasons")

    # ledger_ranges
    keys = ["batch", "kind", "topic", "partition", "start_offset", "end_offset", "messages"]
    assert query("ledger_ranges") == [
        {
            **{k: r[k] for k in keys},
            "rows": r["rows"],
            "quarantined": r["quarantined"],
            "gaps": r["gaps"],
            "unreconciled": r["end_offset"] - r["start_offset"] - r["rows"] - r["quarantined"]
            - r["gaps"],
            "committed_at": _as_trino_reads(r["committed_at"]),
        }
        for r in sorted(ledger, key=lambda r: (r["batch"], r["topic"], r["partition"]))
    ]  # fmt: skip
    answered.add("ledger_ranges")

    # lag_per_partition: each partition's newest batch.
    newest: dict[tuple, dict] = {}
    for r in ledger:
        key = (r["topic"], r["partition"])
        if key not in newest or r["batch"] > newest[key]["batch"]:
            newest[key] = r
    assert query("lag_per_partition") == [
        {
            "topic": r["topic"],
            "partition": r["partition"],
            "committed_offset": r["end_offset"],
            "high_watermark": r["high_watermark"],
            "lag_at_commit": r["high_watermark"] - r["end_offset"],
            "committed_at": _as_trino_reads(r["committed_at"]),
        }
        for _, r in sorted(newest.items())
    ]
    answered.add("lag_per_partition")
    # A ready query added later must be checked here too.
    assert answered == set(ready_query_names())

    # Trino's functions, as Trino means them.
    since = datetime.fromtimestamp((START_MS + 2 * HOUR_MS) / 1000, UTC)
    trino_sql = f"""
        SELECT date_trunc('hour', _event_time) AS hour,
               approx_distinct(user_id) AS users,
               count_if(regexp_like(page, '^/c')) AS c_pages,
               count(*) AS n
        FROM strata.{p.name}
        WHERE _kafka_ts >= from_iso8601_timestamp('{since.isoformat()}')
        GROUP BY 1
        ORDER BY 1
    """
    hours: dict[datetime, list[dict]] = {}
    for r in data:
        if r["_kafka_ts"] >= since:
            hour = r["_event_time"].replace(minute=0, second=0, microsecond=0)
            hours.setdefault(hour, []).append(r)
    got = query("-e", trino_sql)
    assert [(g["hour"], g["c_pages"], g["n"]) for g in got] == [
        (hour.isoformat(), sum(1 for r in rows if re.search("^/c", r["page"])), len(rows))
        for hour, rows in sorted(hours.items())
    ]
    assert len(got) >= 4 and sum(g["c_pages"] for g in got) > 0
    # approx_distinct: exact here, as Trino's is while the values are few.
    assert [g["users"] for g in got] == [
        len({r["user_id"] for r in rows}) for _, rows in sorted(hours.items())
    ]


def test_a_write_is_refused_with_exit_2_and_changes_nothing(make_pipeline, broker, spark, capsys):
    p = make_pipeline(partitions=2)
    produce_clicks(broker, p.topic, 2, 100, hours=1, malformed=2)
    assert run_batch(p.cfg(), session=lambda _: spark).register_error is None
    table = DeltaTable(p.cfg().location("table"))
    version, rows = table.version(), table.to_pyarrow_table().num_rows
    argv = ["sql", "query", "--pipeline", p.name, "--conf-dir", str(p.conf_dir)]
    for statement in (
        f"DELETE FROM strata.{p.name}",
        f"SELECT count(*) FROM strata.{p.name}; DROP TABLE strata.{p.name}",
        f"INSERT INTO strata.{p.name} SELECT * FROM strata.{p.name}",
    ):
        capsys.readouterr()
        assert main([*argv, "-e", statement]) == 2
        out = capsys.readouterr()
        assert out.out == "" and "strata: error:" in out.err
    again = DeltaTable(p.cfg().location("table"))
    assert (again.version(), again.to_pyarrow_table().num_rows) == (version, rows)
    assert _querying(p, capsys)("-e", f"SELECT count(*) AS n FROM strata.{p.name}") == [{"n": rows}]


def test_plain_parquet_tables_are_read_where_compaction_moved_them(
    make_pipeline, broker, spark, metastore, capsys
):
    # Plain Parquet partitions move only where a metastore points readers at them.
    overrides = {"table_format": "parquet", "metastore": {"uri": metastore.uri}}
    p = make_pipeline(partitions=2, overrides=overrides)
    cfg = p.cfg()
    for seed in range(3):
        produce_clicks(broker, p.topic, 2, 150, seed=seed + 1, hours=2, malformed=1)
        assert run_batch(cfg, session=lambda _: spark).register_error is None
    report = compacted(cfg, spark, older_than="0s")
    assert {e.outcome for e in report.partitions if e.table == "table"} == {"compacted"}
    query = _querying(p, capsys)
    data = p.table_rows("table", ["dt", "hr"]).to_pylist()
    ledger = read_ledger(cfg.places()).to_pylist()
    assert len(data) == sum(r["rows"] for r in ledger)
    per_hour = Counter((r["dt"], r["hr"]) for r in data)
    # The old directories still hold their files: read as a plain directory tree, each
    # row would count twice.
    # The partition values as the table declares them, and Trino reads them: varchar,
    # spelled as the directories are (`hr=07`); pyarrow's reading above guessed numbers.
    assert query("rows_per_hour") == [
        {"dt": _plain(dt), "hr": f"{hr:02d}", "row_count": n}
        for (dt, hr), n in sorted(per_hour.items(), reverse=True)
    ]
    assert sum(
        r["messages"] for r in query("quarantine_reasons")
    ) == sum(r["quarantined"] for r in ledger) == 3  # fmt: skip
    # The Trino catalog of plain Parquet tables is `hive`, the session's: a table named
    # alone is in it.
    assert query("-e", f"SELECT count(*) AS n FROM hive.strata.{p.name}") == [{"n": len(data)}]
    assert query("-e", f"SELECT count(*) AS n FROM {p.name}") == [{"n": len(data)}]
