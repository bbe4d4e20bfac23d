"""A commit's cost does not grow with the batches committed before it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from strata.store import ledger as ledger_module
from strata.store.delta import commit_files, open_table
from strata.store.ledger import commit_ledger, ledger_state, read_ledger, unread_row

T0 = datetime(2025, 11, 22, 10, tzinfo=UTC)


def _places(tmp_path):
    from tests.conftest import clicks_config

    return clicks_config(tmp_path).places()


def _ingest(partition, start, end):
    row = unread_row("ingest", "clicks", partition, start, end, 0, None)
    row.update(messages=end - start, rows=end - start, bytes=10 * (end - start))
    row.update(min_event_time=T0, max_event_time=T0 + timedelta(hours=end), high_watermark=end)
    return row


def _log(uri: str) -> list[str]:
    return sorted(p.name for p in Path(uri, "_delta_log").glob("*.json"))


def test_a_commit_leaves_the_expired_log_to_strata_checkpoint(tmp_path):
    # Every commit made a checkpoint, and every commit's log is past its retention: the
    # post-commit cleanup of delta-rs would delete the commits before the checkpoint.
    # It also lists the whole log after every commit, however many batches it holds;
    # deleting old commits is `strata checkpoint`'s, which keeps those still read.
    uri = str(tmp_path / "t")
    config = {"delta.logRetentionDuration": "interval 0 seconds", "delta.checkpointInterval": "1"}
    schema = pa.schema([("_batch", pa.int64())])
    DeltaTable.create(uri, schema=schema, configuration=config)
    for batch in (1, 2, 3):
        assert commit_files(DeltaTable(uri), schema, [], [], "p", batch, {})
    assert _log(uri) == [f"{v:020d}.json" for v in range(4)]
    assert list(Path(uri, "_delta_log").glob("*.checkpoint.parquet"))
    # The commit of batch 1 is still there to read.
    assert [c.get("strata.batch") for c in DeltaTable(uri).history()][-2] == 1


def test_batches_commit_through_one_ledger_handle_brought_forward(tmp_path, monkeypatch):
    places = _places(tmp_path)
    assert commit_ledger(places, 1, [_ingest(0, 0, 1)])
    ledger = open_table(places.ledger.uri, places.options)
    assert ledger is not None
    # Opening the ledger loads its whole file list, a file per batch: a caller that
    # holds it open commits without opening it again.
    monkeypatch.setattr(ledger_module, "open_table", lambda *a: pytest.fail("opened"))
    for batch in range(2, 5):
        assert commit_ledger(places, batch, [_ingest(0, batch - 1, batch)], ledger=ledger)
        ledger.update_incremental()
    monkeypatch.undo()
    state = ledger_state(places)
    assert state.last_batch == 4 and state.committed == {("clicks", 0): 4}
    assert sorted(read_ledger(places).column("batch").to_pylist()) == [1, 2, 3, 4]


def test_a_stale_ledger_handle_never_commits_a_batch_twice(tmp_path):
    places = _places(tmp_path)
    assert commit_ledger(places, 1, [_ingest(0, 0, 1)])
    stale = open_table(places.ledger.uri, places.options)
    # Another runner commits batch 2 after the handle's snapshot.
    assert commit_ledger(places, 2, [_ingest(0, 1, 2)])
    assert not commit_ledger(places, 2, [_ingest(0, 1, 3)], ledger=stale)
    assert read_ledger(places).column("end_offset").to_pylist().count(3) == 0
    assert ledger_state(places).committed == {("clicks", 0): 2}


def test_a_ledger_commit_reads_the_newest_commits_once(tmp_path, monkeypatch):
    places = _places(tmp_path)
    assert commit_ledger(places, 1, [_ingest(0, 0, 1)], [["a"]], {"clicks": "id-1"})
    reads: list[int | None] = []
    real = DeltaTable.history
    monkeypatch.setattr(
        DeltaTable, "history", lambda self, limit=None: reads.append(limit) or real(self, limit)
    )
    # The ids and the state are both read from the newest commits: one listing of the
    # log, which holds a file per commit, serves both.
    assert commit_ledger(places, 2, [_ingest(0, 1, 2)], [["a"]], {"clicks": "id-1"})
    assert len(reads) == 1
    monkeypatch.undo()
    assert ledger_module.committed_log_ids(places).topics == {"clicks": "id-1"}
    assert ledger_state(places).committed == {("clicks", 0): 2}
