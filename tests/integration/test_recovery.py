"""A way out of every stop: unreadable saved plans, re-created topics, recorded edits."""

from __future__ import annotations

import json
import signal
from collections import Counter

from strata import faults
from strata.batch.plan import PlanStore
from strata.run import run_batch
from strata.store.ledger import ledger_state, read_ledger
from tests.conftest import expected_offsets, produce_clicks
from tests.faults import armed


def last_json(done) -> dict:
    return json.loads(done.stdout.strip().splitlines()[-1])


def recreate(broker, topic: str, partitions: int) -> None:
    broker.delete_topic(topic)
    broker.create_topic(topic, partitions)


def test_a_batch_whose_raw_copy_stands_is_finished_from_it_when_kafka_lost_its_offsets(
    make_pipeline, broker, spark
):
    p = make_pipeline(partitions=2)
    per = produce_clicks(broker, p.topic, 2, 1500, malformed=4)
    crashed = p.cli("run", env=p.env(**armed(crash_at=faults.AFTER_RAW_COMMIT)))
    assert crashed.returncode == -signal.SIGKILL
    # The log the plan was made from is gone before the re-run (retention, or a topic
    # deleted by mistake and created again): the committed raw copy holds the batch.
    recreate(broker, p.topic, 2)
    rerun = run_batch(p.cfg(), session=lambda _: spark)
    assert rerun.status == "resumed"
    assert any("read from it" in w for w in rerun.warnings), rerun.warnings
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)
    assert sum(r["quarantined"] for r in read_ledger(p.cfg().places()).to_pylist()) == 4


def test_a_plan_kafka_no_longer_serves_stops_with_the_way_out_and_plan_drop_frees_it(
    make_pipeline, broker, spark
):
    p = make_pipeline(partitions=1)
    produce_clicks(broker, p.topic, 1, 500)
    crashed = p.cli("run", env=p.env(**armed(crash_at=faults.AFTER_FILES)))
    assert crashed.returncode == -signal.SIGKILL
    recreate(broker, p.topic, 1)
    fresh = produce_clicks(broker, p.topic, 1, 20, seed=3)

    # The topic's id changed since the plan was made: the plan is for the old log.
    stopped = p.cli("run", "--json")
    assert stopped.returncode == 1
    error = last_json(stopped)["error"]
    assert error.startswith(f"topic `{p.topic}` (id "), error
    assert "when batch 1 was planned" in error
    assert f"strata plan drop --pipeline {p.name} --batch 1" in error
    assert "Traceback" not in stopped.stderr
    # A broker that keeps no topic ids (or an older plan) leaves the watermarks to tell.
    path = PlanStore(p.cfg().places()).describe(1)
    body = json.loads(open(path).read())
    body["topic_ids"] = {}
    with open(path, "w") as out:
        out.write(json.dumps(body))
    stopped = p.cli("run", "--json")
    assert stopped.returncode == 1
    error = last_json(stopped)["error"]
    assert error.startswith(
        f"batch 1's saved plan can no longer be read: offsets [0, 500) of partition 0 of "
        f"`{p.topic}`: Kafka now holds [0, 20)"
    ), error
    assert f"strata plan drop --pipeline {p.name} --batch 1" in error
    assert read_ledger(p.cfg().places()).num_rows == 0

    dropped = p.cli("plan", "drop", "--batch", "1", "--reason", "INC-11 topic re-created")
    assert dropped.returncode == 0, dropped.stderr
    [row] = read_ledger(p.cfg().places()).to_pylist()
    assert (row["batch"], row["kind"], row["start_offset"], row["end_offset"]) == (
        1,
        "abandon",
        0,
        0,
    )
    assert "INC-11 topic re-created" in row["note"] and "it planned [0, 500)" in row["note"]
    # Every table holds batch 1's number (fences): a runner still holding the dropped
    # plan commits nothing of it.
    from deltalake import DeltaTable

    for which in ("raw", "quarantine", "table", "ledger"):
        assert DeltaTable(p.cfg().location(which)).transaction_version(p.name) == 1
    assert run_batch(p.cfg(), session=lambda _: spark).batch == 2
    assert p.landed() == expected_offsets(fresh)
    status = p.cli("status")
    assert "EDIT: batch 1 abandon" in status.stdout


def test_a_damaged_plan_file_is_named_and_can_be_dropped(make_pipeline, broker, spark):
    p = make_pipeline(partitions=1)
    per = produce_clicks(broker, p.topic, 1, 300)
    crashed = p.cli("run", env=p.env(**armed(crash_at=faults.AFTER_FILES)))
    assert crashed.returncode == -signal.SIGKILL
    store = PlanStore(p.cfg().places())
    path = store.describe(1)
    text = open(path).read()
    with open(path, "w") as out:
        out.write(text[: len(text) // 2])

    stopped = p.cli("run", "--json")
    assert stopped.returncode == 1
    error = last_json(stopped)["error"]
    assert error.startswith(f"{path}: the saved plan of batch 1 cannot be read"), error
    assert "strata plan drop" in error
    status = p.cli("status")
    assert status.returncode == 0 and "UNFINISHED: batch 1: " in status.stdout

    dropped = p.cli("plan", "drop", "--batch", "1", "--reason", "damaged by a bad deploy")
    assert dropped.returncode == 0, dropped.stderr
    assert ledger_state(p.cfg().places()).last_batch == 1
    assert run_batch(p.cfg(), session=lambda _: spark).batch == 2
    assert p.landed() == expected_offsets(per)


def test_a_recreated_topic_grown_past_the_committed_offset_stops_until_a_seek(
    make_pipeline, broker, spark
):
    p = make_pipeline(partitions=1)
    first = produce_clicks(broker, p.topic, 1, 200)
    assert run_batch(p.cfg(), session=lambda _: spark).batch == 1
    recreate(broker, p.topic, 1)
    # The new log has grown past the committed offset: by its watermarks alone it looks
    # like 400 new messages after offset 200.
    second = produce_clicks(broker, p.topic, 1, 600, seed=4)

    stopped = p.cli("run", "--json")
    assert stopped.returncode == 1
    error = last_json(stopped)["error"]
    assert error.startswith(f"topic `{p.topic}` (id "), error
    assert "was deleted and created again under the same name" in error
    assert "strata ledger seek" in error
    assert [r["batch"] for r in read_ledger(p.cfg().places()).to_pylist()] == [1]
    assert PlanStore(p.cfg().places()).load(2) is None

    seek = p.cli("ledger", "seek", "--topic", p.topic, "--to", "earliest", "--reason", "INC-12")
    assert seek.returncode == 0, seek.stderr
    [row] = [r for r in read_ledger(p.cfg().places()).to_pylist() if r["batch"] == 2]
    assert (row["kind"], row["start_offset"], row["end_offset"]) == ("seek", 0, 0)
    assert "moved back from 200 to 0" in row["note"] and "INC-12" in row["note"]
    assert run_batch(p.cfg(), session=lambda _: spark).batch == 3
    ledger = read_ledger(p.cfg().places()).to_pylist()
    assert [(r["start_offset"], r["end_offset"]) for r in ledger if r["batch"] == 3] == [
        (0, second[0])
    ]
    # Both logs' messages are in the table: the old one's from batch 1, the new one's
    # from batch 3 (the same offsets, other messages).
    landed = p.table_rows("table", ["_offset", "_batch"]).to_pylist()
    quarantined = p.table_rows("quarantine", ["_offset", "_batch"]).to_pylist()
    by_batch: dict[int, list[int]] = {}
    for r in landed + quarantined:
        by_batch.setdefault(r["_batch"], []).append(r["_offset"])
    assert sorted(by_batch[1]) == list(range(first[0]))
    assert sorted(by_batch[3]) == list(range(second[0]))
    # Offsets both logs cover cannot be backfilled: their rows cannot be told apart.
    refused = p.cli(
        "backfill", "--topic", p.topic, "--partition", "0", "--from", "0", "--to", "50",
        "--reason", "x",
    )  # fmt: skip
    assert refused.returncode == 1
    assert "batches 1 and 3 both read offsets from 0: two logs" in refused.stderr


def test_a_seek_is_recorded_skips_forward_and_never_lets_an_old_plan_run(
    make_pipeline, broker, spark
):
    p = make_pipeline(partitions=1)
    first = produce_clicks(broker, p.topic, 1, 100)
    assert run_batch(p.cfg(), session=lambda _: spark).batch == 1
    second = produce_clicks(broker, p.topic, 1, 300, seed=2)
    crashed = p.cli("run", env=p.env(**armed(crash_at=faults.AFTER_FILES)))
    assert crashed.returncode == -signal.SIGKILL

    # A batch is unfinished: a seek now would let its plan run after the edit.
    refused = p.cli("ledger", "seek", "--topic", p.topic, "--to", "350", "--reason", "skip")
    assert refused.returncode == 1
    assert "batch 2 is unfinished" in refused.stderr and "strata plan drop" in refused.stderr
    assert p.cli("plan", "drop", "--batch", "2", "--reason", "poison range").returncode == 0
    # Back over committed offsets of the same topic would land them twice.
    back = p.cli("ledger", "seek", "--topic", p.topic, "--to", "10", "--reason", "again")
    assert back.returncode == 1 and "strata backfill" in back.stderr
    forward = p.cli("ledger", "seek", "--topic", p.topic, "--to", "350", "--reason", "skip")
    assert forward.returncode == 0, forward.stderr
    assert f"offsets [{first[0]}, 350) are skipped" in forward.stdout

    more = produce_clicks(broker, p.topic, 1, 10, seed=3)
    done = run_batch(p.cfg(), session=lambda _: spark)
    assert done.batch == 4
    end = first[0] + second[0] + more[0]
    assert [(r.start, r.end) for r in done.ranges] == [(350, end)]
    kinds = [(r["batch"], r["kind"]) for r in read_ledger(p.cfg().places()).to_pylist()]
    assert sorted(kinds) == [(1, "ingest"), (2, "abandon"), (3, "seek"), (4, "ingest")]
    landed = p.landed()
    assert sorted(o for _, o in landed) == list(range(first[0])) + list(range(350, end))
    assert set(landed.values()) == {1}
    status = p.cli("status")
    assert f"EDIT: batch 3 seek {p.topic}:0 [{first[0]}, 350)" in status.stdout
    quality = p.cli("quality", "--batch", "4", "--json")
    checks = {c["name"]: c["success"] for c in last_json(quality)["checks"]}
    assert checks["reconcile: no unexplained holes"], quality.stdout


def test_a_saved_plan_the_schema_now_refuses_stops_before_reading_and_resumes_once_fixed(
    make_pipeline, broker, spark
):
    import json as _json
    from pathlib import Path

    p = make_pipeline(partitions=1)
    first = produce_clicks(broker, p.topic, 1, 100)
    assert run_batch(p.cfg(), session=lambda _: spark).batch == 1
    second = produce_clicks(broker, p.topic, 1, 200, seed=3)
    crashed = p.cli("run", env=p.env(**armed(crash_at=faults.AFTER_FILES)))
    assert crashed.returncode == -signal.SIGKILL
    # Between the crash and the re-run, someone changes `user_id`'s type: the saved
    # plan of batch 2 cannot be written into the table any more.
    path = Path(p.cfg().schema_path)
    original = path.read_text()
    avro = _json.loads(original)
    for field in avro["fields"]:
        if field["name"] == "user_id":
            field["type"] = "string"
    path.write_text(_json.dumps(avro))

    stopped = p.cli("run", "--json")
    assert stopped.returncode == 2
    error = last_json(stopped)["error"]
    assert "schema changed since batch 1 in a way its tables cannot take; nothing was read" in error
    assert "field `user_id` changed type from int64 to string" in error
    assert [r["batch"] for r in read_ledger(p.cfg().places()).to_pylist()] == [1]
    # The way on: the schema the tables hold; the saved plan then finishes as planned.
    path.write_text(original)
    done = run_batch(p.cfg(), session=lambda _: spark)
    assert (done.batch, done.status) == (2, "resumed")
    assert p.landed() == expected_offsets({0: first[0] + second[0]})


def test_a_batch_whose_raw_copy_lost_a_file_stops_and_a_forced_drop_reads_it_again(
    make_pipeline, broker, spark
):
    from pathlib import Path

    from deltalake import DeltaTable

    p = make_pipeline(partitions=2)
    per = produce_clicks(broker, p.topic, 2, 1200, malformed=3)
    crashed = p.cli("run", env=p.env(**armed(crash_at=faults.AFTER_RAW_COMMIT)))
    assert crashed.returncode == -signal.SIGKILL
    # A lifecycle rule (or a hand) deletes one of the committed raw files: the raw copy
    # no longer holds the batch the rest of it would be read from.
    raw_dir = Path(p.cfg().location("raw"))
    victim = sorted(raw_dir.glob("part-b0000000001-*.parquet"))[0]
    victim.unlink()

    stopped = p.cli("run", "--json")
    assert stopped.returncode == 1
    error = last_json(stopped)["error"]
    # The task's own error, not Spark's wrapper: the missing file is named.
    assert error.startswith("a task failed: ") and victim.name in error, error
    for which in ("quarantine", "table"):
        table = (
            DeltaTable(p.cfg().location(which))
            if (Path(p.cfg().location(which)) / "_delta_log").exists()
            else None
        )
        assert table is None or (table.transaction_version(p.name) or 0) == 0

    refused = p.cli("plan", "drop", "--batch", "1", "--reason", "raw file lost")
    assert refused.returncode == 1 and "--force" in refused.stderr
    dropped = p.cli("plan", "drop", "--batch", "1", "--force", "--reason", "raw file lost")
    assert dropped.returncode == 0, dropped.stderr
    # Every table holds the batch's number now (the raw copy's own commit, fences on the
    # others): a runner still holding the plan commits nothing of it.
    for which in ("raw", "quarantine", "table", "ledger"):
        assert DeltaTable(p.cfg().location(which)).transaction_version(p.name) == 1
    assert p.raw_copies() == {}

    assert run_batch(p.cfg(), session=lambda _: spark).batch == 2
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)


def two_topics(p, broker, partitions: int) -> str:
    """A second topic in the pipeline `p`; returns its name."""
    import yaml

    other = f"{p.topic}-b"
    broker.create_topic(other, partitions)
    path = p.conf_dir / "pipelines" / f"{p.name}.yaml"
    body = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**body, "topics": [p.topic, other]}))
    return other


def event_ids(p, topic: str) -> dict[int, str]:
    rows = p.table_rows("table", ["_topic", "_offset", "event_id"]).to_pylist()
    return {r["_offset"]: r["event_id"] for r in rows if r["_topic"] == topic}


def test_a_seek_of_one_recreated_topic_never_vouches_for_another(make_pipeline, broker, spark):
    # Two topics of a pipeline are deleted and created again; the operator seeks the
    # first back to its start, as the stop says. The second must still be refused:
    # read from the old committed offset, its new log's offsets 0-99 would be skipped.
    p = make_pipeline(partitions=1)
    other = two_topics(p, broker, 1)
    for topic in (p.topic, other):
        produce_clicks(broker, topic, 1, 100)
    assert run_batch(p.cfg(), session=lambda _: spark).batch == 1
    for topic in (p.topic, other):
        recreate(broker, topic, 1)
    new = {topic: produce_clicks(broker, topic, 1, 300, seed=5) for topic in (p.topic, other)}

    stopped = p.cli("run", "--json")
    assert stopped.returncode == 1
    error = last_json(stopped)["error"]
    assert f"`{p.topic}` (id " in error and f"`{other}` (id " in error, error
    seek = p.cli("ledger", "seek", "--topic", p.topic, "--to", "earliest", "--reason", "INC-7")
    assert seek.returncode == 0, seek.stderr

    still = p.cli("run", "--json")
    assert still.returncode == 1, still.stdout
    error = last_json(still)["error"]
    assert f"topic `{other}` (id " in error and "partition 0)" in error, error
    assert f"`{p.topic}`" not in error.split("was deleted")[0], error
    assert sorted({r["batch"] for r in read_ledger(p.cfg().places()).to_pylist()}) == [1, 2]

    # Sought too, both new logs land whole, each offset once.
    seek = p.cli("ledger", "seek", "--topic", other, "--to", "earliest", "--reason", "INC-7")
    assert seek.returncode == 0, seek.stderr
    done = p.cli("run", "--json")
    assert done.returncode == 0, done.stderr
    rows = p.table_rows("table", ["_topic", "_offset", "_batch"]).to_pylist()
    rows += p.table_rows("quarantine", ["_topic", "_offset", "_batch"]).to_pylist()
    for topic in (p.topic, other):
        offsets = sorted(r["_offset"] for r in rows if r["_topic"] == topic and r["_batch"] == 4)
        assert offsets == list(range(new[topic][0])), topic


def test_a_seek_of_one_partition_never_vouches_for_the_others(make_pipeline, broker, spark):
    p = make_pipeline(partitions=2)
    produce_clicks(broker, p.topic, 2, 200)
    assert run_batch(p.cfg(), session=lambda _: spark).batch == 1
    recreate(broker, p.topic, 2)
    new = produce_clicks(broker, p.topic, 2, 600, seed=5)
    seek = p.cli(
        "ledger", "seek", "--topic", p.topic, "--partition", "0", "--to", "0", "--reason", "x"
    )
    assert seek.returncode == 0, seek.stderr

    stopped = p.cli("run", "--json")
    assert stopped.returncode == 1, stopped.stdout
    error = last_json(stopped)["error"]
    assert f"topic `{p.topic}` (id " in error and "; partition 1)" in error, error
    seek = p.cli(
        "ledger", "seek", "--topic", p.topic, "--partition", "1", "--to", "0", "--reason", "x"
    )
    assert seek.returncode == 0, seek.stderr
    assert run_batch(p.cfg(), session=lambda _: spark).batch == 4
    rows = p.table_rows("table", ["_partition", "_offset", "_batch"]).to_pylist()
    rows += p.table_rows("quarantine", ["_partition", "_offset", "_batch"]).to_pylist()
    read = Counter((r["_partition"], r["_offset"]) for r in rows if r["_batch"] == 4)
    assert read == expected_offsets(new)


def test_a_backfill_of_a_range_read_from_an_old_log_never_reads_the_new_one(
    make_pipeline, broker, spark
):
    from strata.run import reprocess
    from strata.store.ranges import OffsetRange

    p = make_pipeline(partitions=1)
    produce_clicks(broker, p.topic, 1, 200)
    assert run_batch(p.cfg(), session=lambda _: spark).batch == 1
    before = event_ids(p, p.topic)
    recreate(broker, p.topic, 1)
    produce_clicks(broker, p.topic, 1, 300, seed=9)
    # The new log is read from its end on: its offsets 10-20 are other messages than the
    # old log's, which batch 1 read.
    seek = p.cli("ledger", "seek", "--topic", p.topic, "--to", "latest", "--reason", "new log")
    assert seek.returncode == 0, seek.stderr
    produce_clicks(broker, p.topic, 1, 20, seed=10)
    assert run_batch(p.cfg(), session=lambda _: spark).batch == 3

    outcome = reprocess(
        p.cfg(), "backfill", [OffsetRange(p.topic, 0, 10, 20)], "INC-9", session=lambda _: spark
    )
    assert any("read from the raw copy" in w for w in outcome.warnings), outcome.warnings
    after = event_ids(p, p.topic)
    assert {o: after[o] for o in range(10, 20)} == {o: before[o] for o in range(10, 20)}
