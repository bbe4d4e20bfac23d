"""Trino reads Strata's tables wherever they are: routed tables, tables on S3, new batches.

Against the session's real Trino (`trino`): Delta and Iceberg tables in its catalogs on
a metastore of its own (`*_elsewhere`), where a run's `register_table` calls are what
makes them readable; plain Parquet tables in the Hive catalog on Strata's metastore,
where they belong (`tests.trino_reads.registering_settings`). Every table of a pipeline
(data, raw copy, quarantine, ledger, quality) answers there with the rows Strata's
readers read: each table a pipeline routes its topics to, the tables of a pipeline
whose warehouse is the session's S3 endpoint (moto), read through the S3 settings of
Trino's catalogs, and each new batch of a table registered once.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from strata.cli import main
from strata.config import TrinoConfig
from strata.local.trino import ELSEWHERE
from strata.quality.run import run_quality
from strata.run import run_batch
from strata.store.places import TABLE_ROLES
from strata.store.tables import read
from tests.conftest import ROOT, produce_clicks, s3_pipeline
from tests.trino_reads import (
    queries_of,
    registering_settings,
    strata_counts,
    trino_counts,
    trino_rows,
)

FORMATS = ["delta", "parquet", "iceberg"]


def _settings(trino, table_format: str, user: str) -> dict[str, object]:
    """The pipeline's `trino` settings: the session's Trino, as `user`, in the catalogs
    where registering does something. Their schema made first, as an operator runs
    `strata sql ddl` once (the `*_elsewhere` catalogs share one metastore, so a schema)."""
    settings = registering_settings(table_format)
    if settings:
        trino.query(f'CREATE SCHEMA IF NOT EXISTS "delta{ELSEWHERE}"."{user}"')
    return {"url": trino.url, "user": user, **settings}


def _checked_and_registered(p, tables) -> None:
    """Each table's quality check, then a run: with nothing new, it registers the tables
    again, and tells Trino of the quality tables the checks wrote (`strata register`
    registers in the metastore alone)."""
    for cfg in tables:
        run_quality(cfg.places(), cfg.quality, cfg.schemas(), cfg.metastore, cfg.warehouse)
    assert main(["run", "--pipeline", p.name, "--conf-dir", str(p.conf_dir)]) == 0


def _told(trino, user: str, table_format: str) -> set[str]:
    """The tables Trino was told of, by name: registered, or their partitions synchronised."""
    out = set()
    for _, state, statement in queries_of(trino, user):
        if statement.startswith("SELECT"):
            continue  # asking which snapshot Trino reads an Iceberg table at (a Repoint)
        if table_format == "parquet":
            assert "sync_partition_metadata" in statement and state == "FINISHED", statement
            out.add(statement.split(", '")[1].split("'")[0])
        else:
            # A second registration of a table is refused, ALREADY_EXISTS, and skipped.
            assert "register_table" in statement and state in ("FINISHED", "FAILED"), statement
            out.add(statement.split("table_name => '")[1].split("'")[0])
    return out


@pytest.mark.parametrize("table_format", FORMATS)
def test_every_routed_table_and_its_side_tables_answer_in_trino(
    table_format, trino, make_pipeline, broker, metastore, spark
):
    user = "routed_" + uuid.uuid4().hex[:6]
    topics = [f"t-{user}.kind{i}" for i in range(2)]
    p = make_pipeline(
        create=False,
        overrides={
            "table_format": table_format,
            "topics": topics,
            "schema_file": "{table}.avsc",
            "routing": {"table": "{topic}"},
            "metastore": {"uri": metastore.uri, "database": user},
            "trino": _settings(trino, table_format, user),
        },
    )
    cfg = p.cfg()
    for i, topic in enumerate(topics):
        schema = p.conf_dir.parent / "schemas" / f"{cfg.table_for(topic)}.avsc"
        shutil.copy(ROOT / "schemas" / "clicks.avsc", schema)
        broker.create_topic(topic, 2)
        produce_clicks(broker, topic, 2, 60 + 20 * i, seed=i, malformed=2)
    tables = [cfg.route(cfg.table_for(topic)) for topic in topics]
    assert main(["run", "--pipeline", p.name, "--conf-dir", str(p.conf_dir)]) == 0
    _checked_and_registered(p, tables)

    names = {t.places().table(which).name for t in tables for which in TABLE_ROLES}
    assert _told(trino, user, table_format) == (
        {t.name for t in tables} if table_format == "parquet" else names
    )
    for table in tables:
        counts = strata_counts(table)
        assert all(counts.values()), (table.name, counts)
        assert trino_counts(trino, table) == counts, table.name
    # Each routed table holds its own topic's rows, in Trino too.
    for topic, table in zip(topics, tables, strict=True):
        assert trino_rows(trino, table, "SELECT DISTINCT _topic FROM {table}") == [(topic,)]


@pytest.mark.parametrize("table_format", FORMATS)
def test_tables_on_s3_answer_in_trino_through_its_s3_settings(
    table_format, trino, make_pipeline, broker, metastore, spark, s3_endpoint, tmp_path
):
    user = "s3_" + uuid.uuid4().hex[:6]
    p, _ = s3_pipeline(
        make_pipeline,
        s3_endpoint,
        tmp_path,
        user,
        table_format=table_format,
        metastore={"uri": metastore.uri, "database": user},
        trino=_settings(trino, table_format, user),
    )
    produce_clicks(broker, p.topic, 2, 200, malformed=2)
    assert run_batch(p.cfg(), session=lambda _: spark).register_error is None
    cfg = p.cfg()
    _checked_and_registered(p, [cfg])
    assert cfg.places().table("table").uri.startswith(f"s3://lake/{user}/")

    counts = strata_counts(cfg)
    assert all(counts.values()), counts
    assert _told(trino, user, table_format) == (
        {p.name} if table_format == "parquet" else {cfg.places().table(w).name for w in TABLE_ROLES}
    )
    # Registered by `register_table` in a Trino on a metastore of its own, and read from
    # the metastore Strata registers in: both from S3.
    assert trino_counts(trino, cfg) == counts
    assert trino_counts(trino, cfg, settings=TrinoConfig()) == counts


def _two_batches_answer_in_trino(p, trino, broker, spark) -> None:
    """Two batches, each run registering: after each, Trino answers every batch's rows."""
    by_batch = "SELECT _batch, count(*) FROM {table} GROUP BY _batch ORDER BY _batch"
    for seed in (1, 2):
        produce_clicks(broker, p.topic, 1, 50, seed=seed)
        assert run_batch(p.cfg(), session=lambda _: spark).register_error is None
        batches = read(p.cfg().places().table("table"), ["_batch"]).column("_batch").to_pylist()
        landed = sorted((b, batches.count(b)) for b in set(batches))
        assert trino_rows(trino, p.cfg(), by_batch) == landed, f"after batch {seed}"
    assert [b for b, _ in landed] == [1, 2]


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_table_registered_in_a_trino_on_another_metastore_answers_each_new_batch(
    table_format, trino, make_pipeline, broker, metastore, spark
):
    # Plain Parquet tables are not registered there (`registering_settings`).
    user = "again_" + uuid.uuid4().hex[:6]
    p = make_pipeline(
        partitions=1,
        overrides={
            "table_format": table_format,
            "metastore": {"uri": metastore.uri, "database": user},
            "trino": _settings(trino, table_format, user),
        },
    )
    _two_batches_answer_in_trino(p, trino, broker, spark)


def test_a_trino_on_strata_s_own_metastore_told_to_register_never_unregisters_a_table(
    trino, make_pipeline, broker, metastore, spark
):
    # `trino.register_delta_tables` set by mistake, Trino's catalogs on Strata's own
    # metastore: each Iceberg table's register_table answers ALREADY_EXISTS, and Trino
    # reads the current snapshot, so it is not re-pointed; unregistering it there would
    # drop the metastore entry Strata's own commits go through.
    user = "mistake_" + uuid.uuid4().hex[:6]
    settings = {"url": trino.url, "user": user, "register_delta_tables": True}
    p = make_pipeline(
        partitions=1,
        overrides={
            "table_format": "iceberg",
            "metastore": {"uri": metastore.uri, "database": user},
            "trino": settings,
        },
    )
    _two_batches_answer_in_trino(p, trino, broker, spark)
    sent = queries_of(trino, user)
    assert not [s for _, _, s in sent if "unregister_table" in s], sent
    probes = [state for _, state, s in sent if s.startswith("SELECT")]
    assert probes == ["FINISHED"] * 6, sent  # the three Iceberg tables, after each batch


def test_an_iceberg_table_trino_holds_at_a_vacuumed_snapshot_is_re_pointed_by_the_next_run(
    trino, make_pipeline, broker, metastore, spark
):
    from trino.exceptions import TrinoQueryError

    from strata.maintenance.vacuum import vacuum
    from strata.store.iceberg import open_table
    from tests.maintenance_runs import compacted

    user = "vacuumed_" + uuid.uuid4().hex[:6]
    p = make_pipeline(
        partitions=1,
        overrides={
            "table_format": "iceberg",
            "metastore": {"uri": metastore.uri, "database": user},
            "trino": _settings(trino, "iceberg", user),
        },
    )
    produce_clicks(broker, p.topic, 1, 60, seed=1)
    assert run_batch(p.cfg(), session=lambda _: spark).register_error is None
    # A batch Trino is not told of, then a compaction and a vacuum that delete the files
    # and the metadata of the snapshot Trino's metastore still names.
    produce_clicks(broker, p.topic, 1, 60, seed=2)
    assert run_batch(p.cfg(), session=lambda _: spark, register_tables=False).batch == 2
    cfg = p.cfg()
    assert "compacted" in {e.outcome for e in compacted(cfg, spark, older_than="0s").partitions}
    vacuum(cfg.places(), "0s", cfg.metastore)
    # And the table's older metadata files gone too, as Iceberg's own metadata cleanup
    # (`write.metadata.previous-versions-max`) deletes them: Trino's is among them.
    current = open_table(cfg.places().table("table")).metadata_location
    older = [m for m in (Path(cfg.location("table")) / "metadata").glob("*.metadata.json")]
    older = [m for m in older if not current.endswith(m.name)]
    assert older
    for stale in older:
        stale.unlink()
    count = "SELECT count(*) FROM {table}"
    with pytest.raises(TrinoQueryError):
        trino_rows(trino, cfg, count)
    # The next run finds Trino at an older snapshot than Strata's metastore names (its
    # metadata cached, Trino answers the probe still), and re-points it.
    produce_clicks(broker, p.topic, 1, 60, seed=3)
    outcome = run_batch(cfg, session=lambda _: spark)
    assert outcome.register_error is None, outcome.register_error
    assert trino_rows(trino, cfg, count) == [(strata_counts(cfg, ["table"])["table"],)]
    assert any("unregister_table" in s for _, _, s in queries_of(trino, user))
