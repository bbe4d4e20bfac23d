"""Every maintenance command through the `strata` command line, on every table format.

Each command runs as its own process, as an operator or a scheduler runs it, and what
it printed (the lines people read and the JSON line) is checked against what it did to
the tables. Then the maintenance DAG runs the same steps under `dag.test()`. A report
that cannot be printed on one format fails here, not in the field.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from strata.catalog.metastore import MetastoreClient
from strata.store.locations import GENERATION, current_locations, new_stamp
from strata.store.tables import dataset
from tests.conftest import expected_offsets
from tests.maintenance_runs import FORMATS, load_dags, small_batches, task_result, task_states


def files_per_partition(cfg, which: str = "table") -> Counter[str]:
    """How many files each partition of a table reads now, whatever its format."""
    found = dataset(cfg.places().table(which))
    counts: Counter[str] = Counter()
    for path in [] if found is None else found.files:
        counts["/".join(s for s in path.split("/") if s.startswith(("dt=", "hr=")))] += 1
    return counts


def plant_never_committed(cfg) -> Path:
    """What a killed attempt left in the data table: a file no commit holds or ever can.

    For Delta and Iceberg, a file of batch 1 (which the table holds) beside its files;
    for plain Parquet, a new directory of a compaction killed before its move.
    """
    root = Path(cfg.location("table"))
    some = next(root.rglob("part-b0000000001-*.parquet"))
    if cfg.table_format == "parquet":
        partition = some.relative_to(root).parent
        if partition.name.startswith(GENERATION):
            partition = partition.parent
        killed = root / partition / f"{GENERATION}{new_stamp()}"
        killed.mkdir()
        orphan = killed / "part-c20260101000000deadbeef-0000-a0-f000.snappy.parquet"
    else:
        orphan = some.with_name(
            f"part-b0000000001-t00099-a9-{new_stamp()[-8:]}-f000.snappy.parquet"
        )
    shutil.copy(some, orphan)
    return orphan


def last_json(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The JSON line a command printed last (`--json`)."""
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_maintenance_command_says_what_it_did_and_does_it_on_every_format(
    fmt, make_pipeline, broker, spark, metastore, airflow_db, monkeypatch
):
    p = make_pipeline(
        partitions=2, overrides={"table_format": fmt, "metastore": {"uri": metastore.uri}}
    )
    expected = expected_offsets(small_batches(p, broker, spark, 2))
    cfg = p.cfg()
    before = files_per_partition(cfg)
    assert len(before) == 3 and min(before.values()) >= 2, before
    orphan = plant_never_committed(cfg)

    compacted = p.cli("compact", "--older-than", "0s", "--json")
    body = last_json(compacted)
    merged = {e["partition"]: e for e in body["partitions"] if e["table"] == "table"}
    assert sorted(merged) == sorted(before)
    assert {e["outcome"] for e in merged.values()} == {"compacted"}
    assert all(merged[k]["files_before"] == n for k, n in before.items())
    assert all(e["files_after"] == 1 for e in merged.values())
    for partition in before:
        assert f"table {partition}: merged {before[partition]} files" in compacted.stdout
    assert files_per_partition(cfg) == Counter(dict.fromkeys(before, 1))
    assert p.landed() == expected

    registered = last_json(p.cli("register", "--json"))
    assert p.name in registered["created"] + registered["updated"] + registered["unchanged"]
    database = cfg.metastore.database
    with MetastoreClient(metastore.uri, 30) as client:
        assert client.get_table(database, p.name) is not None
        if fmt == "parquet":
            # Every compacted partition is registered at its directory in use.
            names = client.partition_names(database, p.name)
            parts = client.partitions_by_names(database, p.name, names)
            moved = current_locations(*cfg.places().table("table").filesystem())
            assert sorted(names) == sorted(moved) == sorted(before)
            for name, part in zip(names, parts, strict=True):
                assert part.sd.location.endswith("/" + moved[name])

    checked = p.cli("checkpoint", "--json")
    body = last_json(checked)
    assert body["tables"]["ledger"]["version"] is not None
    assert "ledger: checkpoint at version" in checked.stdout
    assert (Path(cfg.location("ledger")) / "_delta_log" / "_last_checkpoint").exists()
    for which in ("table", "raw", "quarantine"):
        figures = body["tables"][which]
        if fmt == "delta":
            assert figures["version"] is not None and not figures["skipped"]
        else:
            assert figures["version"] is None and "has no log to checkpoint" in figures["skipped"]
            assert f"{which}: skipped, " in checked.stdout

    on_disk = {f for f in Path(cfg.location("table")).rglob("*.parquet")}
    dry = p.cli("vacuum", "--dry-run", "--json")
    body = last_json(dry)
    assert body["dry_run"] and body["tables"]["table"]["never_committed"] == 1
    assert "vacuum (dry run)" in dry.stdout and "table: would delete 0 removed files" in dry.stdout
    assert {f for f in Path(cfg.location("table")).rglob("*.parquet")} == on_disk
    vacuumed = p.cli("vacuum", "--json")
    body = last_json(vacuumed)
    assert body["retention_hours"] == 168 and not body["dry_run"]
    table = body["tables"]["table"]
    assert (table["never_committed"], table["removed_files"], table["unknown_left"]) == (1, 0, [])
    assert not orphan.exists()
    # What compaction replaced stays for readers until the retention has passed.
    assert {f for f in Path(cfg.location("table")).rglob("*.parquet")} == on_disk - {orphan}
    assert "table: deleted 0 removed files, 1 never committed" in vacuumed.stdout
    assert set(body["tables"]) == {"table", "raw", "quarantine", "ledger"}
    assert p.landed() == expected

    # The maintenance DAG runs the same steps, each its own task.
    again = plant_never_committed(cfg)
    monkeypatch.setenv("STRATA_CONF_DIR", str(p.conf_dir))
    run = load_dags().dags["strata_maintenance"].test()
    assert str(run.state) == "success", task_states(run)
    # Nothing is left to merge in the data table: each partition holds one file.
    partitions = task_result(run, f"compact_{p.name}")["partitions"]
    assert [e for e in partitions if e["table"] == "table"] == []
    assert p.name in task_result(run, f"register_{p.name}")["registered"]
    assert task_result(run, f"checkpoint_{p.name}")["tables"]["ledger"]["version"] is not None
    swept = task_result(run, f"vacuum_{p.name}")["tables"]["table"]
    assert (swept["never_committed"], swept["unknown_left"]) == (1, [])
    assert not again.exists()
    assert files_per_partition(cfg) == Counter(dict.fromkeys(before, 1))
    assert p.landed() == expected
