"""The ledger and the tables vouch for each other: what counts as gone, replaced, or another's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from strata.errors import TableMismatch
from strata.store.delta import ensure_table
from strata.store.identity import (
    MARKER,
    check_tables,
    foreign_files,
    mark_parquet_table,
    table_problems,
    vouch,
)
from strata.store.ledger import commit_ledger, ledger_state, unread_row
from tests.conftest import clicks_config

SCHEMA = pa.schema([pa.field("x", pa.int64())])


def _places(tmp_path, fmt="delta"):
    return clicks_config(tmp_path, table_format=fmt).places()


def _read_row(partition=0, end=10):
    row = unread_row("ingest", "clicks", partition, 0, end, 0, None)
    row.update(messages=end, rows=end)
    return row


def _made(places, batch=1):
    """The three tables as a batch of the pipeline leaves them: each holding the batch."""
    from strata.store.delta import commit_files

    for name in ("raw", "quarantine", "table"):
        ref = places.table(name)
        table = ensure_table(ref.uri, SCHEMA, [], ref.options, ref.name)
        commit_files(table, SCHEMA, [], [], places.pipeline, batch, {})


def test_a_ledger_recorded_before_tables_were_vouched_for_adopts_the_tables_that_stand(tmp_path):
    places = _places(tmp_path)
    _made(places)
    commit_ledger(places, 1, [_read_row()])
    state = ledger_state(places)
    assert state.tables == {}
    assert table_problems(places, state) == []
    # Once it vouches for them, a table deleted by hand is told from the one it held.
    _made(places, batch=2)
    commit_ledger(
        places,
        2,
        [_read_row(end=20)],
        tables=vouch(places, dict.fromkeys(("raw", "quarantine", "table")), 2),
    )
    state = ledger_state(places)
    assert set(state.tables) == {"raw", "quarantine", "table"}
    assert all(v.identity.startswith("delta:") and v.batch == 2 for v in state.tables.values())
    shutil.rmtree(places.table("table").uri)
    [problem] = table_problems(places, state)
    assert (problem.role, problem.problem) == ("table", "gone")
    assert "batch 2 was committed to delta:" in problem.text


def test_a_table_made_afresh_at_the_same_place_is_another_table(tmp_path):
    places = _places(tmp_path)
    _made(places)
    tables = dict.fromkeys(("raw", "quarantine", "table"))
    commit_ledger(places, 1, [_read_row()], tables=vouch(places, tables, 1))
    shutil.rmtree(places.table("quarantine").uri)
    ensure_table(places.table("quarantine").uri, SCHEMA, [], {}, "q")
    [problem] = table_problems(places, ledger_state(places))
    assert (problem.role, problem.problem) == ("quarantine", "replaced")
    with pytest.raises(TableMismatch) as stopped:
        check_tables(places, ledger_state(places))
    assert "strata ledger reset --pipeline clicks --table quarantine" in str(stopped.value)
    assert "strata replay --pipeline clicks --rebuild" in str(stopped.value)


def test_a_legacy_ledger_whose_tables_are_gone_is_stopped_all_the_same(tmp_path):
    places = _places(tmp_path)
    commit_ledger(places, 1, [_read_row()])
    problems = table_problems(places, ledger_state(places))
    assert {(p.role, p.problem) for p in problems} == {
        ("raw", "gone"),
        ("quarantine", "gone"),
        ("table", "gone"),
    }


def test_tables_ahead_of_the_ledger_say_the_ledger_is_gone(tmp_path):
    places = _places(tmp_path)
    _made(places, batch=3)
    problems = table_problems(places, ledger_state(places))
    assert {(p.role, p.problem) for p in problems} == {("ledger", "ahead")}
    # A table that holds the next batch alone is a batch cut short before its ledger commit.
    other = _places(tmp_path / "other")
    _made(other, batch=1)
    assert table_problems(other, ledger_state(other)) == []


def test_another_tables_files_are_told_from_strata_s_own(tmp_path):
    places = _places(tmp_path)
    ref = places.table("table")
    root = Path(ref.uri)
    (root / "dt=2025-11-22" / "hr=10").mkdir(parents=True)
    (
        root / "dt=2025-11-22" / "hr=10" / "part-b0000000001-t00000-a0-x-f000.snappy.parquet"
    ).write_bytes(b"")
    (root / "_delta_log").mkdir()
    (root / "_delta_log" / ".00000000000000000000.json.tmp").write_bytes(b"")
    assert foreign_files(ref) == []
    (root / "data.parquet").write_bytes(b"x")
    assert foreign_files(ref) == ["data.parquet"]
    # An Iceberg table's metadata counts unless it names no snapshot (a creation cut short).
    iceberg = (
        clicks_config(
            tmp_path / "ice", table_format="iceberg", metastore={"uri": "thrift://127.0.0.1:9"}
        )
        .places()
        .table("table")
    )
    meta = Path(iceberg.uri) / "metadata"
    meta.mkdir(parents=True)
    (meta / "00000-a.metadata.json").write_text(json.dumps({"snapshots": []}))
    assert foreign_files(iceberg) == []
    (meta / "00001-b.metadata.json").write_text(json.dumps({"snapshots": [{"snapshot-id": 1}]}))
    assert foreign_files(iceberg) == ["metadata/00001-b.metadata.json"]


def test_a_plain_parquet_tables_marker_is_written_once_and_read_back(tmp_path):
    places = _places(tmp_path, "parquet")
    ref = places.table("table")
    first = mark_parquet_table(ref, "clicks", "table", 1)
    assert first.startswith("parquet:clicks-table-b1-")
    # A second writer of the same first batch (another runner) finds the marker there.
    assert mark_parquet_table(ref, "clicks", "table", 1) == first
    assert json.loads((Path(ref.uri) / MARKER).read_text())["batch"] == 1
    other = places.table("raw")
    Path(other.uri).mkdir(parents=True)
    write_deltalake(other.uri, pa.table({"x": [1]}))
    with pytest.raises(TableMismatch) as refused:
        mark_parquet_table(other, "clicks", "raw", 1)
    assert "holds another table's files (" in str(refused.value)
