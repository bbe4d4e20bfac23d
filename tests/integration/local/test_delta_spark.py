"""delta-spark, Delta Lake's own Spark reader, on the tables Strata commits with delta-rs.

One pipeline goes through every kind of write once, in the module's `story`: two
batches and a quality run, Strata's compaction, a checkpoint, Strata's vacuum and a
backfill; then Delta's own OPTIMIZE and VACUUM through delta-spark, each followed by a
batch, and a backfill after the OPTIMIZE. After each step it keeps what delta-rs and
delta-spark read of every Delta table, and what landed; the tests assert on that.
The session is the session's `delta_spark`, in a child process of its own; the batches
are landed on the suite's shared `spark`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from strata.maintenance.vacuum import checkpoint, vacuum
from strata.quality.run import run_quality
from strata.quality.table import quality_table_location
from strata.run import reprocess, run_batch
from strata.store.ranges import OffsetRange
from tests.conftest import START_MS, expected_offsets, pipelines, produce_clicks
from tests.delta_spark import run_statement
from tests.maintenance_runs import compacted

HOUR_MS = 3_600_000
TABLES = ("table", "raw", "quarantine", "ledger", "quality")
"""Every Delta table of a pipeline with `table_format: delta`."""


@dataclass
class Landed:
    """How often each (partition, offset) landed after a batch, and how often it should."""

    rows: Counter  # as a row or a quarantined row
    raw: Counter  # in the raw copy
    expected: Counter  # once each, every offset produced so far


@dataclass
class Story:
    """What one pipeline went through, as each reader read it after each step."""

    # step -> table -> (delta-rs's rows, delta-spark's rows)
    reads: dict[str, dict[str, tuple[pa.Table, pa.Table]]] = field(default_factory=dict)
    # DESCRIBE HISTORY of the data table after the first two batches: version -> operation
    history: dict[int, str] = field(default_factory=dict)
    # batch number -> the version delta-rs committed it as, from its commit's metadata
    batch_versions: dict[int, int] = field(default_factory=dict)
    # what landed after the batch following each of Delta's own maintenance steps
    next_batch: dict[str, Landed] = field(default_factory=dict)
    optimize_answer: int = 0  # OPTIMIZE's rows of metrics
    optimize_operation: str = ""  # the operation delta-rs lists as the newest
    files_before_optimize: int = 0
    files_after_optimize: int = 0
    # the backfill after OPTIMIZE: what landed before and after it, its batch, and the
    # batches the rows of its range carry afterwards
    backfill_before: Counter = field(default_factory=Counter)
    backfill_after: Counter = field(default_factory=Counter)
    backfill_expected: Counter = field(default_factory=Counter)
    backfill_batch: int = 0
    batches_in_range: set[int] = field(default_factory=set)


@pytest.fixture(scope="module")
def story(tmp_path_factory, broker, spark, delta_spark) -> Story:
    p = pipelines(tmp_path_factory.mktemp("delta-spark-pipeline"), broker)(partitions=2)
    cfg = p.cfg()
    location = cfg.location("table")
    locations = {which: cfg.location(which) for which in ("table", "raw", "quarantine")}
    locations["ledger"] = cfg.places().ledger.uri
    locations["quality"] = quality_table_location(cfg.places().table("quality"))
    told = Story()
    total: Counter = Counter()

    def read(step: str) -> None:
        told.reads[step] = {
            which: (
                DeltaTable(where).to_pyarrow_table(),
                delta_spark.sql(f"SELECT * FROM delta.`{where}`"),
            )
            for which, where in locations.items()
        }

    def land(seed: int, hour: int, hours: int = 1, **specials: int) -> Landed:
        total.update(
            produce_clicks(
                broker,
                p.topic,
                2,
                150,
                seed=seed,
                start_ms=START_MS + hour * HOUR_MS,
                hours=hours,
                **specials,
            )
        )
        assert run_batch(cfg, session=lambda _: spark).status == "committed"
        return Landed(p.landed(), p.raw_copies(), expected_offsets(total))

    # Two batches, overlapping in two event hours so that compaction has work: the
    # first creates the table, the second appends. Then the quality table.
    land(1, 0, hours=3, malformed=2)
    land(2, 1, hours=3, malformed=3)
    history = delta_spark.sql(f"DESCRIBE HISTORY delta.`{location}`")
    told.history = dict(
        zip(history["version"].to_pylist(), history["operation"].to_pylist(), strict=True)
    )
    told.batch_versions = {
        int(c["strata.batch"]): c["version"] for c in DeltaTable(location).history()
    }
    run_quality(cfg.places(), cfg.quality, cfg.schemas(), cfg.metastore, cfg.warehouse)
    read("ingest")

    # Strata's own maintenance, and a backfill.
    report = compacted(cfg, spark, older_than="0s")
    assert "compacted" in {e.outcome for e in report.partitions if e.table == "table"}
    read("compaction")
    assert "table" in checkpoint(cfg.places()).tables
    # delta-spark starts from the checkpoint Strata wrote (a .checkpoint.parquet file).
    assert list((Path(location) / "_delta_log").glob("*.checkpoint.parquet"))
    read("checkpoint")
    vacuum(cfg.places(), "0s", cfg.metastore)
    read("vacuum")
    done = reprocess(
        cfg, "backfill", [OffsetRange(p.topic, 0, 20, 120)], "fix", session=lambda _: spark
    )
    assert done.status == "backfilled"
    read("backfill")

    # Delta's own maintenance: a batch into a compacted hour gives OPTIMIZE files to
    # merge; a user runs it, and the next batch must land once.
    land(3, 0)
    told.files_before_optimize = len(DeltaTable(location).file_uris())
    told.optimize_answer = delta_spark.call(run_statement, f"OPTIMIZE delta.`{location}`")
    told.optimize_operation = DeltaTable(location).history(1)[0]["operation"]
    told.files_after_optimize = len(DeltaTable(location).file_uris())
    told.next_batch["Delta's OPTIMIZE"] = land(4, 1)
    # A backfill after OPTIMIZE still replaces exactly its range.
    told.backfill_before = p.landed()
    done = reprocess(
        cfg, "backfill", [OffsetRange(p.topic, 0, 10, 110)], "fix", session=lambda _: spark
    )
    assert done.status == "backfilled"
    told.backfill_after = p.landed()
    told.backfill_expected = expected_offsets(total)
    told.backfill_batch = done.batch
    rows = p.table_rows("table", ["_partition", "_offset", "_batch"]).to_pylist()
    told.batches_in_range = {
        r["_batch"] for r in rows if r["_partition"] == 0 and 10 <= r["_offset"] < 110
    }
    # Delta's VACUUM, then Strata's; then Strata's, then Delta's.
    delta_spark.sql("SET spark.databricks.delta.retentionDurationCheck.enabled = false")
    delta_spark.sql(f"VACUUM delta.`{location}` RETAIN 0 HOURS")
    vacuum(cfg.places(), "0s", cfg.metastore)
    told.next_batch["Delta's VACUUM, then Strata's"] = land(5, 2)
    vacuum(cfg.places(), "0s", cfg.metastore)
    delta_spark.sql(f"VACUUM delta.`{location}` RETAIN 0 HOURS")
    told.next_batch["Strata's vacuum, then Delta's VACUUM"] = land(6, 3)
    read("Delta's OPTIMIZE and VACUUM")
    return told


def _rows(table: pa.Table) -> list[str]:
    """A table's rows, in an order of their own: for any of Strata's tables."""
    return sorted(repr(sorted(row.items())) for row in table.to_pylist())


@pytest.mark.parametrize(
    "step",
    ["ingest", "compaction", "checkpoint", "vacuum", "backfill", "Delta's OPTIMIZE and VACUUM"],
)
def test_delta_spark_reads_every_delta_table_as_delta_rs_does_after_each_kind_of_write(story, step):
    for which in TABLES:
        ours, theirs = story.reads[step][which]
        assert theirs.num_rows == ours.num_rows > 0, which
        assert theirs.schema == ours.schema, which
        assert _rows(theirs) == _rows(ours), which


def test_describe_history_lists_each_batch_by_its_commit(story):
    # One commit per batch, each found by the batch number delta-rs wrote into it: the
    # first creates the table with its rows, the next appends.
    versions = story.batch_versions
    assert story.history == {versions[1]: "CREATE TABLE", versions[2]: "WRITE"}


def test_deltas_own_optimize_merges_a_strata_tables_files(story):
    assert story.optimize_answer == 1
    assert story.optimize_operation == "OPTIMIZE"
    assert 0 < story.files_after_optimize < story.files_before_optimize


@pytest.mark.parametrize(
    "after",
    ["Delta's OPTIMIZE", "Delta's VACUUM, then Strata's", "Strata's vacuum, then Delta's VACUUM"],
)
def test_after_deltas_own_maintenance_the_next_batch_lands_once(story, after):
    # Every offset once, as a row or a quarantined row, and once in the raw copy.
    landed = story.next_batch[after]
    assert landed.rows == landed.expected
    assert landed.raw == landed.expected


def test_a_backfill_after_deltas_own_optimize_replaces_exactly_its_range(story):
    assert story.backfill_after == story.backfill_before == story.backfill_expected
    assert story.batches_in_range == {story.backfill_batch}
