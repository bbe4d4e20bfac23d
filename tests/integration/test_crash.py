"""Exactly once across crashes: the real `strata run` process is killed, then re-run."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from strata import faults
from strata.run import run_batch
from strata.store.ledger import read_ledger
from tests.conftest import START_MS, expected_offsets, produce_clicks
from tests.faults import armed

STEPS = [
    faults.AFTER_FILES,
    faults.AFTER_RAW_COMMIT,
    faults.AFTER_QUARANTINE_COMMIT,
    faults.AFTER_DATA_COMMIT,
    faults.AFTER_LEDGER,
]


@pytest.mark.parametrize(
    ("step", "layout", "table_format"),
    [(step, "per_task", "delta") for step in STEPS]
    + [(faults.AFTER_RAW_COMMIT, "shuffle", "delta"), (faults.AFTER_FILES, "shuffle", "parquet")],
)
def test_a_kill_at_each_step_then_a_rerun_lands_each_message_once(
    make_pipeline, broker, spark, step, layout, table_format
):
    p = make_pipeline(partitions=3, overrides={"layout": layout, "table_format": table_format})
    per = produce_clicks(broker, p.topic, 3, 3000, malformed=5, late=5)

    crashed = p.cli("run", env=p.env(**armed(crash_at=step)))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr

    # The re-run in this process, on the shared Spark session: the kill is what must be
    # a real process.
    rerun = run_batch(p.cfg(), session=lambda _: spark)
    # After the ledger commit the batch is done: the re-run only catches up publishing.
    assert (rerun.status, rerun.batch) == (
        ("idle", None) if step == faults.AFTER_LEDGER else ("resumed", 1)
    )
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)
    ledger = read_ledger(p.cfg().places()).to_pylist()
    assert sorted((r["batch"], r["partition"]) for r in ledger) == [(1, q) for q in range(3)]
    assert all(
        r["rows"] + r["quarantined"] + r["gaps"] == r["end_offset"] - r["start_offset"]
        for r in ledger
    )
    assert sum(r["quarantined"] for r in ledger) == 5

    idle = p.cli("run")
    assert idle.returncode == 0 and "nothing new to read" in idle.stdout


def test_kills_at_random_moments_in_a_row_still_land_each_message_once(make_pipeline, broker):
    p = make_pipeline(partitions=2)
    rng = random.Random(20261122)
    total = {0: 0, 1: 0}
    strata = str(Path(sys.executable).parent / "strata")
    for round_ in range(4):
        new = produce_clicks(
            broker, p.topic, 2, 4000, seed=round_, start_ms=START_MS + round_ * 3_600_000, hours=1
        )
        total = {q: total[q] + new[q] for q in total}
        proc = subprocess.Popen(
            [strata, "run", "--pipeline", p.name, "--conf-dir", str(p.conf_dir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=p.env(),
            start_new_session=True,
        )
        time.sleep(rng.uniform(0.5, 9.0))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for _ in range(3):
        done = p.cli("run")
        assert done.returncode == 0, done.stderr
        if "nothing new to read" in done.stdout:
            break
    assert p.landed() == expected_offsets(total)
    assert p.raw_copies() == expected_offsets(total)
    batches = [r["batch"] for r in read_ledger(p.cfg().places()).to_pylist()]
    assert len(batches) == 2 * len(set(batches)), "each batch once per partition in the ledger"


def test_a_plain_parquet_rerun_removes_what_the_crashed_attempt_wrote(make_pipeline, broker, spark):
    p = make_pipeline(partitions=2, overrides={"layout": "shuffle", "table_format": "parquet"})
    per = produce_clicks(broker, p.topic, 2, 2000, malformed=3)
    crashed = p.cli("run", env=p.env(**armed(crash_at=faults.AFTER_FILES)))
    assert crashed.returncode == -signal.SIGKILL
    table_dir = Path(p.cfg().location("table"))
    assert list(table_dir.rglob("part-b0000000001-r*.parquet")), "the crashed attempt wrote files"
    # The re-run writes other file names (per-task layout): only the clean-up prevents doubles.
    conf = p.conf_dir / "pipelines" / f"{p.name}.yaml"
    conf.write_text(conf.read_text().replace("layout: shuffle", "layout: per_task"))
    assert run_batch(p.cfg(), session=lambda _: spark).status == "resumed"
    assert not list(table_dir.rglob("part-b0000000001-r*.parquet"))
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)


def test_a_plain_parquet_task_retried_in_a_run_leaves_no_file_of_its_failed_attempt(
    make_pipeline, broker, tmp_path
):
    # On a cluster a task attempt can fail after its files are complete (a lost executor);
    # Spark retries it. Plain Parquet readers see every file in a directory, so the
    # failed attempt's files must be gone once the batch is committed.
    p = make_pipeline(partitions=2, overrides={"table_format": "parquet"})
    per = produce_clicks(broker, p.topic, 2, 2000, malformed=3)
    marker = tmp_path / "failed-once"
    env = p.env(**armed(fail_once_at=faults.TASK_FILES_CLOSED, once=marker))
    done = p.cli("run", env=env)
    assert done.returncode == 0, done.stderr
    assert marker.exists(), "no task attempt failed: the test proves nothing"
    attempts: dict[str, set[str]] = {}
    for name in ("table", "raw", "quarantine"):
        # The data files (the table's identity marker and the like are not a task's).
        for path in Path(p.cfg().location(name)).rglob("part-*"):
            if path.is_file():
                task, attempt = path.name.split("-")[2:4]
                attempts.setdefault(task, set()).add(attempt)
    assert attempts and all(len(a) == 1 for a in attempts.values()), attempts
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)
