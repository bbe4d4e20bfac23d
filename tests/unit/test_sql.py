"""The SQL in sql/: it parses as Trino SQL, the DDL is what the command prints, quoting holds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlglot
from sqlglot import exp

from strata.catalog.sql import (
    Repoint,
    pipeline_ddl,
    quote_identifier,
    quote_literal,
    trino_statements,
)
from strata.config import PipelineConfig, TrinoConfig, load_pipeline
from tests.conftest import ROOT

# The ready queries are package data (strata/catalog/queries); sql/queries links to them.
SQL_FILES = sorted({*(ROOT / "sql").rglob("*.sql"), *(ROOT / "strata").rglob("*.sql")})


def statements(text: str) -> list[exp.Expression]:
    parsed = sqlglot.parse(text, read="trino", error_level=sqlglot.ErrorLevel.RAISE)
    return [e for e in parsed if e is not None]


def test_there_are_queries_and_ddl():
    names = {p.name for p in SQL_FILES}
    assert {
        "rows_per_hour.sql",
        "late_arrivals.sql",
        "lag_per_partition.sql",
        "clicks.sql",
    } <= names


@pytest.mark.parametrize("path", SQL_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_sql_file_parses_as_trino(path: Path):
    parsed = statements(path.read_text())
    assert parsed
    for statement in parsed:
        # Trino's procedure calls are the one statement sqlglot keeps as a command.
        if isinstance(statement, exp.Command):
            assert statement.this.upper() == "CALL", statement.sql()


def test_the_committed_ddl_is_what_the_command_prints():
    env = {**os.environ, "STRATA_WAREHOUSE": "s3://your-bucket/warehouse"}
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "strata"),
            "sql",
            "ddl",
            "--pipeline",
            "clicks",
            "--conf-dir",
            str(ROOT / "conf"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == (ROOT / "sql" / "ddl" / "clicks.sql").read_text()


def test_parquet_ddl_creates_partitioned_external_tables(monkeypatch):
    monkeypatch.setenv("STRATA_WAREHOUSE", "s3://b/w")
    delta = load_pipeline("clicks", ROOT / "conf")
    # Validated afresh: a copy would keep the places built for the Delta format.
    cfg = PipelineConfig.model_validate({**delta.model_dump(), "table_format": "parquet"})
    parsed = statements(pipeline_ddl(cfg.places(), cfg.schemas(), cfg.metastore))
    creates = [s for s in parsed if isinstance(s, exp.Create) and s.kind == "TABLE"]
    assert [c.this.this.name for c in creates] == [
        "clicks",
        "clicks_raw",
        "clicks_quarantine",
        "clicks_ledger",
        "clicks_quality",
    ]
    data = creates[0].sql("trino")
    assert "PARTITIONED_BY=ARRAY['dt', 'hr']" in data and "'s3://b/w/clicks'" in data
    assert isinstance(parsed[-1], exp.Command) and "sync_partition_metadata" in parsed[-1].sql()


def test_quoting_keeps_hostile_names_and_values_inert():
    hostile = 'a"; DROP TABLE x; --'
    statement = (
        f"SELECT {quote_identifier(hostile)} FROM t WHERE v = {quote_literal(hostile + chr(39))}"
    )
    [parsed] = statements(statement)
    assert isinstance(parsed, exp.Select)
    assert parsed.selects[0].name == hostile
    assert parsed.find(exp.Literal).this == hostile + "'"


def test_hostile_topic_pipeline_and_database_names_fail_at_load():
    base = {
        "schema_file": "clicks.avsc",
        "schemas_dir": str(ROOT / "schemas"),
        "event_time": {"field": "ts"},
    }
    for bad in (
        {"name": "p", "topics": ["a;drop table x"]},
        {"name": "p;drop", "topics": ["t"]},
        {"name": "p", "topics": [".."]},
        {"name": "p", "topics": ["t"], "metastore": {"database": "x; drop"}},
    ):
        with pytest.raises(ValueError):
            PipelineConfig.model_validate({**base, **bad})


def test_only_partition_directories_strata_writes_become_partitions(tmp_path):
    from strata.catalog._partitions import storage_partitions

    table = tmp_path / "wh" / "clicks"
    for d in [
        "dt=2025-11-22/hr=10",
        "dt=2025-11-22/hr=11",
        "dt=2025-11-23/hr=00",
        "dt=2025-11-22/hr=..",
        "dt=../hr=01",
        "dt=2025-11-22x/hr=01",
        "dt=2025-11-22/hr=1%2F",
        "other/hr=01",
        "_delta_log",
    ]:
        (table / d).mkdir(parents=True, exist_ok=True)
    cfg = PipelineConfig.model_validate(
        {
            "name": "clicks",
            "topics": ["t"],
            "schema_file": "clicks.avsc",
            "schemas_dir": str(ROOT / "schemas"),
            "event_time": {"field": "ts"},
            "warehouse": str(tmp_path / "wh"),
        }
    )
    assert storage_partitions(cfg.places().table("table"), cfg.partitioning) == [
        ("2025-11-22", "10"),
        ("2025-11-22", "11"),
        ("2025-11-23", "00"),
    ]


def _trino_pipeline(**trino) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "name": "clicks",
            "topics": ["clicks"],
            "schema_file": "clicks.avsc",
            "schemas_dir": str(ROOT / "schemas"),
            "event_time": {"field": "ts"},
            "trino": trino,
        }
    )


def test_the_trino_password_goes_as_basic_auth_to_a_coordinator_checked_against_ca_file(
    tmp_path,
):
    import base64

    from strata.catalog.sql import run_in_trino
    from strata.errors import MetastoreError
    from tests.fake_trino import FakeTrino, self_signed_certificate

    tls = self_signed_certificate(tmp_path)
    (tmp_path / "other").mkdir()
    stranger, _ = self_signed_certificate(tmp_path / "other")
    with FakeTrino(tls) as fake:
        signed = {"url": fake.url, "user": "etl", "password": "trino-pw-Zk3"}
        cfg = _trino_pipeline(**signed, ca_file=str(tls[0]))
        assert run_in_trino(cfg.trino, ["CALL x()"]) == ["CALL x()"]
        token = base64.b64encode(b"etl:trino-pw-Zk3").decode()
        assert fake.requests == [("etl", f"Basic {token}", "CALL x()")]

        # A coordinator whose certificate the given authority did not sign is refused
        # before the password is sent.
        with pytest.raises(MetastoreError) as refused:
            run_in_trino(_trino_pipeline(**signed, ca_file=str(stranger)).trino, ["CALL y()"])
        assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
        assert "trino-pw-Zk3" not in str(refused.value)
        assert len(fake.requests) == 1


def test_the_trino_access_token_goes_as_a_bearer_token(tmp_path):
    from strata.catalog.sql import run_in_trino
    from tests.fake_trino import FakeTrino, self_signed_certificate

    tls = self_signed_certificate(tmp_path)
    with FakeTrino(tls) as fake:
        cfg = _trino_pipeline(url=fake.url, access_token="eyJ.jwt.token", ca_file=str(tls[0]))
        run_in_trino(cfg.trino, ["CALL x()"])
    assert fake.requests == [("strata", "Bearer eyJ.jwt.token", "CALL x()")]


def test_iceberg_ddl_registers_in_the_iceberg_catalog_and_names_the_catalog_file(monkeypatch):
    monkeypatch.setenv("STRATA_WAREHOUSE", "s3://b/w")
    delta = load_pipeline("clicks", ROOT / "conf")
    body = {
        **delta.model_dump(),
        "table_format": "iceberg",
        "metastore": {"uri": "thrift://hms.example:9083", "database": "lake"},
    }
    cfg = PipelineConfig.model_validate(body)
    ddl = pipeline_ddl(
        cfg.places(), cfg.schemas(), cfg.metastore, "dl", "hv", "ice", register_tables=True
    )
    assert "connector.name=iceberg" in ddl and "iceberg.catalog.type=hive_metastore" in ddl
    assert "hive.metastore.uri=thrift://hms.example:9083" in ddl
    parsed = statements(ddl)
    calls = [s.sql() for s in parsed if "register_table" in s.sql()]
    # The three Iceberg tables in the Iceberg catalog; the ledger and the quality
    # table, Delta, in Delta's.
    assert [c.split(".system")[0].rsplit(" ", 1)[-1] for c in calls] == [
        '"ice"',
        '"ice"',
        '"ice"',
        '"dl"',
        '"dl"',
    ]
    assert "'s3://b/w/clicks_raw'" in calls[1] and "table_name => 'clicks_ledger'" in calls[3]
    schemas = [s.sql() for s in parsed if isinstance(s, exp.Create) and s.kind == "SCHEMA"]
    assert len(schemas) == 2


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_run_re_points_only_iceberg_tables_in_a_trino_on_another_metastore(
    table_format, tmp_path, monkeypatch
):
    import strata.store.iceberg

    # No Iceberg table yet (it would be looked up in the metastore): no snapshot.
    monkeypatch.setattr(strata.store.iceberg, "open_table", lambda ref: None)
    monkeypatch.setenv("STRATA_WAREHOUSE", str(tmp_path))
    delta = load_pipeline("clicks", ROOT / "conf")
    body = {
        **delta.model_dump(),
        "table_format": table_format,
        "metastore": {"uri": "thrift://hms.example:9083", "database": "lake"},
    }
    cfg = PipelineConfig.model_validate(body)
    settings = TrinoConfig(url="http://trino.example:8080", register_delta_tables=True)
    calls = trino_statements(cfg.places(), cfg.metastore, settings)
    names = [c.split("table_name => '")[1].split("'")[0] for c in calls]
    assert names == ["clicks", "clicks_raw", "clicks_quarantine", "clicks_ledger"]
    assert all(".system.register_table(" in c for c in calls)
    # An Iceberg table registered there stays at the metadata file it was registered at:
    # each of the three is re-pointed where Trino does not read its current snapshot.
    # Delta tables (the ledger always) read their log, and are only registered.
    repointed = [c for c in calls if isinstance(c, Repoint)]
    assert len(repointed) == (3 if table_format == "iceberg" else 0)
    for call, name in zip(repointed, names, strict=False):
        unregister = f"unregister_table(schema_name => 'lake', table_name => '{name}')"
        assert call.unregister == f'CALL "iceberg".system.{unregister}'
        assert call.probe == f'SELECT count(*) = 0 FROM "iceberg"."lake"."{name}$snapshots"'
    # On the metastore Strata registers in, nothing to run.
    same = TrinoConfig(url="http://trino.example:8080")
    assert trino_statements(cfg.places(), cfg.metastore, same) == []


def test_iceberg_needs_a_metastore_and_says_which_key():
    delta = load_pipeline("clicks", ROOT / "conf")
    with pytest.raises(ValueError, match="metastore.uri"):
        PipelineConfig.model_validate({**delta.model_dump(), "table_format": "iceberg"})
