"""Which log each partition's offsets belong to, and the state each ledger commit records."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pyarrow.compute as pc
import pytest

from strata.store import ledger as ledger_module
from strata.store.delta import ensure_table
from strata.store.ledger import (
    LEDGER_SCHEMA,
    PARTITION_IDS_KEY,
    STATE_KEY,
    TOPIC_IDS_KEY,
    LedgerState,
    LogIds,
    commit_ledger,
    fold_rows,
    ledger_state,
    read_ledger,
    recent_ledger,
    unread_row,
)


def test_a_seek_of_one_partition_vouches_for_it_alone():
    recorded = LogIds(3, {"a": "old-a", "b": "old-b"})
    sought = recorded.vouched({}, {("a", 0): "new-a"})
    assert sought.of("a", 0) == "new-a"
    # The other partition of the topic, and the other topic, keep what was recorded.
    assert sought.of("a", 1) == "old-a" and sought.of("b", 0) == "old-b"


def test_an_ingest_vouches_for_the_whole_topics_it_checked_and_nothing_else():
    recorded = LogIds(3, {"a": "old-a", "gone": "old-gone"}, {"a": {0: "new-a"}})
    ingested = recorded.vouched({"a": "new-a"}, {})
    assert ingested.topics == {"a": "new-a", "gone": "old-gone"}
    # Partition 0's own entry is the topic's now: it needs none.
    assert ingested.partitions == {}


def test_a_partition_moved_back_onto_its_topics_log_needs_no_entry():
    recorded = LogIds(1, {"a": "id-a"}, {"a": {1: "other"}})
    assert recorded.vouched({}, {("a", 1): "id-a"}).partitions == {}


def test_the_map_survives_the_commit_metadata_round_trip():
    ids = LogIds(0, {"a": "id-a"}, {"a": {0: "id-x", 7: "id-y"}})
    meta = ids.metadata()
    commit = {"strata.batch": 5, **{k: json.dumps(v) for k, v in meta.items()}}
    assert set(meta) == {TOPIC_IDS_KEY, PARTITION_IDS_KEY}
    back = LogIds.from_commit(commit)
    assert back == LogIds(5, ids.topics, ids.partitions)
    assert LogIds(0, {"a": "x"}).metadata() == {TOPIC_IDS_KEY: {"a": "x"}}


# The ledger's state: recorded by each commit, read from the newest one alone.

T0 = datetime(2025, 11, 22, 10, tzinfo=UTC)


def _places(tmp_path, fmt="delta"):
    from tests.conftest import clicks_config

    return clicks_config(tmp_path, table_format=fmt).places()


def _ingest(partition, start, end, hours, *, high=None, messages=None):
    """An ingest row whose newest event is `hours` after T0."""
    row = unread_row("ingest", "clicks", partition, start, end, 0, None)
    count = end - start if messages is None else messages
    row.update(messages=count, rows=count, bytes=10 * count, gaps=end - start - count)
    row.update(
        min_event_time=T0,
        max_event_time=T0 + timedelta(hours=hours),
        high_watermark=end if high is None else high,
    )
    return row


def _history(places):
    """Batches of every kind that moves (or must not move) where reading goes on."""
    commit_ledger(places, 1, [_ingest(0, 0, 10, 1), _ingest(1, 0, 5, 2, high=9)])
    commit_ledger(places, 2, [_ingest(0, 10, 20, 3), _ingest(1, 5, 9, 2.5)])
    # A backfill re-reads committed offsets: no position moves.
    backfill = _ingest(0, 0, 10, 9)
    backfill["kind"] = "backfill"
    commit_ledger(places, 3, [backfill])
    commit_ledger(places, 4, [unread_row("seek", "clicks", 1, 9, 40, 31, "skip")])
    # An abandoned plan starts a partition never read; it moves no read one.
    commit_ledger(
        places,
        5,
        [
            unread_row("abandon", "clicks", 2, 7, 7, 0, "dropped"),
            unread_row("abandon", "clicks", 0, 20, 20, 0, "dropped"),
        ],
    )
    commit_ledger(places, 6, [_ingest(0, 20, 30, 4, messages=0), _ingest(2, 7, 8, 5)])


def test_each_ledger_commit_records_the_state_a_run_reads_without_the_rows(tmp_path, monkeypatch):
    places = _places(tmp_path)
    _history(places)
    from_rows = fold_rows(read_ledger(places))
    assert from_rows.committed == {("clicks", 0): 30, ("clicks", 1): 40, ("clicks", 2): 8}
    assert from_rows.last_batch == 6
    newest = ledger_module.open_table(places.ledger.uri, places.options).history(1)[0]
    assert STATE_KEY in newest
    # The run's read: one commit's info, never the ledger's rows.
    monkeypatch.setattr(ledger_module, "_rows", lambda *a, **k: pytest.fail("rows were read"))
    state = ledger_state(places)
    assert state == from_rows
    assert state.traffic["clicks:0"].messages == 20 and state.traffic["clicks:0"].bytes == 200
    # Partition 0's last range read nothing but reached the end: it is drained, and
    # partition 2 (read by batch 6) holds the watermark at its newest event, 5h.
    assert state.mark is not None and state.mark.batch == 6
    assert state.mark.holding == "clicks:2"
    assert state.mark.at_us == state.traffic["clicks:2"].newest_us
    assert state.mark.before_us == state.traffic["clicks:1"].newest_us


def test_a_ledger_written_before_the_state_was_recorded_is_folded_then_recorded(tmp_path):
    places = _places(tmp_path)
    _history(places)
    before = ledger_state(places)
    # A ledger of an earlier version: the same rows, committed without the state.
    old = _places(tmp_path / "old")
    rows = read_ledger(places)
    table = ensure_table(old.ledger.uri, LEDGER_SCHEMA, [], old.options, "x")
    fs, root = ledger_module.filesystem(old.ledger.uri, old.options)
    for batch in range(1, 7):
        mine = rows.filter(pc.equal(rows.column("batch"), batch))
        files = [ledger_module.write_file(fs, root, f"b{batch}.parquet", mine, {})]
        ledger_module.commit_files(table, LEDGER_SCHEMA, [], files, "clicks", batch, {})
        table.update_incremental()
    assert ledger_state(old) == before
    # Its next commit records the state, folded from the rows once.
    commit_ledger(old, 7, [_ingest(0, 30, 31, 6)])
    newest = ledger_module.open_table(old.ledger.uri, old.options).history(1)[0]
    recorded = LedgerState.from_record(json.loads(newest[STATE_KEY]))
    assert recorded == fold_rows(read_ledger(old)) and recorded.committed[("clicks", 0)] == 31


def test_a_delta_ledger_commit_does_not_list_the_ledgers_folder(tmp_path, monkeypatch):
    places = _places(tmp_path)
    commit_ledger(places, 1, [_ingest(0, 0, 10, 1)])
    # The folder holds a file per batch: listing it on every commit grows with history.
    monkeypatch.setattr(
        ledger_module, "_remove_other_attempts", lambda *a: pytest.fail("listed the folder")
    )
    assert commit_ledger(places, 2, [_ingest(0, 10, 20, 2)])
    assert ledger_state(places).committed == {("clicks", 0): 20}


def test_recent_rows_are_read_from_the_newest_files_alone(tmp_path, monkeypatch):
    places = _places(tmp_path)
    for batch in range(1, 6):
        commit_ledger(places, batch, [_ingest(0, batch - 1, batch, batch)])
    read = []
    real = ledger_module.ds.dataset
    monkeypatch.setattr(
        ledger_module.ds, "dataset", lambda paths, **k: read.extend(paths) or real(paths, **k)
    )
    rows = recent_ledger(places, ["batch", "end_offset"], batches=2)
    assert sorted(rows.column("batch").to_pylist()) == [4, 5]
    assert len(read) == 2


def test_the_ledgers_files_carry_no_statistics_and_every_reader_still_finds_their_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.dataset as ds
    from deltalake import DeltaTable

    from strata.store.ledger import ledger_file_batch

    places = _places(tmp_path)
    for batch in (1, 2, 3):
        rows = [_ingest(0, batch * 10 - 10, batch * 10, batch), _ingest(1, batch - 1, batch, 1)]
        assert commit_ledger(places, batch, rows)
    table = DeltaTable(places.ledger.uri)
    adds = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    # Each open of the ledger parses its files' statistics: it records none, and no
    # reader is led to skip a file by statistics of some columns only.
    assert [a["num_records"] for a in adds] == [None, None, None]
    assert sorted(ledger_file_batch(a["path"]) for a in adds) == [1, 2, 3]
    found = table.to_pyarrow_dataset().to_table(
        filter=(ds.field("topic") == "clicks") & (ds.field("partition") == 1)
    )
    assert sorted(found.column("batch").to_pylist()) == [1, 2, 3]
    assert table.to_pyarrow_table(filters=[("batch", ">", 1)]).num_rows == 4
    assert read_ledger(places).num_rows == 6
    # A compaction's file is named otherwise, and carries statistics: no batch by name.
    assert ledger_file_batch("part-c0000000001-abc.parquet") is None


def test_a_ledger_commit_damaged_by_hand_stops_with_the_file_to_restore(tmp_path):
    from pathlib import Path

    from strata.errors import LedgerDamaged
    from strata.store.ledger import committed_columns

    places = _places(tmp_path)
    commit_ledger(places, 1, [_ingest(0, 0, 10, 1)], columns=[["a", "string"]])
    log = Path(places.ledger.uri) / "_delta_log" / f"{0:020d}.json"
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    for entry in entries:
        if "commitInfo" in entry:
            entry["commitInfo"]["strata.columns"] = '[["a", "str'  # cut short
            entry["commitInfo"][STATE_KEY] = "{oops"
    log.write_text("\n".join(json.dumps(e) for e in entries) + "\n")

    for read in (committed_columns, ledger_state):
        with pytest.raises(LedgerDamaged) as stopped:
            read(places)
        message = str(stopped.value)
        assert "_delta_log/00000000000000000000.json was edited or damaged" in message
        assert "commit of batch 1" in message and "Restore that file" in message
