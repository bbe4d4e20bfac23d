"""Schema evolution on real batches, and replay from the raw copy after a schema fix.

Which changes are compatible is decided in `strata.schema` (tests/unit/test_schema.py).
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from strata import faults
from strata.batch.plan import PlanStore
from strata.run import run_batch
from strata.store.ledger import read_ledger
from tests.conftest import expected_offsets, produce_clicks
from tests.faults import armed


def edit_schema(p, change) -> None:
    """Rewrite the pipeline's Avro schema: `change` maps the list of fields to a new one."""
    path = Path(p.cfg().schema_path)
    avro = json.loads(path.read_text())
    avro["fields"] = change(avro["fields"])
    path.write_text(json.dumps(avro, indent=1))


def with_field(name: str, avro_type):
    def change(fields):
        out = []
        for f in fields:
            if f["name"] == name:
                f = {k: v for k, v in f.items() if k != "default"}
                f["type"] = avro_type
                if isinstance(avro_type, list) and "null" in avro_type:
                    f["default"] = None
            out.append(f)
        return out

    return change


def without_field(name: str):
    return lambda fields: [f for f in fields if f["name"] != name]


def test_an_added_optional_field_lands_and_old_rows_read_it_as_null(make_pipeline, broker, spark):
    p = make_pipeline(partitions=2)
    edit_schema(p, without_field("country"))
    first = produce_clicks(broker, p.topic, 2, 300)
    run_batch(p.cfg(), session=lambda _: spark)
    table = DeltaTable(p.cfg().location("table"))
    assert "country" not in pa.schema(table.schema()).names
    old_files = set(table.file_uris())

    edit_schema(p, lambda fields: fields + [{"name": "country", "type": ["null", "string"]}])
    second = produce_clicks(broker, p.topic, 2, 300, seed=11)
    outcome = run_batch(p.cfg(), session=lambda _: spark)
    assert outcome.status == "committed"
    # The second batch's events are of the same hours as the first's, which the first
    # completed: that is warned of too, and not this test's concern.
    assert [w for w in outcome.warnings if "already complete" not in w] == [
        "the schema gained `country`: the data table has the new column(s) from this batch "
        "on; earlier rows read them as null"
    ]

    table = DeltaTable(p.cfg().location("table"))
    assert "country" in pa.schema(table.schema()).names
    assert old_files <= set(table.file_uris()), "old files are not rewritten"
    rows = table.to_pyarrow_table(columns=["_batch", "country"]).to_pylist()
    by_batch = Counter((r["_batch"], r["country"] is None) for r in rows)
    # Batch 1's rows have no country; batch 2's carry the produced values (1 in 8 is None).
    assert by_batch[(1, False)] == 0 and by_batch[(1, True)] == sum(first.values())
    assert by_batch[(2, False)] > by_batch[(2, True)] > 0
    offsets = {q: (first[q], first[q] + second[q]) for q in first}
    assert p.landed() == expected_offsets({q: e for q, (_, e) in offsets.items()})


def test_an_incompatible_change_fails_at_plan_time_and_reads_nothing(make_pipeline, broker):
    p = make_pipeline(partitions=1)
    produce_clicks(broker, p.topic, 1, 100)
    assert p.cli("run").returncode == 0
    edit_schema(p, with_field("user_id", "string"))
    produce_clicks(broker, p.topic, 1, 50, seed=3)

    done = p.cli("run")
    assert done.returncode == 2
    assert "schema changed since batch 1 in a way its tables cannot take; nothing was read" in (
        done.stderr
    )
    assert "field `user_id` changed type from int64 to string" in done.stderr
    assert "Traceback" not in done.stderr
    assert PlanStore(p.cfg().places()).load(2) is None


def test_a_replay_after_a_schema_fix_moves_quarantined_rows_into_the_table(make_pipeline, broker):
    # `country` starts out required: the events without one are quarantined.
    p = make_pipeline(partitions=2)
    edit_schema(p, with_field("country", "string"))
    first = produce_clicks(broker, p.topic, 2, 800, malformed=3)
    assert p.cli("run").returncode == 0
    second = produce_clicks(broker, p.topic, 2, 400, seed=5)
    assert p.cli("run").returncode == 0
    per = {q: first[q] + second[q] for q in first}
    reasons = Counter(r["reason"] for r in p.table_rows("quarantine", ["reason"]).to_pylist())
    missing = reasons.pop("missing required field `country`")
    assert missing > 50 and sum(reasons.values()) == 3
    rows_before = p.table_rows("table", ["_offset"]).num_rows

    # The fix: `country` is optional. Replay both batches from the raw copy alone; the
    # brokers are pointed at a closed port to prove Kafka is not needed. The first
    # attempt dies after its quarantine commit; the same command again finishes it.
    edit_schema(p, with_field("country", ["null", "string"]))
    no_kafka = {"STRATA_KAFKA_BOOTSTRAP": "127.0.0.1:9"}
    args = ("replay", "--from-batch", "1", "--to-batch", "2", "--reason", "country optional")
    crashed = p.cli(*args, env=p.env(**no_kafka, **armed(crash_at=faults.AFTER_QUARANTINE_COMMIT)))
    assert crashed.returncode == -signal.SIGKILL
    done = p.cli(*args, "--json", env=p.env(**no_kafka))
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["status"] == "replayed" and summary["batch"] == 3
    assert summary["quarantined"] == 3 and summary["rows"] == rows_before + missing

    quarantined = p.table_rows("quarantine", ["reason"]).to_pylist()
    assert Counter(r["reason"] for r in quarantined) == reasons
    assert p.table_rows("table", ["_offset"]).num_rows == rows_before + missing
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)
    replayed = [r for r in read_ledger(p.cfg().places()).to_pylist() if r["kind"] == "replay"]
    assert sorted((r["partition"], r["start_offset"], r["end_offset"]) for r in replayed) == [
        (0, 0, per[0]),
        (1, 0, per[1]),
    ]
    for r in replayed:
        assert r["rows"] + r["quarantined"] + r["gaps"] == r["end_offset"] - r["start_offset"]
        assert r["note"] == "country optional" and r["batch"] == 3
