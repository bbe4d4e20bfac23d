"""`strata sql query` without Spark: what it refuses, how it reads Trino SQL, its formats.

The landed tables and the ready queries' answers are checked against the ledger in
tests/integration/test_sql_query.py; here the tables are empty (nothing committed),
absent, or hold a few rows written with deltalake or pyarrow, and the statements
stand alone: a hostile user's among them, each refused in one short line or answered
from the tables alone.
"""

from __future__ import annotations

import csv
import io
import json
import math
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlglot
from deltalake import write_deltalake

from strata.catalog.query import (
    QueryAnswer,
    _connection,
    on_pipeline,
    only_query,
    query_tables,
    ready_query,
    ready_query_names,
    render_answer,
    run_embedded,
    to_duckdb,
)
from strata.cli import main
from strata.config import load_pipeline
from strata.errors import QueryError
from tests.conftest import ROOT, START_MS, clicks_config

# Statements that are not one query, each refused before anything runs.
NOT_QUERIES = [
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
]


@pytest.mark.parametrize("statement", NOT_QUERIES)
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


PLANTED = "planted-Vq7"
"""What the files planted where DuckDB would read hold: no answer or refusal may show it."""


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A working directory whose `.tmp`, DuckDB's default temporary directory, holds files.

    DuckDB keeps its temporary directory readable with external access off.
    """
    folder = tmp_path / ".tmp"
    folder.mkdir()
    (folder / "planted.txt").write_text(PLANTED)
    (folder / "planted.csv").write_text(f"a\n{PLANTED}\n")
    (folder / "planted.json").write_text(json.dumps({"a": PLANTED}))
    pq.write_table(pa.table({"a": [PLANTED]}), folder / "planted.parquet")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _clicks(n: int) -> list[dict]:
    """Rows of the click pipeline's data table, with every column it requires."""
    at = datetime.fromtimestamp(START_MS / 1000, UTC)
    return [
        {
            "event_id": f"e{i}",
            "user_id": i,
            "page": f"/p{i}",
            "device": "mobile",
            "ts": START_MS + i,
            "_event_time": at + timedelta(milliseconds=i),
            "_topic": "clicks",
            "_partition": 0,
            "_offset": i,
            "_kafka_ts": at,
            "_batch": 1,
            "dt": f"{at:%Y-%m-%d}",
            "hr": f"{at:%H}",
        }
        for i in range(n)
    ]


def _land(cfg, rows: list[dict]) -> None:
    """Rows in the pipeline's data table where it reads them: a Delta commit, or plain
    Parquet files in `dt=/hr=` directories."""
    data = query_tables(cfg.places(), cfg.schemas())[0]
    table = pa.Table.from_pylist(rows, schema=data.schema)
    if data.ref.format == "delta":
        write_deltalake(data.ref.uri, table, partition_by=["dt", "hr"])
    else:
        pq.write_to_dataset(table, data.ref.uri, partition_cols=["dt", "hr"])


@pytest.fixture(scope="module")
def landed(tmp_path_factory):
    """The click pipeline's tables, three rows in its data table (Delta)."""
    cfg = clicks_config(tmp_path_factory.mktemp("warehouse"))
    _land(cfg, _clicks(3))
    return query_tables(cfg.places(), cfg.schemas())


def _file(function: str, name: str) -> str:
    return f"SELECT * FROM {function}('.tmp/{name}')"


# Statements a hostile user tried: every file reader of DuckDB, a quoted path in FROM,
# SQL given as a string, the engine's own settings, catalog and secrets, COPY, ATTACH,
# INSTALL, SET, PRAGMA, a write inside a WITH, and statements too deep or too long (past
# Python's recursion limit, past DuckDB's expression depth, past Trino's length).
HOSTILE = [
    "SELECT content FROM read_text('.tmp/planted.txt')",
    # Trino's row pattern matching, which the embedded engine lacks: refused, not a crash.
    "SELECT * FROM strata.clicks MATCH_RECOGNIZE (PARTITION BY _partition ORDER BY _offset "
    "MEASURES A._offset AS o PATTERN (A) DEFINE A AS true)",
    _file("read_blob", "planted.txt"),
    _file("read_csv", "planted.csv"),
    _file("read_csv_auto", "planted.csv"),
    _file("read_json", "planted.json"),
    _file("read_json_auto", "planted.json"),
    _file("read_ndjson_objects", "planted.json"),
    _file("read_parquet", "planted.parquet"),
    _file("parquet_scan", "planted.parquet"),
    _file("parquet_metadata", "planted.parquet"),
    _file("parquet_schema", "planted.parquet"),
    _file("sniff_csv", "planted.csv"),
    _file("query_table", "planted.csv"),
    "SELECT * FROM glob('.tmp/*')",
    "SELECT * FROM '.tmp/planted.csv'",
    'SELECT * FROM ".tmp/planted.parquet"',
    "SELECT read_text('.tmp/planted.txt')",
    "SELECT * FROM strata.clicks CROSS JOIN read_text('.tmp/planted.txt')",
    "SELECT * FROM strata.clicks, LATERAL read_text(page)",
    "SELECT (SELECT content FROM read_text('.tmp/planted.txt'))",
    "SELECT * FROM strata.clicks WHERE page IN (SELECT content FROM read_text('.tmp/planted.txt'))",
    "WITH x AS (SELECT * FROM read_text('.tmp/planted.txt')) SELECT * FROM x",
    "SELECT * FROM query('SELECT * FROM read_text(''.tmp/planted.txt'')')",
    "SELECT * FROM json_execute_serialized_sql(json_serialize_sql('SELECT 1'))",
    "SELECT json_serialize_plan('SELECT * FROM read_text(''.tmp/planted.txt'')')",
    "SELECT current_setting('secret_directory')",
    "SELECT current_setting('temp_directory')",
    "SELECT getenv('HOME')",
    "SELECT getvariable('x')",
    "SELECT current_query()",
    "SELECT pg_get_viewdef('strata.clicks')",
    "SELECT * FROM duckdb_settings()",
    "SELECT * FROM duckdb_secrets()",
    "SELECT * FROM duckdb_extensions()",
    "SELECT * FROM duckdb_databases()",
    "SELECT * FROM duckdb_temporary_files()",
    "SELECT * FROM duckdb_functions()",
    "SELECT * FROM pragma_database_size()",
    "SELECT * FROM pragma_platform()",
    "SELECT * FROM which_secret('s3://bucket/key', 's3')",
    "SELECT * FROM duckdb_views",
    "SELECT * FROM information_schema.tables",
    "SELECT * FROM pg_catalog.pg_settings",
    "SELECT * FROM pg_settings",
    "SELECT * FROM _strata_table_0",
    "SELECT * FROM temp.main._strata_table_0",
    "SELECT * FROM hive.strata.clicks",
    "SELECT * FROM other.clicks",
    # A derived table's alias, or a WITH query out of scope, is not a WITH query here.
    "SELECT * FROM (SELECT 1) AS pg_settings, pg_settings",
    "SELECT * FROM (WITH pg_settings AS (SELECT 1 AS x) SELECT x FROM pg_settings) t, pg_settings",
    "SELECT * FROM TABLE(sequence(1, 3))",
    "COPY strata.clicks TO 'copy.csv'",
    "COPY (SELECT 1) TO 'copy.csv'",
    "ATTACH 'other.db' AS other",
    "DETACH delta",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = true",
    "RESET lock_configuration",
    "SET VARIABLE x = 1",
    "PRAGMA version",
    "CALL pragma_version()",
    "CHECKPOINT",
    "EXPORT DATABASE 'copy'",
    "SUMMARIZE strata.clicks",
    "DESCRIBE strata.clicks",
    "SELECT * INTO clicks FROM strata.clicks",
    "WITH x AS (DELETE FROM strata.clicks RETURNING *) SELECT * FROM x",
    "SELECT 'unclosed",
    pytest.param("SELECT " + "(" * 1_000 + "1" + ")" * 1_000, id="1000-parentheses"),
    pytest.param("SELECT " + "abs(" * 1_000 + "1" + ")" * 1_000, id="1000-calls"),
    pytest.param("SELECT " + " + ".join(["1"] * 5_000), id="5000-terms"),
    pytest.param("SELECT '" + "x" * 1_000_000 + "'", id="1000000-characters"),
]

# Statements that look hostile and run: they read the pipeline's tables, or nothing.
READ_THE_TABLES = [
    ("WITH duckdb_settings AS (SELECT 1 AS x) SELECT x FROM duckdb_settings", [(1,)]),
    ("WITH c AS (SELECT count(*) AS n FROM clicks) SELECT n FROM C", [(3,)]),
    ("SELECT count(*) FROM strata.clicks AS pg_settings", [(3,)]),
    ("SELECT count(*) FROM STRATA.Clicks", [(3,)]),
    ("SELECT count(*) FROM strata.clicks, LATERAL (SELECT 1 AS one)", [(3,)]),
    ("SELECT count(*) FROM clicks WHERE page IN (SELECT page FROM delta.strata.clicks)", [(3,)]),
    ("SELECT x FROM UNNEST(ARRAY[2, 1]) AS t (x) ORDER BY x", [(1,), (2,)]),
    ("SELECT count(*) FROM clicks WHERE " + " OR ".join(["page <> ''"] * 1_000), [(3,)]),
    ("SELECT " + " + ".join(["1"] * 800), [(800,)]),
]


def _assert_short_refusal(message: str, cwd) -> None:
    """One short line, quoting neither a local path nor what a planted file holds."""
    assert "\n" not in message and 0 < len(message) <= 400, message[:500]
    home = str(Path.home())
    assert len(home) < 2 or home not in message
    assert str(cwd) not in message and "strata-query-" not in message
    assert PLANTED not in message


@pytest.mark.parametrize("statement", [*NOT_QUERIES, *HOSTILE])
def test_a_hostile_statement_is_refused_in_one_short_line(landed, planted, statement):
    with pytest.raises(QueryError) as refused:
        run_embedded(landed, "delta", "strata", statement)
    assert refused.value.exit_code == 2
    _assert_short_refusal(str(refused.value), planted)


@pytest.mark.parametrize(("statement", "rows"), READ_THE_TABLES)
def test_a_statement_that_runs_reads_the_pipelines_tables_alone(landed, planted, statement, rows):
    assert run_embedded(landed, "delta", "strata", statement).rows == rows


@pytest.mark.parametrize(
    "statement",
    [
        pytest.param("SELECT " + "(" * 1_000 + "1" + ")" * 1_000, id="1000-parentheses"),
        pytest.param("SELECT " + " + ".join(["1"] * 5_000), id="5000-terms"),
        pytest.param("SELECT '" + "x" * 1_000_000 + "'", id="1000000-characters"),
        pytest.param("SELECT content FROM read_text('.tmp/planted.txt')", id="planted-file"),
        pytest.param("SELECT current_setting('secret_directory')", id="current_setting"),
        pytest.param("SELECT * FROM duckdb_secrets()", id="duckdb_secrets"),
        pytest.param("SELECT * FROM duckdb_extensions()", id="duckdb_extensions"),
        # sqlglot warns of a statement it reads as a bare command, quoting all of it.
        pytest.param("LOAD httpfs", id="load"),
    ],
)
def test_the_command_refuses_with_exit_2_in_one_short_line(planted, monkeypatch, capsys, statement):
    monkeypatch.setenv("STRATA_WAREHOUSE", str(planted / "warehouse"))
    argv = ["sql", "query", "--pipeline", "clicks", "--conf-dir", str(ROOT / "conf")]
    assert main([*argv, "-e", statement]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    [line] = out.err.splitlines()
    assert line.startswith("strata: error: ")
    _assert_short_refusal(line, planted)
    # Refused before the tables were opened.
    assert not (planted / "warehouse").exists()


def test_the_engines_temporary_directory_is_its_own_and_removed_after(
    planted, monkeypatch, tmp_path
):
    """Not DuckDB's default `.tmp` under the working directory, which it keeps readable."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "scratch"))
    (tmp_path / "scratch").mkdir()
    names = ("temp_directory", "allowed_directories", "home_directory", "secret_directory")
    with _connection([], "delta", "strata") as con:
        found = dict(
            con.execute(
                "SELECT name, value FROM duckdb_settings() WHERE list_contains($1, name)",
                [list(names)],
            ).fetchall()
        )
        [own] = list((tmp_path / "scratch").iterdir())
        mode = own.stat().st_mode & 0o777
        # The connection itself refuses the planted file, and its configuration is locked.
        with pytest.raises(duckdb.PermissionException):
            con.execute("SELECT content FROM read_text('.tmp/planted.txt')")
        with pytest.raises(duckdb.Error):
            con.execute("SET lock_configuration = false")
    assert set(found) == set(names)
    assert all(str(own) in value for value in found.values()), found
    assert str(planted / ".tmp") not in found["allowed_directories"]
    assert mode == 0o700
    assert not any((tmp_path / "scratch").iterdir())


@pytest.mark.parametrize(("table_format", "catalog"), [("delta", "delta"), ("parquet", "hive")])
def test_a_table_named_alone_is_in_the_pipelines_database_as_in_a_trino_session(
    tmp_path, capsys, table_format, catalog
):
    """`clicks` is `strata.clicks`, as in a Trino session with `--schema strata`."""
    import yaml

    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    body = yaml.safe_load((ROOT / "conf" / "pipelines" / "clicks.yaml").read_text())
    body |= {
        "schemas_dir": str(ROOT / "schemas"),
        "warehouse": str(tmp_path / "warehouse"),
        "table_format": table_format,
    }
    (conf / "pipelines" / "clicks.yaml").write_text(yaml.safe_dump(body))
    _land(load_pipeline("clicks", conf), _clicks(3))
    statement = (
        "SELECT (SELECT count(*) FROM clicks) AS alone,"
        " (SELECT count(*) FROM strata.clicks) AS in_schema,"
        f" (SELECT count(*) FROM {catalog}.strata.clicks) AS in_catalog,"
        " (SELECT count(*) FROM clicks a JOIN strata.clicks b USING (event_id)) AS joined,"
        " (SELECT count(*) FROM clicks_ledger) AS ledger_rows,"
        " current_schema AS schema, current_catalog AS catalog"
    )
    argv = ["sql", "query", "--pipeline", "clicks", "--conf-dir", str(conf), "--format", "json"]
    assert main([*argv, "-e", statement]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out) == [
        {
            "alone": 3,
            "in_schema": 3,
            "in_catalog": 3,
            "joined": 3,
            "ledger_rows": 0,
            "schema": "strata",
            "catalog": catalog,
        }
    ]


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
    # Each table in its own catalog: an Iceberg pipeline's ledger is in the Delta one.
    sent = fake.requests[1][2]
    assert "FROM delta.strata.clicks" in sent and "count(" in sent.lower()
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
