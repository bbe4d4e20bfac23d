"""A batch's Delta tables: created with their first files in one commit, opened once."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable

from strata.batch.commit import commit_table, open_tables, tables_done
from strata.batch.plan import BatchPlan
from strata.batch.reconcile import RANGES_KEY, reconcile_tables
from strata.batch.task import RangeResult
from strata.batch.write import PartitionedWriter
from strata.errors import ReconcileError
from strata.schema.avro import RAW_SCHEMA
from strata.store.delta import BATCH_KEY, create_with_files, ensure_table, up_to_date
from strata.store.ledger import STATE_KEY, commit_ledger, ledger_state, read_ledger, unread_row
from strata.store.ranges import OffsetRange


def _places(tmp_path):
    from tests.conftest import clicks_config

    cfg = clicks_config(tmp_path)
    return cfg.places(), cfg.schemas


def raw_files(uri, batch, partitions, run_id=""):
    """The raw copy's files of a batch: one row per entry of `partitions`, 2 rows a file."""
    n = len(partitions)
    rows = pa.table(
        [
            pa.array(["t"] * n),
            pa.array(partitions, pa.int32()),
            pa.array(range(n), pa.int64()),
            pa.nulls(n, pa.timestamp("ms", tz="UTC")),
            pa.nulls(n, pa.binary()),
            pa.array([b"{}"] * n, pa.binary()),
            pa.nulls(n, RAW_SCHEMA.field("_headers").type),
            pa.array([batch] * n, pa.int64()),
            pa.nulls(n, pa.string()),
        ],
        schema=RAW_SCHEMA,
    )
    writer = PartitionedWriter(
        pafs.LocalFileSystem(), uri, RAW_SCHEMA, [], batch, "t00000", 1, 2, 1 << 20, run_id=run_id
    )
    writer.write(rows)
    return writer.close()


def test_a_new_table_is_created_with_the_batchs_files_in_one_commit(tmp_path):
    uri = str(tmp_path / "clicks_raw")
    files = raw_files(uri, 1, [0, 0, 1])
    assert (
        create_with_files(uri, RAW_SCHEMA, [], {}, "clicks_raw", files, "clicks", 1, {"k": 7})
        is None
    )
    table = DeltaTable(uri)
    assert table.version() == 0
    assert table.transaction_version("clicks") == 1
    assert table.metadata().name == "clicks_raw"
    assert table.to_pyarrow_table().num_rows == 3
    [commit] = table.history()
    assert commit[BATCH_KEY] == 1 and json.loads(commit["k"]) == 7


def test_creating_a_table_that_stands_commits_nothing_and_hands_it_over(tmp_path):
    uri = str(tmp_path / "clicks_raw")
    first = raw_files(uri, 1, [0])
    assert create_with_files(uri, RAW_SCHEMA, [], {}, "clicks_raw", first, "clicks", 1, {}) is None
    # A second runner of the same batch, which saw no table when it began.
    second = raw_files(uri, 1, [0, 1], run_id="other")
    standing = create_with_files(uri, RAW_SCHEMA, [], {}, "clicks_raw", second, "clicks", 1, {})
    assert standing is not None and standing.version() == 0
    assert DeltaTable(uri).to_pyarrow_table().num_rows == 1


def test_a_table_that_stood_before_the_tasks_is_committed_on_its_newest_version(tmp_path):
    places, schemas = _places(tmp_path)
    uri = places.table("raw").uri
    table = ensure_table(uri, RAW_SCHEMA, [], places.options, "clicks_raw")
    [opened] = open_tables(places, ("raw",)).values()
    # Another batch commits while this one's tasks run: the handle is behind it.
    other = ensure_table(uri, RAW_SCHEMA, [], places.options, "clicks_raw")
    from strata.store.delta import commit_files

    commit_files(other, RAW_SCHEMA, [], raw_files(uri, 1, [0]), "clicks", 1, {})
    files = raw_files(uri, 2, [0, 1])
    added, handle = commit_table(places, schemas, "raw", files, 2, {}, None, opened)
    assert added == [] and handle is opened
    assert tables_done(up_to_date({"raw": handle}), "clicks", 2) == {"raw": True}
    assert DeltaTable(uri).to_pyarrow_table().num_rows == 3
    assert table.version() == 0  # an open handle is left where it was


def test_a_table_none_opened_is_created_and_counted_from_the_files_it_was_created_with(
    tmp_path,
):
    places, schemas = _places(tmp_path)
    handles = open_tables(places, ("raw",))
    assert handles == {"raw": None}
    assert tables_done(handles, "clicks", 1) == {"raw": False}
    uri = places.table("raw").uri
    files = raw_files(uri, 1, [0, 0, 1])
    r = RangeResult("t", 0, 0, 2, messages=2)
    s = RangeResult("t", 1, 0, 1, messages=1)
    meta = {RANGES_KEY: [vars(r), vars(s)]}
    added, handle = commit_table(places, schemas, "raw", files, 1, meta, None, None)
    assert added == [] and handle is None
    assert tables_done(open_tables(places, ("raw",)), "clicks", 1) == {"raw": True}
    plan = BatchPlan("clicks", 1, [OffsetRange("t", 0, 0, 2), OffsetRange("t", 1, 0, 1)], [])
    refs = {"raw": places.table("raw")}
    reconcile_tables(refs, plan, [r, s], None, {"raw": None}, {"raw": files})
    # The files are read: a file that lost rows since is found out, as through the log.
    raw_files(uri, 1, [0])  # the same names: the first file now holds one row
    with pytest.raises(ReconcileError, match="the raw table holds 1 rows of batch 1"):
        reconcile_tables(refs, plan, [r, s], None, {"raw": None}, {"raw": files})


def test_the_first_ledger_commit_creates_the_ledger_with_its_rows_and_state(tmp_path):
    places, _ = _places(tmp_path)
    row = unread_row("ingest", "clicks", 0, 0, 10, 0, None)
    row.update(messages=10, rows=10)
    assert commit_ledger(places, 1, [row])
    table = DeltaTable(places.ledger.uri)
    assert table.version() == 0 and table.transaction_version("clicks") == 1
    assert STATE_KEY in table.history(1)[0]
    assert ledger_state(places).committed == {("clicks", 0): 10}
    assert read_ledger(places).num_rows == 1
    # Another attempt of the batch commits nothing, and its file is not left behind.
    assert not commit_ledger(places, 1, [row])
    assert read_ledger(places).num_rows == 1
