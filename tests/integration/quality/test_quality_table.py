"""The quality table through the real run: what an analyst's SQL sees of every check."""

from __future__ import annotations

import time

from pyhive import hive

from strata.catalog.metastore import MetastoreClient
from strata.catalog.register import location_uri
from strata.local.events import HOUR_MS
from strata.quality.table import quality_table_location, register_quality_table, replace_batch
from strata.run import run_batch
from tests.conftest import produce_clicks
from tests.integration.quality.test_quality import check


def recent_start() -> int:
    """An event-time start three hours before the current hour, inside the default window."""
    return (int(time.time() * 1000) // HOUR_MS - 3) * HOUR_MS


def test_the_thrift_server_reads_every_batch_once_as_last_checked(
    make_pipeline, broker, spark, metastore, thriftserver
):
    p = make_pipeline(
        partitions=2,
        overrides={
            "table_format": "parquet",
            "metastore": {"uri": metastore.uri},
            # The generator draws latencies up to 900 ms: every batch fails this range.
            "quality": {"gate": "fail", "ranges": {"latency_ms": {"min": 0, "max": 500}}},
        },
    )
    start = recent_start()
    results = {}
    for batch, count in ((1, 300), (2, 200)):
        produce_clicks(broker, p.topic, 2, count, start_ms=start, seed=batch)
        assert run_batch(p.cfg(), session=lambda _: spark).batch == batch
        results[batch] = check(p.cfg(), batch)
    first = results[1]
    results[1] = check(p.cfg(), 1)  # checked again: its rows are replaced
    assert [c.name for c in results[1].checks] == [c.name for c in first.checks]

    cursor = hive.connect("127.0.0.1", port=thriftserver.port, auth="NOSASL").cursor()

    def query(sql: str) -> list[tuple]:
        cursor.execute(sql)
        return cursor.fetchall()

    table = f"strata.{p.name}_quality"
    summary = query(
        f"SELECT batch, scope, count(*), sum(CASE WHEN success THEN 0 ELSE 1 END), sum(rows), "
        f"count(DISTINCT checked_at) FROM {table} GROUP BY batch, scope ORDER BY batch, scope"
    )
    expected = []
    for batch, r in sorted(results.items()):
        assert not r.success and r.incomplete
        expected.append((batch, "check", len(r.checks), len(r.failed), None, 1))
        expected.append((batch, "partition", len(r.partitions), len(r.partitions), r.rows, 1))
    assert summary == expected

    failed = query(
        f"SELECT batch, check_name, check_column, unexpected FROM {table} "
        "WHERE scope = 'check' AND NOT success ORDER BY batch, check_name"
    )
    assert failed == [
        (b, c.name, c.column, c.unexpected) for b, r in sorted(results.items()) for c in r.failed
    ]
    hours = query(
        f"SELECT batch, event_partition, dt, hr, rows, incomplete FROM {table} "
        "WHERE scope = 'partition' ORDER BY batch, event_partition"
    )
    assert hours == [
        (b, path, path[3:13], path[17:19], n, True)
        for b, r in sorted(results.items())
        for path, n in sorted(r.partitions.items())
    ]


def test_a_delta_pipelines_quality_table_is_registered_as_delta(make_pipeline, metastore):
    p = make_pipeline(partitions=1, overrides={"metastore": {"uri": metastore.uri}})
    cfg = p.cfg()
    places = cfg.places()
    assert register_quality_table(places, cfg.metastore, cfg.warehouse) == "created"
    assert register_quality_table(places, cfg.metastore, cfg.warehouse) == "unchanged"
    with MetastoreClient(metastore.uri, 30) as client:
        found = client.get_table("strata", f"{p.name}_quality")
    assert found is not None
    assert found.parameters["spark.sql.sources.provider"] == "delta"
    assert found.sd.location == location_uri(quality_table_location(places.table("quality")))


def test_strata_register_repairs_the_quality_table_in_the_metastore(make_pipeline, metastore):
    from strata.cli import main
    from tests.unit.quality.test_table import result

    p = make_pipeline(partitions=1, overrides={"metastore": {"uri": metastore.uri}})
    quality = p.cfg().places().table("quality")
    name = f"{p.name}_quality"
    register = ["register", "--pipeline", p.name, "--conf-dir", str(p.conf_dir)]
    # Before any check there is no quality table to register.
    assert main(register) == 0
    with MetastoreClient(metastore.uri, 30) as client:
        assert client.get_table("strata", name) is None
    replace_batch(quality, result(1, "2025-11-22T11:00:00+00:00"))
    assert main(register) == 0
    # Someone points it elsewhere: registering again sets it right.
    with MetastoreClient(metastore.uri, 30) as client:
        drifted = client.get_table("strata", name)
        assert drifted.sd.location == location_uri(quality_table_location(quality))
        drifted.sd.location = location_uri(str(p.conf_dir))
        client.alter_table(drifted)
    assert main(register) == 0
    with MetastoreClient(metastore.uri, 30) as client:
        assert client.get_table("strata", name).sd.location == location_uri(
            quality_table_location(quality)
        )
