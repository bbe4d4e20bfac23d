"""What an operator does by hand to a table never loses data silently.

Each test lands batches through the real broker and the `strata` command line, edits a
table as an on-call engineer would (its directory removed, an Iceberg table dropped or
renamed in the metastore, an older copy put back, another table put in its place),
and checks that the next run stops naming the table and the ways out, that each way
out ends with every message read landed once, and that no file of another table is
ever deleted.
"""

from __future__ import annotations

import json
import shutil
import signal
from collections import Counter
from pathlib import Path

import pytest
from pyiceberg.catalog.hive import HiveCatalog

from strata import faults
from strata.store import iceberg
from strata.store.ledger import read_ledger
from tests.conftest import produce_clicks
from tests.faults import armed


def last_json(done) -> dict:
    return json.loads(done.stdout.strip().splitlines()[-1])


def pipeline(make_pipeline, metastore, table_format: str, partitions: int = 2):
    overrides: dict = {"table_format": table_format}
    if table_format == "iceberg":
        overrides["metastore"] = {"uri": metastore.uri}
    return make_pipeline(partitions=partitions, overrides=overrides)


def offsets(*produced: dict[int, int]) -> Counter[tuple[int, int]]:
    """Every offset of the partitions, produced in the rounds given (each round's counts)."""
    ends: Counter[int] = Counter()
    for per in produced:
        ends.update(per)
    return Counter((p, o) for p, n in ends.items() for o in range(n))


def after(before: dict[int, int], produced: dict[int, int]) -> Counter[tuple[int, int]]:
    """The offsets a later round produced, after the earlier round's."""
    return Counter(
        (p, o) for p, n in produced.items() for o in range(before.get(p, 0), before.get(p, 0) + n)
    )


def ran(p, *args: str):
    done = p.cli(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def stopped(p, *args: str, code: int = 1) -> str:
    """Run a command that must stop; its error line."""
    done = p.cli(*args, "--json")
    assert done.returncode == code, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    return last_json(done)["error"]


def catalog(metastore) -> HiveCatalog:
    """A Hive catalog of the test's own, as an operator's tool (or Trino) would use."""
    return HiveCatalog("operator", uri=metastore.uri)


def data_offsets(p) -> Counter[tuple[int, int]]:
    t = p.table_rows("table", ["_partition", "_offset"])
    return Counter(zip(t.column("_partition").to_pylist(), t.column("_offset").to_pylist()))


def land_then_delete_the_data_table(p, broker):
    """Batch 1 lands; the data table's directory is removed by hand; new events arrive."""
    first = produce_clicks(broker, p.topic, 2, 300, malformed=3)
    ran(p, "run")
    shutil.rmtree(p.cfg().location("table"))
    second = produce_clicks(broker, p.topic, 2, 300, seed=8)
    return first, second


@pytest.mark.parametrize("table_format", ["delta", "parquet", "iceberg"])
def test_a_data_table_deleted_by_hand_stops_the_run_until_its_loss_is_recorded(
    make_pipeline, broker, metastore, table_format
):
    p = pipeline(make_pipeline, metastore, table_format)
    first, second = land_then_delete_the_data_table(p, broker)

    error = stopped(p, "run")
    assert error.startswith(f"pipeline {p.name}: nothing was read or written."), error
    assert f"the data table of {p.name} (" in error and ") is gone" in error, error
    assert "the ledger holds batches up to 1" in error
    assert f"strata ledger reset --pipeline {p.name} --table table --reason TEXT" in error
    rebuild = f"strata replay --pipeline {p.name} --rebuild --reason TEXT"
    # A plain Parquet table cannot replace a range's rows: no replay to offer.
    assert (rebuild in error) == (table_format != "parquet"), error
    # Nothing was read: the ledger still holds batch 1 alone, and status says why.
    assert {r["batch"] for r in read_ledger(p.cfg().places()).to_pylist()} == {1}
    status = p.cli("status")
    assert status.returncode == 1
    assert f"TABLE GONE: the data table of {p.name}" in status.stdout
    assert f"strata ledger reset --pipeline {p.name}" in status.stderr

    reset = ran(p, "ledger", "reset", "--table", "table", "--reason", "INC-7 accepted")
    assert "table reset, recorded as ledger batch 2" in reset.stdout
    rows = [r for r in read_ledger(p.cfg().places()).to_pylist() if r["batch"] == 2]
    assert {(r["kind"], r["partition"]) for r in rows} == {("reset", 0), ("reset", 1)}
    assert all("INC-7 accepted" in r["note"] and "batches up to 1" in r["note"] for r in rows)
    ran(p, "run")
    # The loss is recorded, not silent; what came after lands once.
    assert data_offsets(p) == after(first, second)
    assert p.raw_copies() == offsets(first, second)
    status = ran(p, "status")
    assert "EDIT: batch 2 reset" in status.stdout


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_data_table_deleted_by_hand_is_rebuilt_from_the_raw_copy_by_a_recorded_replay(
    make_pipeline, broker, metastore, table_format
):
    p = pipeline(make_pipeline, metastore, table_format)
    first, second = land_then_delete_the_data_table(p, broker)
    assert p.cli("run").returncode == 1

    rebuilt = ran(p, "replay", "--rebuild", "--reason", "INC-7 table deleted by hand")
    assert "replayed" in rebuilt.stdout
    assert p.landed() == offsets(first)
    [row] = {r["kind"] for r in read_ledger(p.cfg().places()).to_pylist() if r["batch"] == 2}
    assert row == "replay"
    ran(p, "run")
    assert p.landed() == offsets(first, second)
    assert p.raw_copies() == offsets(first, second)
    assert ran(p, "status").returncode == 0


def iceberg_files(p) -> set[str]:
    """Every file under the data table's place (to prove none of another table's goes)."""
    root = p.cfg().location("table")
    return {
        str(f.relative_to(root)) for f in __import__("pathlib").Path(root).rglob("*") if f.is_file()
    }


def test_an_iceberg_table_dropped_in_the_metastore_stops_the_run_and_is_registered_again(
    make_pipeline, broker, metastore
):
    p = pipeline(make_pipeline, metastore, "iceberg")
    first = produce_clicks(broker, p.topic, 2, 300, malformed=3)
    ran(p, "run")
    database = p.cfg().metastore.database
    # A Hive drop without purge: the entry goes, the metadata and files stay.
    catalog(metastore).drop_table((database, p.name))
    before = iceberg_files(p)
    second = produce_clicks(broker, p.topic, 2, 300, seed=8)

    error = stopped(p, "run")
    assert f"the data table of {p.name} (`{database}.{p.name}` at " in error, error
    assert "dropped in the metastore?" in error, error
    assert f"strata ledger restore --pipeline {p.name} --table table" in error
    assert "--rebuild" not in error and "ledger reset" not in error
    # Nothing was created in its place, and nothing of it was deleted.
    assert iceberg_files(p) == before
    # Vacuum and a reset refuse to touch a place that holds the dropped table's files.
    refused = stopped(p, "ledger", "reset", "--table", "table", "--reason", "oops")
    assert "holds another table's files (metadata/" in refused, refused

    restored = ran(p, "ledger", "restore", "--table", "table")
    assert f"is registered as {p.name} again, from metadata/" in restored.stdout
    ran(p, "run")
    assert p.landed() == offsets(first, second)
    ran(p, "vacuum")
    assert p.landed() == offsets(first, second)
    assert before <= iceberg_files(p) | {f for f in before if not f.startswith("dt=")}


def test_an_iceberg_table_renamed_in_the_metastore_is_named_and_none_of_its_files_is_deleted(
    make_pipeline, broker, metastore
):
    p = pipeline(make_pipeline, metastore, "iceberg")
    first = produce_clicks(broker, p.topic, 2, 300, malformed=3)
    ran(p, "run")
    database = p.cfg().metastore.database
    operator = catalog(metastore)
    operator.rename_table((database, p.name), (database, f"{p.name}_old"))
    old_rows = operator.load_table((database, f"{p.name}_old")).scan().to_arrow().num_rows
    second = produce_clicks(broker, p.topic, 2, 300, seed=8)

    error = stopped(p, "run")
    assert f"is in the metastore as {database}.{p.name}_old now: renamed? Rename it back" in error
    restore = stopped(p, "ledger", "restore", "--table", "table")
    assert f"ALTER TABLE {database}.{p.name}_old RENAME TO {database}.{p.name}" in restore
    ran(p, "vacuum")
    # The renamed table stays whole and readable: no file it names was deleted.
    assert operator.load_table((database, f"{p.name}_old")).scan().to_arrow().num_rows == old_rows

    operator.rename_table((database, f"{p.name}_old"), (database, p.name))
    ran(p, "run")
    assert p.landed() == offsets(first, second)


def put_back(saved: Path, where: str) -> None:
    """An operator's restore of a directory from an older copy."""
    shutil.rmtree(where)
    shutil.copytree(saved, where)


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_table_or_ledger_put_back_from_an_older_copy_stops_the_run(
    make_pipeline, broker, metastore, tmp_path, table_format
):
    p = pipeline(make_pipeline, metastore, table_format)
    cfg = p.cfg()
    produce_clicks(broker, p.topic, 2, 200)
    ran(p, "run")
    shutil.copytree(cfg.location("table"), tmp_path / "table-b1")
    shutil.copytree(cfg.location("ledger"), tmp_path / "ledger-b1")
    for seed in (8, 9):
        produce_clicks(broker, p.topic, 2, 200, seed=seed)
        ran(p, "run")
    produce_clicks(broker, p.topic, 2, 200, seed=10)

    # The data table as it was after batch 1: the rows of batches 2 and 3 are not in it.
    if table_format == "iceberg":
        # An Iceberg table goes back by its metadata: rolled back to batch 1's snapshot
        # (through a catalog that takes the metastore's lock as Iceberg's Java client does;
        # pyiceberg's own asks in a way this metastore refuses).
        table = iceberg.catalog(cfg.places().table("table")).load_table(
            (cfg.metastore.database, p.name)
        )
        newest = table.current_snapshot().snapshot_id
        first = next(s for s in table.snapshots() if s.summary.get("strata.batch") == "1")
        table.manage_snapshots().rollback_to_snapshot(first.snapshot_id).commit()
    else:
        saved = tmp_path / "table-b3"
        shutil.copytree(cfg.location("table"), saved)
        put_back(tmp_path / "table-b1", cfg.location("table"))
    error = stopped(p, "run")
    assert "holds batches up to 1 only, but batch 3 was committed to" in error, error
    assert "it is an older copy" in error
    if table_format == "iceberg":
        table.refresh().manage_snapshots().set_current_snapshot(newest).commit()
    else:
        put_back(saved, cfg.location("table"))

    # The ledger as it was after batch 1: the tables hold batches it has no record of.
    put_back(tmp_path / "ledger-b1", cfg.location("ledger"))
    error = stopped(p, "run")
    assert f"holds batch 3, but {p.name}'s ledger" in error, error
    assert "ends at batch 1: it is older than the tables" in error
    assert "restore the ledger" in error
    assert "ledger reset" not in error


def put_another_table(p, metastore, table_format: str) -> None:
    """Another table at the place the data table will take, before the pipeline's first run."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import write_deltalake

    place = p.cfg().location("table")
    rows = pa.table({"id": [1, 2, 3]})
    if table_format == "delta":
        write_deltalake(place, rows)
    elif table_format == "parquet":
        Path(place, "dt=2020-01-01", "hr=00").mkdir(parents=True)
        pq.write_table(rows, f"{place}/dt=2020-01-01/hr=00/data.parquet")
    else:
        cfg = p.cfg()
        other = iceberg.catalog(cfg.places().table("table"))
        other.create_namespace_if_not_exists(cfg.metastore.database)
        made = other.create_table(
            (cfg.metastore.database, f"{p.name}_other"), rows.schema, location=f"file://{place}"
        )
        made.append(rows)


@pytest.mark.parametrize("table_format", ["delta", "parquet", "iceberg"])
def test_no_table_is_created_where_another_tables_files_are(
    make_pipeline, broker, metastore, table_format
):
    p = pipeline(make_pipeline, metastore, table_format)
    put_another_table(p, metastore, table_format)
    before = {
        f: f.stat().st_size for f in Path(p.cfg().location("table")).rglob("*") if f.is_file()
    }
    produce_clicks(broker, p.topic, 2, 100)

    error = stopped(p, "run")
    assert "the data table of" in error, error
    assert "holds another table's files" in error or "holds files but no batch of" in error, error
    # The other table is as it was: not written to, nothing of it deleted.
    after = {f: f.stat().st_size for f in Path(p.cfg().location("table")).rglob("*") if f.is_file()}
    assert after == before


@pytest.mark.parametrize(
    "table_format,crash_at",
    [
        ("delta", faults.AFTER_RAW_COMMIT),
        ("iceberg", faults.AFTER_QUARANTINE_COMMIT),
        ("parquet", faults.AFTER_FILES),
    ],
)
def test_a_state_folder_removed_under_an_unfinished_batch_loses_and_doubles_nothing(
    make_pipeline, broker, metastore, table_format, crash_at
):
    p = pipeline(make_pipeline, metastore, table_format)
    first = produce_clicks(broker, p.topic, 2, 300, malformed=3)
    crashed = p.cli("run", env=p.env(**armed(crash_at=crash_at)))
    assert crashed.returncode == -signal.SIGKILL
    more = produce_clicks(broker, p.topic, 2, 300, seed=8)
    # The plans, leases and locks, removed by hand while batch 1 is unfinished.
    shutil.rmtree(p.cfg().location("state"))

    finished = ran(p, "run", "--json")
    # A table that committed batch 1 recorded what it read: the batch is finished as it
    # began, not planned again over other offsets.
    assert last_json(finished)["batch"] == 1
    ran(p, "run")
    assert p.landed() == offsets(first, more)
    assert p.raw_copies() == offsets(first, more)
    ledger = read_ledger(p.cfg().places()).to_pylist()
    assert sum(r["end_offset"] - r["start_offset"] for r in ledger) == sum(
        offsets(first, more).values()
    )
