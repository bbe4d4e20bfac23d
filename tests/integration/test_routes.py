"""Topics routed to tables of their own, through the real broker, Spark and command line."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from collections import Counter

import pytest
import yaml
from deltalake import DeltaTable

from strata import faults
from strata.cli import main
from strata.config import load_pipeline
from strata.store.ledger import read_ledger
from tests.conftest import ROOT, produce_clicks, s3_pipeline
from tests.faults import armed
from tests.integration.test_runners import second_host, wait_frozen


def _route(p, topics: list[str] | None = None, pattern: str | None = None) -> None:
    """Make the pipeline route its topics to tables named after them, one schema each."""
    path = p.conf_dir / "pipelines" / f"{p.name}.yaml"
    body = yaml.safe_load(path.read_text())
    body.pop("topics")
    body.update(schema_file="{table}.avsc", routing={"table": "{topic}"})
    body.update({"topics": topics} if topics else {"topics_pattern": pattern})
    path.write_text(yaml.safe_dump(body))


def _schema_for(p, table: str) -> None:
    schemas = p.conf_dir.parent / "schemas"
    shutil.copy(ROOT / "schemas" / "clicks.avsc", schemas / f"{table}.avsc")


def _rows(cfg, which: str) -> Counter[tuple[str, int, int]]:
    """Rows of one of a table's tables, Delta or plain Parquet, by coordinates."""
    from strata.store.tables import read

    t = read(cfg.places().table(which), ["_topic", "_partition", "_offset"])
    return Counter(
        zip(
            t.column("_topic").to_pylist(),
            t.column("_partition").to_pylist(),
            t.column("_offset").to_pylist(),
            strict=True,
        )
    )


def _landed(cfg) -> Counter[tuple[str, int, int]]:
    return _rows(cfg, "table") + _rows(cfg, "quarantine")


def _routed_tables(
    p, broker, name: str, count: int = 3, partitions: int = 2
) -> tuple[list[str], dict[str, dict[int, int]]]:
    """Topics (three by default) with messages, each routed to a table of its own."""
    topics = [f"{p.topic}.{name}{i}" for i in range(count)]
    counts = {}
    for i, topic in enumerate(topics):
        broker.create_topic(topic, partitions)
        counts[topic] = produce_clicks(broker, topic, partitions, 9 + 4 * i, seed=i)
    _route(p, topics=topics)
    cfg = load_pipeline(p.name, p.conf_dir)
    for topic in topics:
        _schema_for(p, cfg.table_for(topic))
    return topics, counts


def _exact(cfg, topic: str, counts: dict[int, int]) -> Counter[tuple[str, int, int]]:
    return Counter({(topic, q, o): 1 for q, n in counts.items() for o in range(n)})


def test_three_topics_land_in_three_tables_with_ledgers_of_their_own(make_pipeline, broker, spark):
    p = make_pipeline(partitions=2)
    topics, counts = _routed_tables(p, broker, "kind")
    cfg = load_pipeline(p.name, p.conf_dir)
    tables = [cfg.table_for(t) for t in topics]

    # One `strata run` process runs every table, on one Spark session.
    done = p.cli("run", "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(body["tables"]) == sorted(tables)
    assert {t: b["status"] for t, b in body["tables"].items()} == dict.fromkeys(tables, "committed")
    for topic, table in zip(topics, tables, strict=True):
        child = cfg.route(table)
        assert _landed(child) == Counter(
            {(topic, q, o): 1 for q, n in counts[topic].items() for o in range(n)}
        )
        ledger = read_ledger(child.places()).to_pylist()
        assert {r["topic"] for r in ledger} == {topic}
        assert {r["pipeline"] for r in ledger} == {table} and {r["batch"] for r in ledger} == {1}
        assert sum(r["messages"] for r in ledger) == sum(counts[topic].values())
    assert len({cfg.route(t).location("ledger") for t in tables}) == 3

    # One table's topic gets more messages: only its table has a second batch.
    more = produce_clicks(broker, topics[1], 2, 8, seed=9)
    assert main(["run", "--pipeline", p.name, "--conf-dir", str(p.conf_dir)]) == 0
    batches = {
        t: max(r["batch"] for r in read_ledger(cfg.route(t).places()).to_pylist()) for t in tables
    }
    assert batches == {tables[0]: 1, tables[1]: 2, tables[2]: 1}
    app = cfg.route(tables[1])
    assert sum(_landed(app).values()) == sum(counts[topics[1]].values()) + sum(more.values())
    assert max(_landed(app).values()) == 1


def test_a_routed_run_reads_every_table_in_one_spark_job(make_pipeline, broker, spark, monkeypatch):
    p = make_pipeline(partitions=2)
    topics, counts = _routed_tables(p, broker, "one")
    cfg = load_pipeline(p.name, p.conf_dir)
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup())
    # Fewer tasks than splits: the splits of the three tables are packed into tasks.
    monkeypatch.setattr("strata.batch.task.SPLITS_PER_SLOT", 1)
    slots = spark.sparkContext.defaultParallelism
    assert len(topics) * 2 > slots

    assert main(["run", "--pipeline", p.name, "--conf-dir", str(p.conf_dir)]) == 0

    # The tables' batches are their own (plans, commits, ledgers); their reads are one job.
    jobs = set(tracker.getJobIdsForGroup()) - before
    assert len(jobs) == 1
    stages = tracker.getJobInfo(jobs.pop()).stageIds
    assert sum(tracker.getStageInfo(s).numTasks for s in stages) == slots
    for topic in topics:
        table = cfg.route(cfg.table_for(topic))
        assert _landed(table) == _exact(cfg, topic, counts[topic])
        assert {r["batch"] for r in read_ledger(table.places()).to_pylist()} == {1}


def test_a_task_failing_for_one_table_of_the_shared_job_fails_that_table_alone(
    make_pipeline, broker
):
    p = make_pipeline(partitions=2)
    topics, counts = _routed_tables(p, broker, "fail")
    cfg = load_pipeline(p.name, p.conf_dir)
    bad = topics[1]

    # Every read of one topic fails in the Spark worker: the shared job fails, each
    # table's tasks run again alone, and only the table of that topic fails.
    failed = p.cli("run", "--json", env=p.env(**armed(fail_topic=bad)))
    assert failed.returncode == 1, failed.stderr
    body = json.loads(failed.stdout.strip().splitlines()[-1])
    status = {t: b["status"] for t, b in body["tables"].items()}
    assert status == {
        cfg.table_for(topics[0]): "committed",
        cfg.table_for(bad): "failed",
        cfg.table_for(topics[2]): "committed",
    }
    assert f"table {cfg.table_for(bad)} of pipeline {p.name} failed" in failed.stderr
    assert read_ledger(cfg.route(cfg.table_for(bad)).places()).num_rows == 0

    # The next run finishes the failed table's saved plan; nothing lands twice.
    again = p.cli("run", "--json")
    assert again.returncode == 0, again.stderr
    body = json.loads(again.stdout.strip().splitlines()[-1])
    assert body["tables"][cfg.table_for(bad)]["status"] == "resumed"
    for topic in topics:
        assert _landed(cfg.route(cfg.table_for(topic))) == _exact(cfg, topic, counts[topic])


def test_a_pattern_routes_a_new_topic_to_a_new_table_and_a_broken_table_stops_only_itself(
    make_pipeline, broker, spark, capsys
):
    p = make_pipeline(partitions=1)
    first, second, third = (f"{p.topic}.{k}" for k in ("a", "b", "c"))
    _route(p, pattern=rf"{re.escape(p.topic)}\..+")
    cfg = load_pipeline(p.name, p.conf_dir)
    argv = ["--pipeline", p.name, "--conf-dir", str(p.conf_dir)]
    broker.create_topic(first, 1)
    one = produce_clicks(broker, first, 1, 12)
    _schema_for(p, cfg.table_for(first))
    assert main(["run", *argv]) == 0

    # Created between runs: a table of its own from the next run on. The third topic's
    # table has no schema yet: it fails, named, and the others go on.
    broker.create_topic(second, 1)
    broker.create_topic(third, 1)
    two = produce_clicks(broker, second, 1, 7)
    produce_clicks(broker, third, 1, 5)
    _schema_for(p, cfg.table_for(second))
    capsys.readouterr()
    assert main(["run", "--json", *argv]) == 1
    out, err = capsys.readouterr()
    body = json.loads(out.strip().splitlines()[-1])
    assert body["tables"][cfg.table_for(first)]["status"] == "idle"
    assert body["tables"][cfg.table_for(second)]["status"] == "committed"
    broken = body["tables"][cfg.table_for(third)]
    assert broken["status"] == "failed" and f"{cfg.table_for(third)}.avsc" in broken["error"]
    assert f"table {cfg.table_for(third)} of pipeline {p.name} failed" in err
    assert _landed(cfg.route(cfg.table_for(first))) == Counter(
        {(first, 0, o): 1 for o in range(one[0])}
    )
    assert _landed(cfg.route(cfg.table_for(second))) == Counter(
        {(second, 0, o): 1 for o in range(two[0])}
    )

    # `status` shows each table; a one-table command names the tables to choose from.
    _schema_for(p, cfg.table_for(third))
    assert main(["run", *argv]) == 0
    capsys.readouterr()
    assert main(["status", "--json", *argv]) == 0
    status = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert sorted(status["tables"]) == sorted(cfg.table_for(t) for t in (first, second, third))
    assert all(s["last_batch"] == 1 for s in status["tables"].values())
    assert main(["quality", *argv]) == 2
    assert f"name it as --pipeline {p.name}:TABLE" in capsys.readouterr().err


def test_a_table_whose_topics_are_all_gone_is_left_out_of_runs_until_one_comes_back(
    make_pipeline, broker, spark, capsys
):
    p = make_pipeline(partitions=1)
    kept, gone = (f"{p.topic}.{k}" for k in ("kept", "gone"))
    _route(p, pattern=rf"{re.escape(p.topic)}\..+")
    cfg = load_pipeline(p.name, p.conf_dir)
    argv = ["--pipeline", p.name, "--conf-dir", str(p.conf_dir)]
    for topic in (kept, gone):
        broker.create_topic(topic, 1)
        produce_clicks(broker, topic, 1, 6)
        _schema_for(p, cfg.table_for(topic))
    assert main(["run", *argv]) == 0

    def run() -> dict:
        capsys.readouterr()
        assert main(["run", "--json", *argv]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tables"]

    # A pattern's topic deleted (its retention over): one more run says so, then the
    # runs leave its table out; its status stays.
    broker.delete_topic(gone)
    said = run()[cfg.table_for(gone)]
    assert said["status"] == "idle"
    assert any("runs leave it out" in w for w in said["warnings"]), said
    assert sorted(run()) == [cfg.table_for(kept)]
    capsys.readouterr()
    assert main(["status", "--json", *argv]) == 0
    status = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert status["tables"][cfg.table_for(gone)]["last_batch"] == 1

    # A topic of that name again: its table is run again at once, and (a new topic
    # under an old name) stops, naming the way on.
    broker.create_topic(gone, 1)
    produce_clicks(broker, gone, 1, 12, seed=3)
    capsys.readouterr()
    assert main(["run", "--json", *argv]) == 1
    back = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tables"]
    assert sorted(back) == sorted(cfg.table_for(t) for t in (kept, gone))
    assert "was deleted and created again" in back[cfg.table_for(gone)]["error"]


def test_a_topic_taken_off_the_list_leaves_its_table_out_of_runs(make_pipeline, broker, spark):
    p = make_pipeline(partitions=2)
    topics, counts = _routed_tables(p, broker, "listed")
    cfg = load_pipeline(p.name, p.conf_dir)
    assert p.cli("run").returncode == 0
    _route(p, topics=topics[:2])

    # Nothing to read for it: the runs leave it out; its rows stay.
    done = p.cli("run", "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(body["tables"]) == sorted(cfg.table_for(t) for t in topics[:2])
    gone = cfg.route(cfg.table_for(topics[2]))
    assert _landed(gone) == _exact(cfg, topics[2], counts[topics[2]])

    # Its status, and the commands that look at what it holds, still see it.
    shown = p.cli("status", "--json")
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout.strip().splitlines()[-1])["tables"]
    assert sorted(status) == sorted(cfg.table_for(t) for t in topics)
    assert status[cfg.table_for(topics[2])]["last_batch"] == 1
    assert p.cli("compact", "--dry-run").returncode == 0


def _count_requests(monkeypatch) -> Counter[str]:
    """Count the requests the driver's kept Kafka clients make, by client and method."""
    from contextlib import contextmanager

    from strata.batch import _clients

    asked: Counter[str] = Counter()
    held = _clients._held

    class Counted:
        def __init__(self, client, kind: str) -> None:
            self.client, self.kind = client, kind

        def __getattr__(self, name: str):
            got = getattr(self.client, name)
            if not callable(got):
                return got

            def call(*args, **kwargs):
                asked[f"{self.kind}.{name}"] += 1
                return got(*args, **kwargs)

            return call

    @contextmanager
    def counted(kind, conf, make):
        with held(kind, conf, make) as client:
            yield Counted(client, kind)

    monkeypatch.setattr(_clients, "_held", counted)
    return asked


def test_the_brokers_are_asked_once_for_all_tables_and_a_missing_topic_fails_its_table_alone(
    make_pipeline, broker, spark, monkeypatch, capsys
):
    p = make_pipeline(partitions=2)
    topics, counts = _routed_tables(p, broker, "asked", count=5)
    cfg = load_pipeline(p.name, p.conf_dir)
    argv = ["--pipeline", p.name, "--conf-dir", str(p.conf_dir)]
    asked = _count_requests(monkeypatch)

    # Each table's plan, lag and status need its topics' partitions, watermarks (log
    # start, last stable offset, high watermark: one request each), ids and retention:
    # asked once for all five tables, before the run and after it.
    assert main(["run", *argv]) == 0
    assert asked["consumer.list_topics"] == 2, asked
    assert asked["consumer.offsets_for_times"] == 6, asked
    assert asked["admin.describe_topics"] == 2, asked
    assert asked["admin.describe_configs"] == 1, asked
    for topic in topics:
        assert _landed(cfg.route(cfg.table_for(topic))) == _exact(cfg, topic, counts[topic])
    asked.clear()
    capsys.readouterr()
    assert main(["status", "--json", *argv]) == 0
    status = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tables"]
    assert {t: s["last_batch"] for t, s in status.items()} == dict.fromkeys(
        (cfg.table_for(t) for t in topics), 1
    )
    assert asked["consumer.list_topics"] == 1 and asked["consumer.offsets_for_times"] == 3, asked
    # An idle run sends the group no offset it holds already.
    asked.clear()
    assert main(["run", *argv]) == 0
    assert asked["consumer.commit"] == 0 and asked["consumer.committed"] == 2, asked

    # A listed topic deleted: the answers asked together do not cover it, so its table
    # asks the brokers itself and fails alone, naming it; the others read what came.
    broker.delete_topic(topics[1])
    more = produce_clicks(broker, topics[0], 2, 4, seed=7)
    capsys.readouterr()
    assert main(["run", "--json", *argv]) == 1
    body = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tables"]
    assert body[cfg.table_for(topics[0])]["status"] == "committed"
    assert {body[cfg.table_for(t)]["status"] for t in topics[2:]} == {"idle"}
    gone = body[cfg.table_for(topics[1])]
    assert gone["status"] == "failed" and f"topic `{topics[1]}` is not available" in gone["error"]
    first = cfg.route(cfg.table_for(topics[0]))
    assert sum(_landed(first).values()) == sum(counts[topics[0]].values()) + sum(more.values())
    assert max(_landed(first).values()) == 1


def test_brokers_out_of_reach_fail_every_table_after_one_wait_not_one_per_table(
    make_pipeline, monkeypatch, capsys
):
    from strata.local.service import free_port

    p = make_pipeline(partitions=1)
    topics = [f"{p.topic}.far{i}" for i in range(6)]
    _route(p, topics=topics)
    path = p.conf_dir / "pipelines" / f"{p.name}.yaml"
    body = yaml.safe_load(path.read_text())
    # Nothing listens there: every request waits out the timeout.
    body["kafka"] = {"bootstrap_servers": f"127.0.0.1:{free_port()}", "timeout_s": 1}
    path.write_text(yaml.safe_dump(body))
    cfg = load_pipeline(p.name, p.conf_dir)
    for topic in topics:
        _schema_for(p, cfg.table_for(topic))
    asked = _count_requests(monkeypatch)

    capsys.readouterr()
    assert main(["run", "--json", "--pipeline", p.name, "--conf-dir", str(p.conf_dir)]) == 1
    tables = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tables"]
    assert sorted(tables) == sorted(cfg.table_for(t) for t in topics)
    for table in tables.values():
        assert table["status"] == "failed" and "cannot reach the brokers" in table["error"]
    # One metadata request found them out of reach, for all six tables.
    assert asked["consumer.list_topics"] == 1, asked


def test_the_ingest_dag_runs_every_table_and_shows_each(
    make_pipeline, broker, spark, airflow_db, monkeypatch
):
    from tests.integration.test_airflow import load_dags, states

    p = make_pipeline(partitions=1, overrides={"quality": {"gate": "warn"}})
    topics, counts = _routed_tables(p, broker, "dag", count=2, partitions=1)
    cfg = load_pipeline(p.name, p.conf_dir)
    monkeypatch.setenv("STRATA_CONF_DIR", str(p.conf_dir))
    dag = load_dags(p.conf_dir).dags[f"strata_ingest_{p.name}"]

    run = dag.test()
    assert str(run.state) == "success", states(run)
    shown = {ti.task_id: ti.xcom_pull(task_ids=ti.task_id) for ti in run.get_task_instances()}
    for topic in topics:
        table = cfg.table_for(topic)
        planned = shown["plan"]["tables"][table]
        assert planned["batch"] == 1
        assert [(r["topic"], r["start"], r["end"]) for r in planned["ranges"]] == [
            (topic, 0, counts[topic][0])
        ]
        assert (
            shown["ingest"]["tables"][table]["rows"]
            + shown["ingest"]["tables"][table]["quarantined"]
            == counts[topic][0]
        )
        assert shown["quality_gate"]["tables"][table]["batch"] == 1
        assert shown["quality_gate"]["tables"][table]["gate"] == "warn"
        assert _landed(cfg.route(table)) == Counter(
            {(topic, 0, o): 1 for o in range(counts[topic][0])}
        )


@pytest.mark.parametrize("table_format", ["delta", "parquet"])
def test_routed_tables_that_would_share_a_place_are_refused_at_load(
    make_pipeline, broker, table_format
):
    # Topics `X` and `X.raw` with the default template land in tables `x` and `x_raw`,
    # and `x_raw` is where `x`'s raw copy lives: one table's commits would remove the
    # other's files (plain Parquet) or mix the two (Delta).
    p = make_pipeline(partitions=1, overrides={"table_format": table_format})
    raw = f"{p.topic}.raw"
    broker.create_topic(raw, 1)
    for topic in (p.topic, raw):
        produce_clicks(broker, topic, 1, 30)
    _route(p, topics=[p.topic, raw])
    base = re.sub(r"[^a-z0-9_]", "_", p.topic)
    for table in (base, f"{base}_raw"):
        _schema_for(p, table)

    done = p.cli("run", "--json")
    assert done.returncode == 2, done.stdout + done.stderr
    error = done.stderr
    assert f"{p.name}.yaml" in error and "routing.tables" in error, error
    assert f"the raw copy of table `{p.name}:{base}`" in error, error
    assert f"the data table of table `{p.name}:{base}_raw` (topic `{raw}`)" in error, error
    assert not p.warehouse.exists() or not any(p.warehouse.iterdir())


@pytest.mark.parametrize("table_format", ["delta", "parquet"])
def test_a_table_a_pattern_matches_later_that_would_clash_fails_alone(
    make_pipeline, broker, table_format
):
    p = make_pipeline(partitions=1, overrides={"table_format": table_format})
    raw = f"{p.topic}.raw"
    _route(p, pattern=rf"{re.escape(p.topic)}(\.raw)?")
    base = re.sub(r"[^a-z0-9_]", "_", p.topic)
    for table in (base, f"{base}_raw"):
        _schema_for(p, table)
    first = produce_clicks(broker, p.topic, 1, 30)
    done = p.cli("run", "--json")
    assert done.returncode == 0, done.stderr

    # `X.raw` is created: its table would take `x`'s raw copy's place and name.
    broker.create_topic(raw, 1)
    produce_clicks(broker, raw, 1, 40, seed=3)
    more = produce_clicks(broker, p.topic, 1, 20, seed=4)
    done = p.cli("run", "--json")
    assert done.returncode == 1, done.stdout
    body = json.loads(done.stdout.strip().splitlines()[-1])
    assert body["tables"][base]["status"] == "committed", body
    failed = body["tables"][f"{base}_raw"]
    assert failed["status"] == "failed" and "routing.tables" in failed["error"], failed
    assert f"the raw copy of table `{p.name}:{base}`" in failed["error"], failed

    cfg = load_pipeline(p.name, p.conf_dir).route(base)
    expected = Counter({(p.topic, 0, o): 1 for o in range(first[0] + more[0])})
    assert _landed(cfg) == expected
    # Its raw copy holds each message of its own topic once, and nothing else.
    assert _rows(cfg, "raw") == expected
    tables = p.warehouse / "_strata" / p.name / "tables"
    assert sorted(f.name for f in tables.iterdir()) == [base]


def test_a_routed_runner_frozen_past_its_leases_commits_nothing_when_it_wakes(
    make_pipeline, broker, s3_endpoint, tmp_path
):
    # Runner A freezes at its first commit, after the shared job read all three tables,
    # while its other tables' steps are anywhere on their way (four at a time). Its
    # leases run out; runner B, on another host, takes each table's lease and commits
    # its batch. When A wakes, no table may take a commit of A's, and every message of
    # each topic lands once in its own table.
    p, options = s3_pipeline(make_pipeline, s3_endpoint, tmp_path, "routed-frozen", lock_lease="4s")
    topics, counts = _routed_tables(p, broker, "frozen")
    cfg = load_pipeline(p.name, p.conf_dir)
    other = second_host(p, tmp_path)
    stop = armed(stop_at=faults.BEFORE_RAW_COMMIT, once=tmp_path / "stopped")
    a = p.spawn("run", "--json", env=p.env(**stop))
    deadline = time.monotonic() + 240
    wait_frozen(a, deadline)
    try:
        while True:
            b = other.cli("run", "--json")
            if b.returncode == 0:
                break
            body = json.loads(b.stdout.strip().splitlines()[-1])
            failed = [t for t, r in body["tables"].items() if r["status"] == "failed"]
            assert failed and all(
                "another run is in flight" in body["tables"][t]["error"] for t in failed
            ), b.stdout
            assert time.monotonic() < deadline, "the frozen runner's leases never expired"
            time.sleep(1)
    finally:
        os.kill(a.pid, signal.SIGCONT)
    out, err = a.communicate(timeout=300)
    assert a.returncode != 0, (out, err)
    # Each table's error is in the run's summary (stderr only names the tables).
    woke = json.loads(out.strip().splitlines()[-1])["tables"]
    assert {r["status"] for r in woke.values()} == {"failed"}, woke
    assert all("lease" in r["error"] for r in woke.values()), woke

    for topic in topics:
        table = cfg.route(cfg.table_for(topic))
        assert _landed(table) == _exact(cfg, topic, counts[topic]), topic
        for which in ("table", "raw", "quarantine", "ledger"):
            log = DeltaTable(
                table.location(which), storage_options={**options, "conditional_put": "etag"}
            )
            # One commit of batch 1 per table, whatever A did after waking.
            commits = [c for c in log.history() if c.get("strata.batch") == 1]
            assert len(commits) == 1, (topic, which)
