"""Two runners of one pipeline at once, on two "hosts", against a real S3 endpoint.

A zombie Airflow task, a cluster-mode driver whose client gave up, the ingest and
backfill DAGs at once: runners that share no local lock. Each message still lands
exactly once: a lease on the object store lets one runner work at a time, the saved
plan is created only where none exists, and every table's commit of a batch is made
once (the batch's app transaction is checked again inside the commit).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from strata import faults
from strata.batch.plan import KEPT_PLANS, PlanStore
from strata.errors import LockBusy
from strata.run import run_batch
from strata.store.files import list_names
from strata.store.ledger import read_ledger
from tests.conftest import expected_offsets, produce_clicks, s3_landed, s3_pipeline
from tests.faults import armed
from tests.locking import s3_options


def second_host(p, tmp_path: Path):
    """The same pipeline configured on another machine: its own copy of the conf dir.

    The two share nothing local (no lock file, no directory): only the object store.
    """
    conf = tmp_path / "other-host" / "conf"
    shutil.copytree(p.conf_dir, conf)
    # The schema is found relative to the conf dir's parent.
    shutil.copytree(p.conf_dir.parent / "schemas", conf.parent / "schemas")
    return dataclasses.replace(p, conf_dir=conf)


def start(p, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return p.spawn("run", *args, env=env)


def delta(p, which: str, options: dict[str, str]) -> DeltaTable:
    return DeltaTable(
        p.cfg().location(which), storage_options={**options, "conditional_put": "etag"}
    )


def test_two_runs_at_once_on_s3_land_each_message_once(
    make_pipeline, broker, s3_endpoint, tmp_path
):
    p, options = s3_pipeline(make_pipeline, s3_endpoint, tmp_path, "runners1")
    other = second_host(p, tmp_path)
    per = produce_clicks(broker, p.topic, 2, 20_000, malformed=5)
    runs = [start(p), start(other)]
    outcomes = [(proc.wait(300), *proc.communicate()) for proc in runs]
    codes = sorted(code for code, _, _ in outcomes)
    # One runs the batch; the other finds the lease held (3) or, if it started after
    # the first finished, nothing new (0).
    assert codes in ([0, 0], [0, 3]), outcomes
    for code, _, err in outcomes:
        if code == 3:
            assert "another run is in flight" in err, err
    assert s3_landed(p, options) == expected_offsets(per)
    for which in ("table", "raw", "quarantine", "ledger"):
        assert delta(p, which, options).transaction_version(p.name) == 1
    ledger = delta(p, "ledger", options).to_pyarrow_table().to_pylist()
    assert sorted((r["batch"], r["partition"]) for r in ledger) == [(1, 0), (1, 1)]


def stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("T")


def wait_frozen(proc: subprocess.Popen[str], deadline: float) -> None:
    """Wait until a runner armed with `stop_at` has stopped itself there."""
    while not stopped(proc.pid):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the runner never reached its stop"
        time.sleep(0.2)


def run_once_the_lease_expires(other, deadline: float) -> None:
    """Run `other` until it gets the lease a frozen runner holds: it is refused till then."""
    while True:
        b = other.cli("run", "--json")
        if b.returncode == 0:
            return
        assert b.returncode == 3 and "another run is in flight" in b.stderr, b.stderr
        assert time.monotonic() < deadline, "the lease of the frozen runner never expired"
        time.sleep(1)


def test_a_runner_paused_past_its_lease_commits_nothing_when_it_wakes(
    make_pipeline, broker, s3_endpoint, tmp_path
):
    # Runner A freezes between its lease check and its first commit (a long pause of
    # its host), long enough for its lease to run out. Runner B, on another host, takes
    # the lease and commits the batch. When A wakes its commit must be a no-op and it
    # must stop; every message lands once and no file A wrote is in any table.
    p, options = s3_pipeline(make_pipeline, s3_endpoint, tmp_path, "runners2", lock_lease="4s")
    other = second_host(p, tmp_path)
    per = produce_clicks(broker, p.topic, 2, 3000, malformed=3)
    a = start(p, env=p.env(**armed(stop_at=faults.BEFORE_RAW_COMMIT)))
    deadline = time.monotonic() + 240
    wait_frozen(a, deadline)
    try:
        run_once_the_lease_expires(other, deadline)
    finally:
        os.kill(a.pid, signal.SIGCONT)
    out, err = a.communicate(timeout=300)
    assert a.returncode == 3, (out, err)
    assert "lost its lease" in err, err

    assert s3_landed(p, options) == expected_offsets(per)
    for which in ("table", "raw", "quarantine", "ledger"):
        table = delta(p, which, options)
        assert table.transaction_version(p.name) == 1
        # One commit of batch 1 per table, whatever A did after waking.
        commits = [c for c in table.history() if c.get("strata.batch") == 1]
        assert len(commits) == 1, which
    raw = delta(p, "raw", options)
    assert raw.to_pyarrow_table(columns=["_offset"]).num_rows == sum(per.values())
    paths = pa.table(raw.get_add_actions(flatten=True)).column("path").to_pylist()
    runs = {path.split("-")[-2] for path in paths}
    assert len(runs) == 1, paths  # every committed raw file was written by runner B


def test_a_runner_frozen_holding_a_plan_that_another_runner_pruned_commits_nothing_when_it_wakes(
    make_pipeline, broker, spark, s3_endpoint, tmp_path
):
    # Runner A saves the plan of batch 1 and freezes before its first commit. Runner B
    # takes the lease, commits batch 1 and the batches after it, one offset each, and
    # batch 1's plan is pruned: as the commit of batch 1 + KEPT_PLANS does (`_forget_plan`),
    # here done at once rather than by a hundred more batches. When A wakes it must commit
    # nothing and stop. The plans and the lease are on S3; the tables on local disk, which
    # the two runners share here.
    options = s3_options(s3_endpoint)
    p = make_pipeline(
        partitions=1,
        overrides={
            "state_dir": f"s3://lake/prune-{uuid.uuid4().hex[:8]}",
            "storage_options": options,
            "lock_lease": "4s",
        },
    )
    other = second_host(p, tmp_path)
    per = produce_clicks(broker, p.topic, 1, 2, hours=1)
    batches = per[0]  # one offset a batch
    a = start(p, "--max-offsets", "1", env=p.env(**armed(stop_at=faults.BEFORE_RAW_COMMIT)))
    deadline = time.monotonic() + 240
    wait_frozen(a, deadline)
    try:
        outcomes = []
        while not outcomes or outcomes[-1].status != "idle":
            try:
                outcomes.append(run_batch(other.cfg(), max_offsets=1, session=lambda _: spark))
            except LockBusy:
                # A's lease has not run out yet.
                assert not outcomes and time.monotonic() < deadline
                time.sleep(1)
        assert [o.batch for o in outcomes] == [*range(1, batches + 1), None]
        assert outcomes[0].status == "resumed"  # B finished the batch A planned
        PlanStore(p.cfg().places()).forget(1)
        assert PlanStore(p.cfg().places()).load(1) is None
    finally:
        os.kill(a.pid, signal.SIGCONT)
    out, err = a.communicate(timeout=300)

    assert a.returncode == 3, (out, err)
    assert "lost its lease" in err, err
    assert p.landed() == expected_offsets(per)
    assert p.raw_copies() == expected_offsets(per)
    ledger = read_ledger(p.cfg().places()).to_pylist()
    assert sorted((r["batch"], r["start_offset"], r["end_offset"]) for r in ledger) == [
        (b, b - 1, b) for b in range(1, batches + 1)
    ]
    for which in ("table", "raw", "quarantine", "ledger"):
        table = DeltaTable(p.cfg().location(which))
        assert table.transaction_version(p.name) == batches, which
        commits = [c for c in table.history() if c.get("strata.batch") == 1]
        assert len(commits) == 1, which
    # The batches after 1 keep their plan; A saved none again.
    plans = list_names(f"{p.cfg().places().state.uri}/plans", options)
    kept = sorted(int(name[6:16]) for name in plans)
    assert kept == list(range(2, batches + 1)) and batches < KEPT_PLANS
