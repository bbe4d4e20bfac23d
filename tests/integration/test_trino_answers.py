"""Trino reads what Strata writes: registration, and the same answers as the embedded engine.

Against the session's real Trino (`trino`: catalogs `delta`, `hive` and `iceberg` on the
session's metastore, and `*_elsewhere` on a metastore of Trino's own), one pipeline per
table format. A pipeline's tables are read in Trino after a run registered them, the
statements `strata sql ddl` prints run there, and every ready query and a set of analyst
queries answer through `strata sql query --trino` what `--embedded` answers, compared
row by row, but for `approx_distinct`, an estimate, compared within its error.
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from strata.catalog.query import ready_query_names, table_catalogs
from strata.cli import main
from strata.config import TrinoConfig
from strata.local.events import HOUR_MS
from strata.local.trino import LocalTrino
from strata.maintenance.vacuum import vacuum
from strata.quality.run import run_quality
from strata.run import reprocess, run_batch
from strata.store.places import Role
from strata.store.ranges import OffsetRange
from tests.conftest import START_MS, produce_clicks
from tests.maintenance_runs import compacted
from tests.trino_reads import registering_settings, strata_counts, trino_counts

FORMATS = ["delta", "parquet", "iceberg"]

# Trino's approx_distinct: HyperLogLog with a standard error of 2.3%. Three of them.
APPROX_BOUND = 3 * 0.023


def _pipeline(make_pipeline, metastore, trino: LocalTrino, table_format: str, **trino_settings):
    database = f"t{table_format[:3]}_{uuid.uuid4().hex[:6]}"
    overrides = {
        "table_format": table_format,
        "metastore": {"uri": metastore.uri, "database": database},
        "trino": {"url": trino.url, **trino_settings},
    }
    return make_pipeline(partitions=2, overrides=overrides), database


def _land(p, broker, spark, *, seed: int = 1, start_ms: int = START_MS) -> None:
    """A batch over three event hours, with late events and poison messages; registered,
    and Trino told (`trino.url`)."""
    produce_clicks(broker, p.topic, 2, 400, seed=seed, start_ms=start_ms, late=3, malformed=3)
    outcome = run_batch(p.cfg(), session=lambda _: spark)
    assert outcome.register_error is None, outcome.register_error


def _statements(script: str) -> list[str]:
    """The statements of a script as `strata sql ddl` prints it, without its comments."""
    out = []
    for paragraph in script.split(";\n"):
        kept = [line for line in paragraph.splitlines() if not line.startswith("--")]
        if "\n".join(kept).strip():
            out.append("\n".join(kept).strip())
    return out


def _ddl(p, capsys) -> str:
    capsys.readouterr()
    assert main(["sql", "ddl", "--pipeline", p.name, "--conf-dir", str(p.conf_dir)]) == 0
    return capsys.readouterr().out


def _catalog(table_format: str, which: Role) -> str:
    """The Trino catalog a table is in, on the local Trino's defaults."""
    return table_catalogs(table_format, TrinoConfig().catalog_for)[which]


@pytest.mark.parametrize("table_format", FORMATS)
def test_every_table_reads_in_trino_after_a_run_and_what_sql_ddl_prints_runs_there(
    table_format, trino, make_pipeline, broker, metastore, spark, capsys
):
    p, database = _pipeline(make_pipeline, metastore, trino, table_format)
    _land(p, broker, spark)
    cfg = p.cfg()
    assert (
        run_quality(cfg.places(), cfg.quality, cfg.schemas(), cfg.metastore, cfg.warehouse).batch
        == 1
    )
    # A second batch: a run tells Trino again (a plain Parquet table's new partitions
    # synchronised), which skips what it found there already.
    _land(p, broker, spark, seed=2, start_ms=START_MS + 3 * HOUR_MS)
    counts = strata_counts(cfg)
    assert all(counts.values()), counts

    def in_trino(elsewhere: bool = False) -> dict[str, int]:
        settings = TrinoConfig(**registering_settings("delta")) if elsewhere else TrinoConfig()
        return trino_counts(trino, cfg, settings=settings)

    # The metastore's entries, as the runs and the quality check left them: no statement.
    assert in_trino() == counts

    # What `strata sql ddl` prints runs on the default setup (the same metastore): the
    # register_table calls, refused there as registered already, are comments.
    script = _ddl(p, capsys)
    for statement in _statements(script):
        trino.query(statement)
    if table_format != "parquet":
        assert "-- CALL" in script and "register_table" not in "".join(_statements(script))
    assert in_trino() == counts

    # Trino's catalogs on another metastore: the calls print to run, and run there (a
    # plain Parquet pipeline's tables are created in the Hive catalog there).
    settings = registering_settings("delta")
    path = p.conf_dir / "pipelines" / f"{p.name}.yaml"
    path.write_text(
        yaml.safe_dump(
            {**yaml.safe_load(path.read_text()), "trino": {"url": trino.url, **settings}}
        )
    )
    elsewhere = _statements(_ddl(p, capsys))
    registered = [s for s in elsewhere if "register_table" in s]
    assert len(registered) == (0 if table_format == "parquet" else 5)
    for statement in elsewhere:
        trino.query(statement)
    # Run again, a run's own statements: each is there already, and skipped.
    again = p.cli("register", "--json")
    assert again.returncode == 0, again.stderr[-3000:]
    assert in_trino(elsewhere=True) == counts


def _query(p, capsys, engine: str, *args: str) -> list[dict]:
    capsys.readouterr()
    argv = ["sql", "query", "--pipeline", p.name, "--conf-dir", str(p.conf_dir)]
    code = main([*argv, f"--{engine}", "--format", "json", *args])
    out = capsys.readouterr()
    assert code == 0, f"{engine}: {out.err}"
    return json.loads(out.out)


def _refused(p, capsys, engine: str, statement: str) -> str:
    capsys.readouterr()
    argv = ["sql", "query", "--pipeline", p.name, "--conf-dir", str(p.conf_dir)]
    assert main([*argv, f"--{engine}", "-e", statement]) == 2
    return capsys.readouterr().err


def _iso(ms: int, hours: float) -> str:
    """An instant in ISO-8601, written with an offset of some hours from UTC."""
    return datetime.fromtimestamp(ms / 1000, timezone(timedelta(hours=hours))).isoformat()


def _analyst_queries(name: str, ledger: str) -> dict[str, str]:
    """Queries an analyst writes, with the Trino functions the embedded engine translates.

    Args:
        name: The data table, in the session's catalog and schema.
        ledger: The ledger, named in its own catalog (an Iceberg pipeline's is Delta).
    """
    since = datetime.fromtimestamp((START_MS + HOUR_MS) / 1000, UTC).isoformat()
    day = datetime.fromtimestamp(START_MS / 1000, UTC).date().isoformat()
    return {
        "date_trunc, regexp_like, from_iso8601_timestamp": f"""
            SELECT date_trunc('hour', _event_time) AS hour,
                   count_if(regexp_like(page, '^/c')) AS c_pages,
                   count(*) AS n
            FROM {name}
            WHERE _kafka_ts >= from_iso8601_timestamp('{since}')
            GROUP BY 1 ORDER BY 1""",
        "date_diff and integer division": f"""
            SELECT date_diff('minute', _event_time, _kafka_ts) / 60 AS hours_late,
                   count(*) AS n
            FROM {name} GROUP BY 1 ORDER BY 1""",
        "format_datetime": f"""
            SELECT format_datetime(_event_time, 'yyyy-MM-dd HH:00') AS hour, count(*) AS n
            FROM {name} GROUP BY 1 ORDER BY 1""",
        "integer division of a column": f"""
            SELECT latency_ms / 100 * 100 AS bucket, count(*) AS n
            FROM {name} GROUP BY 1 ORDER BY 1 NULLS FIRST""",
        "partition filter, as strings": f"""
            SELECT hr, count(*) AS n FROM {name}
            WHERE dt = '{day}' AND hr >= '11' GROUP BY hr ORDER BY hr""",
        "partition filter, cast": f"""
            SELECT count(*) AS n FROM {name}
            WHERE CAST(dt AS date) = DATE '{day}' AND CAST(hr AS integer) = 10""",
        "an instant written at +05:30, approx_distinct of few values": f"""
            SELECT date_trunc('hour', _event_time) AS hour,
                   approx_distinct(device) AS devices,
                   count(DISTINCT user_id) AS distinct_users,
                   count_if(regexp_like(page, '^/products/[0-9]+$')) AS product_views,
                   count(*) AS n
            FROM {name}
            WHERE _event_time >= from_iso8601_timestamp('{_iso(START_MS + HOUR_MS, 5.5)}')
            GROUP BY 1 ORDER BY 1""",
        "split, element_at, cardinality": f"""
            SELECT page,
                   cardinality(split(page, '/')) AS parts,
                   element_at(split(page, '/'), -1) AS last_part,
                   split(page, '/')[2] AS section,
                   regexp_like(page, '^/(cart|checkout)$') AS buying,
                   count(*) AS n
            FROM {name}
            GROUP BY 1, 2, 3, 4, 5 ORDER BY 1""",
        "date_format, format_datetime, hour, date": f"""
            SELECT date_format(_event_time, '%Y-%m-%d %H:%i') AS minute,
                   format_datetime(_event_time, 'yyyy-MM-dd''T''HH EEE') AS hour_text,
                   hour(_event_time) AS hour_of_day,
                   date(_event_time) AS day,
                   count(*) AS n
            FROM {name}
            WHERE _kafka_ts < from_iso8601_timestamp('{_iso(START_MS + 5 * HOUR_MS, -3)}')
              AND regexp_like(page, 'c')
            GROUP BY 1, 2, 3, 4 ORDER BY 1, 2""",
        "the ledger's timestamps, formatted": f"""
            SELECT batch,
                   date_trunc('hour', committed_at) AS committed_hour,
                   format_datetime(committed_at, 'yyyy-MM-dd HH:mm:ss.SSS') AS committed,
                   approx_distinct("partition") AS partitions,
                   sum("rows") AS "rows"
            FROM {ledger}
            GROUP BY 1, 2, 3 ORDER BY 1""",
        "timestamps of the ledger": f"""
            SELECT batch, max(committed_at) AS at, min(_event_time) AS first
            FROM {ledger} CROSS JOIN (SELECT min(_event_time) AS _event_time FROM {name})
            GROUP BY batch ORDER BY batch""",
    }


def _same_answers(p, database: str, capsys, stage: str) -> dict[str, object]:
    """Every ready query and analyst query, in both engines: their answers, equal."""
    table = {}
    for name in ready_query_names():
        embedded = _query(p, capsys, "embedded", name)
        assert embedded, f"{stage}: {name} answered nothing"
        assert _query(p, capsys, "trino", name) == embedded, f"{stage}: {name}"
        table[name] = len(embedded)
    ledger = f"{_catalog(p.cfg().table_format, 'ledger')}.{database}.{p.name}_ledger"
    for case, statement in _analyst_queries(p.name, ledger).items():
        embedded = _query(p, capsys, "embedded", "-e", statement)
        assert embedded, f"{stage}: {case} answered nothing"
        assert _query(p, capsys, "trino", "-e", statement) == embedded, f"{stage}: {case}"
        table[case] = len(embedded)
    estimate = (
        f"SELECT approx_distinct(user_id) AS users, count(DISTINCT user_id) AS exact FROM {p.name}"
    )
    [embedded] = _query(p, capsys, "embedded", "-e", estimate)
    [in_trino] = _query(p, capsys, "trino", "-e", estimate)
    assert embedded["exact"] == in_trino["exact"] > 0
    off = abs(in_trino["users"] - embedded["users"]) / in_trino["exact"]
    assert off <= APPROX_BOUND, (stage, embedded, in_trino)
    table["approx_distinct"] = (embedded["users"], in_trino["users"], in_trino["exact"])
    return table


@pytest.mark.parametrize("table_format", FORMATS)
def test_trino_answers_what_the_embedded_engine_answers_after_each_kind_of_write(
    table_format, trino, make_pipeline, broker, metastore, spark, capsys
):
    p, database = _pipeline(make_pipeline, metastore, trino, table_format)
    # Without `country` at first: it is added later, and earlier rows read it as null.
    schema_path = Path(p.cfg().schema_path)
    avro = json.loads(schema_path.read_text())
    country = next(f for f in avro["fields"] if f["name"] == "country")
    avro["fields"].remove(country)
    schema_path.write_text(json.dumps(avro))
    for seed in range(2):
        _land(p, broker, spark, seed=seed + 1)
    answers = {"ingest": _same_answers(p, database, capsys, "ingest")}

    cfg = p.cfg()
    report = compacted(cfg, spark, older_than="0s")
    assert "compacted" in {e.outcome for e in report.partitions if e.table == "table"}
    answers["compaction"] = _same_answers(p, database, capsys, "compaction")
    vacuum(cfg.places(), "0s", cfg.metastore)
    answers["vacuum"] = _same_answers(p, database, capsys, "vacuum")
    # A backfill from Kafka and a replay from the raw copy each replace their range
    # (plain Parquet tables are not backfilled: their commit cannot replace rows).
    rewrites = (("backfill", (20, 120)), ("replay", (60, 160)))
    for kind, offsets in rewrites if table_format != "parquet" else ():
        done = reprocess(
            p.cfg(), kind, [OffsetRange(p.topic, 0, *offsets)], "fix", session=lambda _: spark
        )
        assert done.status == ("backfilled" if kind == "backfill" else "replayed")
        assert done.register_error is None
        answers[kind] = _same_answers(p, database, capsys, kind)

    # A comparison Trino refuses (a string set against a date) is refused by both.
    day = datetime.fromtimestamp(START_MS / 1000, UTC).date().isoformat()
    typed = f"SELECT count(*) FROM {p.name} WHERE dt = DATE '{day}'"
    assert "varchar = date" in _refused(p, capsys, "trino", typed)
    assert "varchar = date" in _refused(p, capsys, "embedded", typed)
    # The table of answers, for a reader of the log (rows per query, the estimates).
    logging.getLogger(__name__).info("%s: %s", table_format, json.dumps(answers, default=str))
    # A schema change: a new optional column, null in the files written before it.
    avro["fields"].append({**country, "default": None})
    schema_path.write_text(json.dumps(avro))
    _land(p, broker, spark, seed=3, start_ms=START_MS + 3 * HOUR_MS)
    answers["schema change"] = _same_answers(p, database, capsys, "schema change")
    by_batch = f"""
        SELECT _batch, count(*) AS n, count(country) AS with_country,
               count_if(country IS NULL) AS without
        FROM {p.name} GROUP BY _batch ORDER BY _batch"""
    embedded = _query(p, capsys, "embedded", "-e", by_batch)
    assert _query(p, capsys, "trino", "-e", by_batch) == embedded
    assert [r["with_country"] > 0 for r in embedded] == [False] * (len(embedded) - 1) + [True]
    assert answers["ingest"].keys() == answers["schema change"].keys()
    logging.getLogger(__name__).info("%s: %s", table_format, json.dumps(answers, default=str))


@pytest.mark.parametrize("table_format", FORMATS)
def test_a_filter_on_dt_and_hr_prunes_partitions_in_trinos_plan(
    table_format, trino, make_pipeline, broker, metastore, spark
):
    p, database = _pipeline(make_pipeline, metastore, trino, table_format)
    _land(p, broker, spark)
    day = datetime.fromtimestamp(START_MS / 1000, UTC).date().isoformat()
    name = f'{_catalog(table_format, "table")}."{database}"."{p.name}"'
    where = f"WHERE dt = '{day}' AND hr = '11'"
    [(text,)] = trino.query(f"EXPLAIN SELECT count(*) FROM {name} {where}")
    [(io,)] = trino.query(f"EXPLAIN (TYPE IO, FORMAT JSON) SELECT count(*) FROM {name} {where}")
    logging.getLogger(__name__).info("%s:\n%s\n%s", table_format, text, io)
    [read] = json.loads(io)["inputTableColumnInfos"]
    constraints = {c["columnName"]: c["domain"] for c in read["constraint"]["columnConstraints"]}
    assert constraints.keys() == {"dt", "hr"}
    assert [r["low"]["value"] for r in constraints["dt"]["ranges"]] == [day]
    assert [r["low"]["value"] for r in constraints["hr"]["ranges"]] == ["11"]
    # Read through the pruned plan, the rows of that one hour.
    [(n,)] = trino.query(f"SELECT count(*) FROM {name} {where}")
    data = p.table_rows("table", ["dt", "hr"]).to_pylist()
    assert n == sum(1 for r in data if str(r["dt"]) == day and int(r["hr"]) == 11) > 0
