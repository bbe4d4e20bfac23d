"""delta-spark, Delta Lake's own Spark reader, on the tables Strata commits with delta-rs.

The session is the session's `delta_spark`, in a child process of its own; the batches
are landed on the suite's shared `spark`.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from strata.run import run_batch
from tests.conftest import START_MS, produce_clicks
from tests.delta_spark import run_statement
from tests.maintenance_runs import compacted

HOUR_MS = 3_600_000


def _sorted(table: pa.Table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda row: (row["_partition"], row["_offset"]))


def test_delta_spark_reads_every_row_delta_rs_reads_and_each_batch_in_the_history(
    make_pipeline, broker, spark, delta_spark
):
    p = make_pipeline(partitions=2)
    produce_clicks(broker, p.topic, 2, 200, malformed=3)
    first = run_batch(p.cfg(), session=lambda _: spark)
    produce_clicks(broker, p.topic, 2, 100, start_ms=START_MS + 3 * HOUR_MS, seed=8)
    second = run_batch(p.cfg(), session=lambda _: spark)
    assert (first.batch, second.batch) == (1, 2)
    location = p.cfg().location("table")

    ours = DeltaTable(location).to_pyarrow_table()
    theirs = delta_spark.sql(f"SELECT * FROM delta.`{location}`")
    assert theirs.num_rows == ours.num_rows > 0
    assert theirs.schema == ours.schema
    assert _sorted(theirs) == _sorted(ours)

    history = delta_spark.sql(f"DESCRIBE HISTORY delta.`{location}`")
    listed = dict(
        zip(history["version"].to_pylist(), history["operation"].to_pylist(), strict=True)
    )
    # One commit per batch, each found by the batch number delta-rs wrote into it: the
    # first creates the table with its rows, the next appends.
    commits = DeltaTable(location).history()
    batches = {int(c["strata.batch"]): c["version"] for c in commits}
    assert listed == {batches[1]: "CREATE TABLE", batches[2]: "WRITE"}


def _rows(table: pa.Table) -> list[str]:
    """A table's rows, in an order of their own: for any of Strata's tables."""
    return sorted(repr(sorted(row.items())) for row in table.to_pylist())


def _same_rows_in_delta_spark(p, delta_spark, stage: str) -> None:
    """Every Delta table of the pipeline: delta-spark reads the rows delta-rs reads."""
    from strata.quality.table import quality_table_location

    cfg = p.cfg()
    locations = {which: cfg.location(which) for which in ("table", "raw", "quarantine")}
    locations["ledger"] = cfg.places().ledger.uri
    locations["quality"] = quality_table_location(cfg.places().table("quality"))
    for which, location in locations.items():
        ours = DeltaTable(location).to_pyarrow_table()
        theirs = delta_spark.sql(f"SELECT * FROM delta.`{location}`")
        assert theirs.num_rows == ours.num_rows > 0, (stage, which)
        assert _rows(theirs) == _rows(ours), (stage, which)


def test_delta_spark_reads_every_delta_table_after_each_kind_of_write(
    make_pipeline, broker, spark, delta_spark
):

    from strata.maintenance.vacuum import checkpoint, vacuum
    from strata.quality.run import run_quality
    from strata.run import reprocess
    from strata.store.ranges import OffsetRange

    p = make_pipeline(partitions=2)
    for seed in (1, 2):
        produce_clicks(broker, p.topic, 2, 200, seed=seed, malformed=2)
        assert run_batch(p.cfg(), session=lambda _: spark).status == "committed"
    cfg = p.cfg()
    run_quality(cfg.places(), cfg.quality, cfg.schemas(), cfg.metastore, cfg.warehouse)
    _same_rows_in_delta_spark(p, delta_spark, "ingest")

    report = compacted(cfg, spark, older_than="0s")
    assert "compacted" in {e.outcome for e in report.partitions if e.table == "table"}
    _same_rows_in_delta_spark(p, delta_spark, "compaction")
    assert "table" in checkpoint(cfg.places()).tables
    # delta-spark starts from the checkpoint Strata wrote (a .checkpoint.parquet file).
    log = Path(cfg.location("table")) / "_delta_log"
    assert list(log.glob("*.checkpoint.parquet"))
    _same_rows_in_delta_spark(p, delta_spark, "checkpoint")
    vacuum(cfg.places(), "0s", cfg.metastore)
    _same_rows_in_delta_spark(p, delta_spark, "vacuum")
    done = reprocess(
        cfg, "backfill", [OffsetRange(p.topic, 0, 20, 120)], "fix", session=lambda _: spark
    )
    assert done.status == "backfilled"
    _same_rows_in_delta_spark(p, delta_spark, "backfill")


def test_deltas_own_optimize_and_vacuum_leave_every_next_batch_landing_once(
    make_pipeline, broker, spark, delta_spark
):
    from strata.maintenance.vacuum import vacuum
    from strata.run import reprocess
    from strata.store.ranges import OffsetRange
    from tests.conftest import expected_offsets

    p = make_pipeline(partitions=2)
    location = p.cfg().location("table")
    total: dict[int, int] = {}

    def land(seed: int, hour: int) -> None:
        per = produce_clicks(
            broker, p.topic, 2, 150, seed=seed, start_ms=START_MS + hour * HOUR_MS, hours=1
        )
        for q, n in per.items():
            total[q] = total.get(q, 0) + n
        assert run_batch(p.cfg(), session=lambda _: spark).status == "committed"
        # Every offset once, as a row or a quarantined row, and once in the raw copy.
        assert p.landed() == expected_offsets(total), seed
        assert p.raw_copies() == expected_offsets(total), seed

    land(1, 0)
    land(2, 0)
    # A user compacts the table with Delta's own OPTIMIZE: the next batch lands once.
    files = len(DeltaTable(location).file_uris())
    assert delta_spark.call(run_statement, f"OPTIMIZE delta.`{location}`") == 1
    assert DeltaTable(location).history(1)[0]["operation"] == "OPTIMIZE"
    assert 0 < len(DeltaTable(location).file_uris()) < files
    land(3, 1)
    # A backfill after OPTIMIZE still replaces exactly its range.
    before = p.landed()
    done = reprocess(
        p.cfg(), "backfill", [OffsetRange(p.topic, 0, 10, 110)], "fix", session=lambda _: spark
    )
    assert done.status == "backfilled"
    assert p.landed() == before == expected_offsets(total)
    rows = p.table_rows("table", ["_partition", "_offset", "_batch"]).to_pylist()
    assert {r["_batch"] for r in rows if r["_partition"] == 0 and 10 <= r["_offset"] < 110} == {
        done.batch
    }

    # Delta's VACUUM, then Strata's; then Strata's, then Delta's: each next batch once.
    delta_spark.sql("SET spark.databricks.delta.retentionDurationCheck.enabled = false")
    delta_spark.sql(f"VACUUM delta.`{location}` RETAIN 0 HOURS")
    vacuum(p.cfg().places(), "0s", p.cfg().metastore)
    land(4, 2)
    vacuum(p.cfg().places(), "0s", p.cfg().metastore)
    delta_spark.sql(f"VACUUM delta.`{location}` RETAIN 0 HOURS")
    land(5, 3)
    ours = DeltaTable(location).to_pyarrow_table()
    assert _sorted(delta_spark.sql(f"SELECT * FROM delta.`{location}`")) == _sorted(ours)
