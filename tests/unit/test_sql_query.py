"""`strata sql query` without Spark: what it refuses, how it reads Trino SQL, its formats.

The landed tables and the ready queries' answers are checked against the ledger in
tests/integration/test_sql_query.py; here the tables are empty (nothing committed)
or absent, and the statements stand alone.
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
import sqlglot

from strata.catalog.query import (
    QueryAnswer,
    on_pipeline,
    only_query,
    ready_query,
    ready_query_names,
    render_answer,
    run_embedded,
    to_duckdb,
)
from strata.cli import main
from strata.errors import QueryError
from tests.conftest import ROOT


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO strata.clicks SELECT * FROM strata.clicks",
        "DELETE FROM strata.clicks WHERE hr = 1",
        "UPDATE strata.clicks SET page = '/' WHERE hr = 1",
        "CREATE TABLE strata.copy AS SELECT * FROM strata.clicks",
        "DROP TABLE strata.clicks",
        "ALTER TABLE strata.clicks ADD COLUMN x bigint",
        "SET SESSION query_max_run_time = '1m'",
        "CALL delta.system.register_table('strata', 't', 's3://b/t')",
        "SHOW TABLES",
        "EXPLAIN SELECT 1",
        "USE delta.strata",
        "WITH x AS (SELECT 1) INSERT INTO strata.clicks SELECT * FROM x",
        "SELECT 1; DROP TABLE strata.clicks",
        "SELECT 1; SELECT 2",
        "",
        "-- only a comment",
    ],
)
def test_anything_but_one_query_is_refused_before_it_runs(statement):
    with pytest.raises(QueryError) as refused:
        only_query(statement)
    assert refused.value.exit_code == 2
    message = str(refused.value)
    assert "query" in message


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT 1",
        "select dt, count(*) from strata.clicks group by dt;",
        "WITH h AS (SELECT hr FROM strata.clicks) SELECT count(*) FROM h",
        "SELECT 1 UNION ALL SELECT 2",
        "(SELECT 1)",
    ],
)
def test_queries_pass_the_check(statement):
    assert only_query(statement) is not None


def test_the_refusal_names_what_was_given():
    with pytest.raises(QueryError, match="not DELETE statements"):
        only_query("DELETE FROM strata.clicks")
    with pytest.raises(QueryError, match="2 statements"):
        only_query("SELECT 1; SELECT 2")


def test_the_command_refuses_a_write_with_exit_2_and_opens_nothing(tmp_path, monkeypatch, capsys):
    warehouse = tmp_path / "warehouse"
    monkeypatch.setenv("STRATA_WAREHOUSE", str(warehouse))
    argv = ["sql", "query", "--pipeline", "clicks", "--conf-dir", str(ROOT / "conf")]
    assert main([*argv, "-e", "DROP TABLE strata.clicks"]) == 2
    err = capsys.readouterr().err
    assert "not DROP statements" in err
    # Refused before the tables were opened: nothing was made where they would be.
    assert not warehouse.exists()


def test_ready_queries_are_shipped_and_renamed_to_the_pipelines_tables():
    assert {"rows_per_hour", "ledger_ranges", "quarantine_reasons", "late_arrivals"} <= set(
        ready_query_names()
    )
    # The checkout's sql/queries is the same folder as the package's.
    assert sorted(p.stem for p in (ROOT / "sql" / "queries").glob("*.sql")) == ready_query_names()
    tree = on_pipeline(only_query(ready_query("lag_per_partition")), "orders", "lake")
    tables = sorted(t.sql("trino") for t in tree.find_all(sqlglot.exp.Table))
    assert tables == ["lake.orders_ledger"]
    joined = on_pipeline(
        only_query(
            "SELECT * FROM strata.clicks c JOIN strata.clicks_quarantine q ON c._offset = q._offset"
            " JOIN other.clicks o ON true JOIN elsewhere AS e ON true"
        ),
        "orders",
        "lake",
    ).sql("trino")
    assert "lake.orders AS c" in joined and "lake.orders_quarantine AS q" in joined
    # Tables that are not the demo's keep their names.
    assert "other.clicks AS o" in joined and "elsewhere AS e" in joined


def test_unknown_ready_query_names_the_known_ones():
    with pytest.raises(QueryError, match="rows_per_hour") as unknown:
        ready_query("rows_per_day")
    assert unknown.value.exit_code == 2


def test_trino_functions_keep_their_meaning_on_duckdb():
    """Trino's date_diff counts whole units; DuckDB's counts the boundaries crossed."""
    statement = """
        SELECT
          date_diff('hour', from_iso8601_timestamp('2026-01-01T00:59:00Z'),
                    from_iso8601_timestamp('2026-01-01T01:01:00Z')) AS crossed_not_whole,
          date_diff('hour', from_iso8601_timestamp('2026-01-01T00:00:00Z'),
                    from_iso8601_timestamp('2026-01-01T05:30:00+02:00')) AS whole,
          date_trunc('hour', from_iso8601_timestamp('2026-01-01T10:42:07Z')) AS hour,
          regexp_like('/checkout/pay', '^/checkout') AS matched,
          approx_distinct(x) AS distinct_values
        FROM (VALUES 1, 2, 2, 3) AS t (x)
    """
    answer = run_embedded([], "delta", "strata", statement)
    assert answer.columns == ["crossed_not_whole", "whole", "hour", "matched", "distinct_values"]
    assert answer.rows == [(0, 3, datetime(2026, 1, 1, 10, tzinfo=UTC), True, 3)]
    assert "date_sub" in to_duckdb(only_query(statement)).lower()
    # Unnamed columns are named as Trino names them.
    named = run_embedded(
        [], "delta", "strata", "SELECT count(*), max(x) AS m, x FROM (VALUES 1) AS t (x) GROUP BY x"
    )
    assert named.columns == ["_col0", "m", "x"]


def test_joda_time_patterns_format_and_parse_as_in_trino():
    """format_datetime and parse_datetime take Joda-Time patterns; DuckDB's take strftime's."""
    moment = datetime(2026, 1, 4, 15, 4, 5, 678000, tzinfo=UTC)
    pattern = "yyyy-MM-dd''T''HH:mm:ss.SSS EEE EEEE MMM MMMM a h hh d D ''o''''clock'' 100%"
    statement = f"""
        SELECT format_datetime(t, '{pattern}') AS text,
               parse_datetime('{moment:%d/%m/%Y %H:%M:%S}.678', 'dd/MM/yyyy HH:mm:ss.SSS') AS at,
               parse_datetime('{moment:%Y-%m-%d %H}', 'yyyy-MM-dd HH') AS hour
        FROM (VALUES from_iso8601_timestamp('{moment.isoformat()}')) AS v (t)
    """
    answer = run_embedded([], "delta", "strata", statement)
    text = (
        f"{moment:%Y-%m-%dT%H:%M:%S}.{moment.microsecond // 1000:03d} {moment:%a %A %b %B %p} "
        f"{(moment.hour - 1) % 12 + 1} {moment:%I} {moment.day} {moment.timetuple().tm_yday} "
        "o'clock 100%"
    )
    hour = moment.replace(minute=0, second=0, microsecond=0)
    assert answer.rows == [(text, moment, hour)]
    # A letter DuckDB cannot spell is refused, named, before anything runs.
    with pytest.raises(QueryError, match="'kk'") as refused:
        to_duckdb(only_query("SELECT format_datetime(current_timestamp, 'yyyy kk')"))
    assert refused.value.exit_code == 2


def test_the_engine_answers_in_utc_whatever_the_machines_zone(monkeypatch):
    """Trino over Strata's tables answers in UTC, the zone of their partitions."""
    late = datetime(2026, 1, 1, 20, 42, tzinfo=UTC)
    statement = f"""
        SELECT current_timezone() AS zone,
               date_trunc('day', from_iso8601_timestamp('{late.isoformat()}')) AS day,
               hour(from_iso8601_timestamp('{late.isoformat()}')) AS hour,
               from_iso8601_timestamp('{late.replace(tzinfo=None).isoformat()}') AS zoneless
    """
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        # In the machine's zone, that instant is the next day.
        assert late.astimezone().date() != late.date()
        answer = run_embedded([], "delta", "strata", statement)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert answer.rows == [("UTC", late.replace(hour=0, minute=0), late.hour, late)]
    assert answer.rows[0][1].utcoffset() == timedelta(0)


def test_integers_divide_to_an_integer_as_in_trino():
    """Trino truncates an integer quotient (7 / 2 is 3); DuckDB's `/` would give 3.5."""
    statement = """
        SELECT 7 / 2 AS whole, -7 / 2 AS negative, 7 / 2.0 AS fraction,
               sum(x) / count(*) AS integer_mean, avg(x) AS mean
        FROM (VALUES 1, 2) AS t (x)
    """
    answer = run_embedded([], "delta", "strata", statement)
    assert answer.rows == [(math.trunc(7 / 2), math.trunc(-7 / 2), 7 / 2, math.trunc(3 / 2), 3 / 2)]


def test_an_unknown_table_is_the_querys_fault(tmp_path):
    with pytest.raises(QueryError, match="nowhere") as refused:
        run_embedded([], "delta", "strata", "SELECT * FROM strata.nowhere")
    assert refused.value.exit_code == 2


def test_the_engine_reads_no_file_of_its_own(tmp_path):
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    with pytest.raises(QueryError):
        run_embedded([], "delta", "strata", f"SELECT * FROM read_csv('{secret}')")


def test_tables_nothing_was_committed_to_are_there_empty_with_their_columns(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("STRATA_WAREHOUSE", str(tmp_path / "warehouse"))
    argv = ["sql", "query", "--pipeline", "clicks", "--conf-dir", str(ROOT / "conf")]
    statement = (
        "SELECT (SELECT count(*) FROM strata.clicks) AS data_rows,"
        " (SELECT count(*) FROM strata.clicks_raw) AS raw_rows,"
        " (SELECT count(*) FROM strata.clicks_quarantine WHERE reason <> '') AS quarantined,"
        " (SELECT count(*) FROM strata.clicks_ledger WHERE end_offset > 0) AS ledger_rows,"
        " (SELECT count(*) FROM delta.strata.clicks_quality WHERE success) AS checks"
    )
    assert main([*argv, "-e", statement, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"data_rows": 0, "raw_rows": 0, "quarantined": 0, "ledger_rows": 0, "checks": 0}
    ]
    for name in ready_query_names():
        assert main([*argv, name, "--format", "csv"]) == 0, name
        header = capsys.readouterr().out.splitlines()
        assert len(header) == 1 and header[0], name


def test_sql_ddl_takes_no_query_arguments(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["sql", "ddl", "--pipeline", "clicks", "-e", "SELECT 1"])
    assert stopped.value.code == 2
    assert "for `sql query`" in capsys.readouterr().err


ANSWER = QueryAnswer(
    ["dt", "hr", "row_count", "newest", "share", "key", "note"],
    [
        (date(2026, 3, 29), 1, 16673, datetime(2026, 3, 29, 1, 59, 59, 999000, tzinfo=UTC),
         Decimal("0.25"), b"\x01\xff", "a, \"quoted\" note"),
        (date(2026, 3, 29), 10, 7, None, Decimal(12), None, None),
    ],
)  # fmt: skip


def test_the_table_format_aligns_columns_under_a_header():
    lines = render_answer(ANSWER, "table").splitlines()
    assert lines[0].split("|")[2].strip() == "row_count"
    assert set(lines[1]) == {"-", "+"}
    assert lines[-1] == "(2 rows)"
    # Every row's separators stand where the header's do.
    bars = [i for i, c in enumerate(lines[0]) if c == "|"]
    assert all([i for i, c in enumerate(line) if c == "|"] == bars for line in lines[2:4])
    assert [i for i, c in enumerate(lines[1]) if c == "+"] == bars
    # Numbers to the right, text to the left, NULL shown as such.
    first, second = lines[2].split("|"), lines[3].split("|")
    assert first[2].endswith("16673 ") and second[2].endswith("7 ")
    assert first[1] == "  1 " and second[1] == " 10 "
    assert "NULL" in second[3]
    assert "2026-03-29T01:59:59.999000+00:00" in lines[2]
    assert render_answer(QueryAnswer(["x"], []), "table").splitlines()[-1] == "(0 rows)"


def test_the_csv_format_has_a_header_and_quotes_what_needs_it():
    text = render_answer(ANSWER, "csv")
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ANSWER.columns
    assert rows[1] == [
        "2026-03-29",
        "1",
        "16673",
        "2026-03-29T01:59:59.999000+00:00",
        "0.25",
        "01ff",
        'a, "quoted" note',
    ]
    assert rows[2] == ["2026-03-29", "10", "7", "", "12", "", ""]


def test_the_json_format_is_a_list_of_objects_with_iso_timestamps():
    records = json.loads(render_answer(ANSWER, "json"))
    assert records == [
        {
            "dt": "2026-03-29",
            "hr": 1,
            "row_count": 16673,
            "newest": "2026-03-29T01:59:59.999000+00:00",
            "share": "0.25",
            "key": "Af8=",
            "note": 'a, "quoted" note',
        },
        {
            "dt": "2026-03-29",
            "hr": 10,
            "row_count": 7,
            "newest": None,
            "share": 12,
            "key": None,
            "note": None,
        },
    ]
    assert datetime.fromisoformat(records[0]["newest"]).tzinfo is not None
    assert json.loads(render_answer(QueryAnswer(["x"], []), "json")) == []


def test_with_trino_url_the_statement_goes_to_trino_as_written(tmp_path, capsys):
    import yaml

    from tests.fake_trino import FakeTrino, self_signed_certificate

    tls = self_signed_certificate(tmp_path)
    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    body = yaml.safe_load((ROOT / "conf" / "pipelines" / "clicks.yaml").read_text())
    body["schemas_dir"] = str(ROOT / "schemas")
    body["warehouse"] = str(tmp_path / "warehouse")
    statement = (
        "SELECT count(*) AS n, page FROM strata.clicks WHERE regexp_like(page, '^/') GROUP BY page"
    )
    with FakeTrino(tls) as fake:
        body["trino"] = {
            "url": fake.url,
            "user": "analyst",
            "password": "trino-pw-Zk3",
            "ca_file": str(tls[0]),
        }
        (conf / "pipelines" / "clicks.yaml").write_text(yaml.safe_dump(body))
        argv = ["sql", "query", "--pipeline", "clicks", "--conf-dir", str(conf)]
        assert main([*argv, "-e", statement, "--format", "json", "--json"]) == 0
        out = capsys.readouterr()
        assert main([*argv, "-e", "DELETE FROM strata.clicks"]) == 2
        refused = capsys.readouterr()
        # A ready query goes renamed for the pipeline, in Trino's own dialect.
        assert main([*argv, "rows_per_hour"]) == 0
        capsys.readouterr()
    lines = out.out.splitlines()
    assert json.loads("\n".join(lines[:-1])) == [
        {"n": 3, "page": "/home"},
        {"n": 1, "page": "/cart"},
    ]
    assert json.loads(lines[-1])["engine"] == "trino"
    assert [s for _, s in fake.statements][0] == statement
    assert fake.sessions[0] == ("delta", "strata")
    assert "trino-pw-Zk3" not in out.out + out.err + refused.err
    # The refused statement never reached Trino.
    assert len(fake.requests) == 2
    assert "FROM strata.clicks" in fake.requests[1][2] and "count(" in fake.requests[1][2].lower()
    assert not (tmp_path / "warehouse").exists()


def test_a_routed_pipelines_tables_are_all_there_each_under_its_own_names(tmp_path, capsys):
    import yaml

    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    body = {
        "topics": ["orders", "views"],
        "routing": {"table": "{topic}"},
        "schema_file": "clicks.avsc",
        "schemas_dir": str(ROOT / "schemas"),
        "event_time": {"field": "ts"},
        "warehouse": str(tmp_path / "warehouse"),
        "metastore": {"database": "lake"},
    }
    (conf / "pipelines" / "events.yaml").write_text(yaml.safe_dump(body))

    def query(pipeline: str, *args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(["sql", "query", "--pipeline", pipeline, "--conf-dir", str(conf), *args])
        out = capsys.readouterr()
        return code, out.out, out.err

    names = [f"{t}{s}" for t in ("orders", "views") for s in ("", "_raw", "_quarantine")]
    names += ["orders_ledger", "views_ledger", "orders_quality", "views_quality"]
    statement = "SELECT " + ", ".join(f"(SELECT count(*) FROM lake.{n}) AS {n}" for n in names)
    code, out, err = query("events", "-e", statement, "--format", "json")
    assert code == 0, err
    assert json.loads(out) == [{n: 0 for n in names}]
    # A ready query reads one table's tables: it names which.
    code, out, err = query("events", "rows_per_hour")
    assert code == 2 and "--pipeline events:TABLE" in err
    code, out, err = query("events:views", "rows_per_hour", "--format", "csv")
    assert (code, out) == (0, "dt,hr,row_count\n"), err
