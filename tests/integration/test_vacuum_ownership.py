"""Vacuum never deletes a file another table still names, whatever is at a table's place.

An operator changes the lakehouse beside Strata: an Iceberg table renamed or dropped
(without purge) in the metastore keeps its files where they were, and a new table is
then created at the same place; a Delta location ends up holding another table's log.
Each case is made with the readers' own clients (pyiceberg's Hive catalog, deltalake),
the new table the way Strata's store functions create one; then `strata vacuum` runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable
from deltalake.transaction import AddAction, RemoveAction
from pyiceberg.table import StaticTable

from strata.config import PipelineConfig
from strata.run import run_batch
from strata.schema.avro import table_layout
from strata.store import iceberg
from strata.store.parquet import write_file
from tests.conftest import iceberg_table, produce_clicks


@dataclass
class OtherTable:
    """A table that is not the pipeline's, at the pipeline's data table's place.

    Attributes:
        files: Every file it holds (data, log or metadata), on disk.
        rows: Reads it as its own readers do, at every version they may ask for.
    """

    files: set[Path]
    rows: Callable[[], list[tuple]]


def _every_file(where: str) -> set[Path]:
    return {f for f in Path(where).rglob("*") if f.is_file()}


def _sorted_rows(table: pa.Table) -> list[tuple]:
    names = sorted(table.column_names)
    return sorted(tuple(r[n] for n in names) for r in table.select(names).to_pylist())


def _iceberg_displaced(cfg: PipelineConfig, how: str) -> OtherTable:
    """The data table renamed away (or dropped, its files kept), and a new table made at
    its place holding a later batch, as the store functions make one."""
    old = iceberg_table(cfg, "table")
    metadata = old.metadata_location
    database, name = cfg.metastore.database, old.name()[-1]
    if how == "renamed":
        old.catalog.rename_table((database, name), (database, f"{name}_old"))
    else:
        old.catalog.drop_table((database, name))
    files = _every_file(cfg.location("table"))
    ref = cfg.places().table("table")
    schema, partition_by = table_layout(cfg.schemas(), "table")
    made = iceberg.create_table(ref, schema, partition_by)
    assert iceberg.commit_batch(ref, cfg.name, made, [], 2, {}) is not None
    assert str(made.metadata.table_uuid) != str(old.metadata.table_uuid)

    def rows() -> list[tuple]:
        # Read from its own metadata, as a reader of the renamed or dropped table does.
        return _sorted_rows(StaticTable.from_metadata(metadata).scan().to_arrow())

    return OtherTable(files, rows)


def _delta_displaced(cfg: PipelineConfig) -> OtherTable:
    """The data table moved away by hand, and another table's log at its place: one that
    keeps what it removed for 30 days of time travel, and removed a file ten days ago."""
    where = cfg.location("table")
    Path(where).rename(f"{where}-moved")
    schema = pa.schema([("id", pa.int64())])
    keep = {"delta.deletedFileRetentionDuration": "interval 30 days"}
    other = DeltaTable.create(where, schema=schema, configuration=keep)
    fs = pafs.LocalFileSystem()
    first = write_file(fs, where, "part-00000-first.parquet", pa.table({"id": [1, 2]}), {})
    second = write_file(fs, where, "part-00001-second.parquet", pa.table({"id": [3]}), {})
    now = int(time.time() * 1000)
    other.create_write_transaction(
        [AddAction(first.path, first.size, {}, now, True, None)],
        mode="append",
        schema=other.schema(),
    )
    ten_days_ago = now - 10 * 86_400_000
    DeltaTable(where).create_write_transaction(
        [
            RemoveAction(first.path, True, ten_days_ago, first.size, None),
            AddAction(second.path, second.size, {}, now, True, None),
        ],
        mode="append",
        schema=other.schema(),
    )

    def rows() -> list[tuple]:
        return [
            *_sorted_rows(DeltaTable(where).to_pyarrow_table()),
            *_sorted_rows(DeltaTable(where, version=1).to_pyarrow_table()),
        ]

    return OtherTable(_every_file(where), rows)


CASES: dict[str, tuple[str, Callable[[PipelineConfig], OtherTable]]] = {
    "iceberg table renamed": ("iceberg", lambda cfg: _iceberg_displaced(cfg, "renamed")),
    "iceberg table dropped": ("iceberg", lambda cfg: _iceberg_displaced(cfg, "dropped")),
    "delta log of another table": ("delta", _delta_displaced),
}


@pytest.mark.parametrize("case", list(CASES))
def test_vacuum_refuses_a_place_holding_another_tables_files_and_deletes_none_of_them(
    case, make_pipeline, broker, spark, metastore
):
    fmt, displace = CASES[case]
    p = make_pipeline(
        partitions=2, overrides={"table_format": fmt, "metastore": {"uri": metastore.uri}}
    )
    produce_clicks(broker, p.topic, 2, 200)
    run_batch(p.cfg(), session=lambda _: spark)
    cfg = p.cfg()
    other = displace(cfg)
    before = other.rows()
    assert before

    done = p.cli("vacuum")
    assert done.returncode == 1, (done.stdout, done.stderr)
    told = done.stderr
    assert f"pipeline {p.name}: vacuum deleted nothing: the data table of {p.name} at " in told
    assert cfg.location("table") in told and "another table" in told
    assert f"move the data table with `table` in {p.name}.yaml" in told
    if fmt == "iceberg":
        assert "also holds another Iceberg table's metadata (table uuid " in told
    assert {f for f in other.files if not f.exists()} == set()
    assert other.rows() == before
