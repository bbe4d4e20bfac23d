"""Registration in the real Hive Metastore thrift service (from the pyspark wheel's jars)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

from strata.catalog.metastore import MetastoreClient
from strata.catalog.register import location_uri
from strata.local.service import free_port
from strata.run import run_batch
from strata.schema.avro import TABLE_SUFFIXES
from tests.conftest import START_MS, produce_clicks
from tests.trino_reads import queries_of


def tables(service, database: str, pipeline: str) -> dict:
    with MetastoreClient(service.uri, 30) as client:
        return {s: client.get_table(database, pipeline + s) for s in TABLE_SUFFIXES.values()}


def test_a_run_registers_its_four_tables_as_delta_for_trino(
    make_pipeline, broker, spark, metastore
):
    p = make_pipeline(
        partitions=2, overrides={"metastore": {"uri": metastore.uri, "database": "lake"}}
    )
    produce_clicks(broker, p.topic, 2, 300)
    outcome = run_batch(p.cfg(), session=lambda _: spark)
    assert outcome.register_error is None
    assert outcome.registered.startswith("metastore database lake: created ")
    cfg = p.cfg()
    for which, suffix in TABLE_SUFFIXES.items():
        table = tables(metastore, "lake", p.name)[suffix]
        assert table is not None, suffix
        assert table.tableType == "EXTERNAL_TABLE"
        assert table.parameters["spark.sql.sources.provider"] == "delta"
        assert table.parameters["EXTERNAL"] == "TRUE"
        assert table.sd.location == location_uri(cfg.location(which))
        assert table.sd.location.startswith("file:/")


def test_publishing_again_changes_nothing_and_drift_is_corrected(
    make_pipeline, broker, spark, metastore
):
    p = make_pipeline(partitions=1, overrides={"metastore": {"uri": metastore.uri}})
    produce_clicks(broker, p.topic, 1, 50)
    run_batch(p.cfg(), session=lambda _: spark)
    before = tables(metastore, "strata", p.name)

    again = p.cli("register", "--json")
    assert again.returncode == 0, again.stderr
    body = json.loads(again.stdout.strip().splitlines()[-1])
    assert body["created"] == [] and body["updated"] == [] and len(body["unchanged"]) == 4
    assert tables(metastore, "strata", p.name) == before

    # Someone points the table elsewhere by hand: registration puts it back.
    with MetastoreClient(metastore.uri, 30) as client:
        drifted = client.get_table("strata", p.name)
        drifted.sd.location = "file:/elsewhere"
        client.alter_table(drifted)
    fixed = p.cli("register", "--json")
    assert json.loads(fixed.stdout.strip().splitlines()[-1])["updated"] == [p.name]
    assert tables(metastore, "strata", p.name)[""].sd.location == location_uri(
        p.cfg().location("table")
    )


def test_a_metastore_down_during_a_run_loses_nothing_and_the_next_run_registers(
    make_pipeline, broker, metastore
):
    dead = f"thrift://127.0.0.1:{free_port()}"
    p = make_pipeline(partitions=2, overrides={"metastore": {"uri": dead, "timeout_s": 3}})
    per = produce_clicks(broker, p.topic, 2, 400)
    run = p.cli("run", "--json")
    assert run.returncode == 1
    committed = "batch 1 is committed; registering the tables in the metastore failed: "
    assert committed + "cannot reach the metastore" in run.stderr
    assert f"`strata register --pipeline {p.name}`" in run.stderr
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["status"] == "committed" and summary["messages"] == sum(per.values())
    assert sum(p.landed().values()) == sum(per.values())

    following = p.cli("run", "--json", env=p.env(STRATA_METASTORE_URI=metastore.uri))
    assert following.returncode == 0, following.stderr
    assert "nothing new to read" in following.stdout
    assert all(t is not None for t in tables(metastore, "strata", p.name).values())


def test_metastore_up_status_down_from_the_command_line(tmp_path):
    strata = str(Path(sys.executable).parent / "strata-local")
    port = str(free_port())
    where = ["--dir", str(tmp_path / "ms"), "--json"]
    up = subprocess.run(
        [strata, "metastore", "up", "--port", port, *where],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert up.returncode == 0, up.stderr
    try:
        state = json.loads(up.stdout.strip().splitlines()[-1])
        assert state["uri"] == f"thrift://127.0.0.1:{port}"
        with MetastoreClient(state["uri"], 30) as client:
            assert "default" in client._client.get_all_databases()  # noqa: SLF001
        status = subprocess.run(
            [strata, "metastore", "status", *where], capture_output=True, text=True
        )
        assert json.loads(status.stdout.strip().splitlines()[-1])["status"] == "up"
    finally:
        down = subprocess.run(
            [strata, "metastore", "down", *where], capture_output=True, text=True, timeout=60
        )
    assert json.loads(down.stdout.strip().splitlines()[-1])["stopped"] is True
    status = subprocess.run([strata, "metastore", "status", *where], capture_output=True, text=True)
    assert json.loads(status.stdout.strip().splitlines()[-1])["status"] == "down"


PARQUET = (
    "org.apache.hadoop.hive.ql.io.parquet.serde.ParquetHiveSerDe",
    "org.apache.hadoop.hive.ql.io.parquet.MapredParquetInputFormat",
    "org.apache.hadoop.hive.ql.io.parquet.MapredParquetOutputFormat",
)


def test_plain_parquet_tables_list_exactly_their_partitions(
    make_pipeline, broker, spark, metastore
):
    p = make_pipeline(
        partitions=2,
        overrides={
            "table_format": "parquet",
            "metastore": {"uri": metastore.uri, "partition_batch": 2},
        },
    )
    produce_clicks(broker, p.topic, 2, 900, hours=5, late=3)
    outcome = run_batch(p.cfg(), session=lambda _: spark)
    assert outcome.register_error is None, outcome.register_error
    location = location_uri(p.cfg().location("table"))
    on_disk = sorted(
        f"{d.name}/{h.name}"
        for d in Path(p.cfg().location("table")).glob("dt=*")
        for h in d.glob("hr=*")
    )
    assert len(on_disk) == 5

    with MetastoreClient(metastore.uri, 30) as client:
        assert sorted(client.partition_names("strata", p.name)) == on_disk
        for part in client.partitions("strata", p.name):
            assert part.sd.location == f"{location}/dt={part.values[0]}/hr={part.values[1]}"
            assert (
                part.sd.serdeInfo.serializationLib,
                part.sd.inputFormat,
                part.sd.outputFormat,
            ) == PARQUET
        table = client.get_table("strata", p.name)
        assert [k.name for k in table.partitionKeys] == ["dt", "hr"]
        assert ("user_id", "bigint") in [(c.name, c.type) for c in table.sd.cols]
        assert ("_event_time", "timestamp") in [(c.name, c.type) for c in table.sd.cols]
        assert "spark.sql.sources.provider" not in table.parameters
        for suffix in ("_raw", "_quarantine", "_ledger"):
            other = client.get_table("strata", p.name + suffix)
            assert other.sd.serdeInfo.serializationLib == PARQUET[0] and not other.partitionKeys

        # Re-publishing changes nothing.
        again = p.cli("register", "--json")
        body = json.loads(again.stdout.strip().splitlines()[-1])
        assert body["partitions_added"] == [] and body["updated"] == [] and body["partitions"] == 5
        assert sorted(client.partition_names("strata", p.name)) == on_disk

        # A partition dropped by hand comes back with `strata publish` (the old name still works).
        dt, hr = on_disk[2].split("/")
        client._client.drop_partition("strata", p.name, [dt.split("=")[1], hr.split("=")[1]], False)  # noqa: SLF001
        assert on_disk[2] not in client.partition_names("strata", p.name)
        restored = p.cli("publish", "--json")
        assert json.loads(restored.stdout.strip().splitlines()[-1])["partitions_added"] == [
            on_disk[2]
        ]
        assert sorted(client.partition_names("strata", p.name)) == on_disk


def test_a_field_partition_is_registered_after_the_local_hours_and_strays_are_not(
    make_pipeline, broker, spark, metastore
):
    field = {"name": "device", "values": ["mobile", "tablet"], "other": "rest"}
    p = make_pipeline(
        partitions=2,
        overrides={
            "table_format": "parquet",
            "partitioning": {"by": "dt", "timezone": "America/Los_Angeles", "field": field},
            "metastore": {"uri": metastore.uri},
        },
    )
    produce_clicks(broker, p.topic, 2, 300, hours=16)
    root = Path(p.cfg().location("table"))
    # A directory Strata never writes: not a listed value, so never a partition.
    (root / "dt=2025-11-22" / "p_device=laptop").mkdir(parents=True)
    outcome = run_batch(p.cfg(), session=lambda _: spark)
    assert outcome.register_error is None, outcome.register_error

    # 10:00Z on 2025-11-22 to 02:00Z the next day is 02:00 to 18:00 in Los Angeles: one day.
    on_disk = sorted(f"{d.name}/{f.name}" for d in root.glob("dt=*") for f in d.glob("p_device=*"))
    assert on_disk == [
        "dt=2025-11-22/p_device=laptop",
        "dt=2025-11-22/p_device=mobile",
        "dt=2025-11-22/p_device=rest",
        "dt=2025-11-22/p_device=tablet",
    ]
    with MetastoreClient(metastore.uri, 30) as client:
        table = client.get_table("strata", p.name)
        assert [k.name for k in table.partitionKeys] == ["dt", "p_device"]
        assert ("device", "string") in [(c.name, c.type) for c in table.sd.cols]
        assert sorted(client.partition_names("strata", p.name)) == [
            "dt=2025-11-22/p_device=mobile",
            "dt=2025-11-22/p_device=rest",
            "dt=2025-11-22/p_device=tablet",
        ]
    rows = p.table_rows("table", ["device", "p_device"]).to_pylist()
    assert {(r["device"], r["p_device"]) for r in rows} == {
        ("desktop", "rest"),
        ("mobile", "mobile"),
        ("tablet", "tablet"),
    }


def _sent(trino, user: str) -> list[str]:
    """The statements Trino ran for a user, oldest first (its own record of queries)."""
    return [statement for _, _, statement in queries_of(trino, user)]


def test_a_configured_trino_is_told_to_sync_partitions_after_publishing(
    make_pipeline, broker, spark, metastore, trino
):
    user = "etl_" + uuid.uuid4().hex[:6]
    p = make_pipeline(
        partitions=1,
        overrides={
            "table_format": "parquet",
            "metastore": {"uri": metastore.uri},
            "trino": {"url": trino.url, "user": user},
        },
    )
    produce_clicks(broker, p.topic, 1, 100)
    outcome = run_batch(p.cfg(), session=lambda _: spark)
    assert outcome.register_error is None, outcome.register_error
    assert _sent(trino, user) == [
        f"""CALL "hive".system.sync_partition_metadata('strata', '{p.name}', 'ADD')"""
    ]
    assert "1 statement(s) run in Trino" in outcome.registered
    rows = p.table_rows("table").num_rows
    assert trino.query(f"SELECT count(*) FROM hive.strata.{p.name}") == [(rows,)]


def test_delta_tables_are_registered_in_a_trino_on_another_metastore(
    make_pipeline, broker, spark, metastore, trino
):
    # `delta_elsewhere`: the local Trino's Delta catalog on a metastore of its own.
    user = "etl_" + uuid.uuid4().hex[:6]
    p = make_pipeline(
        partitions=1,
        overrides={
            "metastore": {"uri": metastore.uri, "database": "reg_" + uuid.uuid4().hex[:6]},
            "trino": {
                "url": trino.url,
                "user": user,
                "delta_catalog": "delta_elsewhere",
                "register_delta_tables": True,
            },
        },
    )
    database = p.cfg().metastore.database
    trino.query(f"CREATE SCHEMA delta_elsewhere.{database}")
    for seed in (1, 2):
        produce_clicks(broker, p.topic, 1, 50, seed=seed, malformed=2)
        outcome = run_batch(p.cfg(), session=lambda _: spark)
        # The second run's calls find the tables registered: skipped, not an error.
        assert outcome.register_error is None, outcome.register_error
    calls = _sent(trino, user)
    assert len(calls) == 8 and all(
        c.startswith('CALL "delta_elsewhere".system.register_table(') for c in calls
    )
    assert f"table_location => 'file://{p.cfg().location('raw')}'" in calls[1]
    for which, suffix in TABLE_SUFFIXES.items():
        rows = p.table_rows(which).num_rows
        found = trino.query(f"SELECT count(*) FROM delta_elsewhere.{database}.{p.name}{suffix}")
        assert found == [(rows,)] and rows > 0, which


def test_a_runs_registration_reads_back_only_the_partitions_changed_since_the_last(
    make_pipeline, broker, spark, metastore
):
    p = make_pipeline(
        partitions=2, overrides={"table_format": "parquet", "metastore": {"uri": metastore.uri}}
    )
    hour_ms = 3_600_000
    hours = [f"dt=2025-11-22/hr={h}" for h in range(10, 18)]
    # 10:00-16:00: with the hour of lateness, 10:00-14:00 are complete.
    produce_clicks(broker, p.topic, 2, 600, hours=6)
    first = run_batch(p.cfg(), session=lambda _: spark)
    assert first.register_error is None, first.register_error
    with MetastoreClient(metastore.uri, 30) as client:
        record = client.get_table("strata", p.name).parameters["strata.registered"]
    assert json.loads(record)["batch"] == 1

    # Nothing changed: no partition is read back from the metastore.
    idle = run_batch(p.cfg(), session=lambda _: spark)
    assert idle.status == "idle" and idle.register_error is None
    assert "read back" not in idle.registered and "partitions" not in idle.registered

    # 16:00-18:00: completes 14:00 and 15:00, adds 16:00 and 17:00; only the two
    # completed ones are read back and marked.
    produce_clicks(broker, p.topic, 2, 200, hours=2, start_ms=START_MS + 6 * hour_ms)
    second = p.cli("run", "--no-quality", "--json")
    assert second.returncode == 0, second.stderr
    assert (
        "2 partitions added; 2 partitions marked complete; "
        "2 registered partitions read back and compared"
    ) in second.stdout
    with MetastoreClient(metastore.uri, 30) as client:
        params = {
            f"dt={part.values[0]}/hr={part.values[1]}": part.parameters
            for part in client.partitions("strata", p.name)
        }
        record = json.loads(client.get_table("strata", p.name).parameters["strata.registered"])
    assert sorted(params) == hours
    assert [h for h in hours if params[h].get("strata.complete") == "true"] == hours[:6]
    assert {params[h]["strata.completed_batch"] for h in hours[4:6]} == {"2"}
    assert record["batch"] == 2

    # An old partition pointed elsewhere by hand: `strata register` compares every one.
    with MetastoreClient(metastore.uri, 30) as client:
        [part] = client.partitions_by_names("strata", p.name, [hours[0]])
        part.sd.location = "file:/elsewhere"
        client.alter_partitions("strata", p.name, [part])
    shown = p.cli("register", "--json")
    assert shown.returncode == 0, shown.stderr
    full = json.loads(shown.stdout.strip().splitlines()[-1])
    assert full["full"] is True and full["partitions_moved"] == [hours[0]]
    assert full["partitions_read"] >= len(hours)

    # The record goes with the table: a table re-created by hand is registered whole.
    with MetastoreClient(metastore.uri, 30) as client:
        client._client.drop_table("strata", p.name, False)  # noqa: SLF001
    again = run_batch(p.cfg(), session=lambda _: spark)
    assert again.register_error is None, again.register_error
    with MetastoreClient(metastore.uri, 30) as client:
        assert sorted(client.partition_names("strata", p.name)) == hours
        marked = [
            f"dt={part.values[0]}/hr={part.values[1]}"
            for part in client.partitions("strata", p.name)
            if (part.parameters or {}).get("strata.complete") == "true"
        ]
    assert sorted(marked) == hours[:6]
