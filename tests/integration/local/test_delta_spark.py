"""delta-spark, Delta Lake's own Spark reader, on the tables Strata commits with delta-rs.

The session is the session's `delta_spark`, in a child process of its own; the batches
are landed on the suite's shared `spark`.
"""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable

from strata.run import run_batch
from tests.conftest import START_MS, produce_clicks

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
