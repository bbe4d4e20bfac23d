"""The run lock: an flock for local state locations, checked with real processes.

`Runner` (tests/locking.py) drives a separate Python process that takes and gives up
the run lock through `strata.store.lock.run_lock`, one command per line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from strata.config import PipelineConfig
from strata.errors import LeaseLost, LockBusy
from strata.store.fencing import Fence, FenceRecord
from strata.store.lease import hold_lease
from strata.store.lock import BothLocks, FileLock, run_lock
from tests.locking import Runner, pipeline_body


def test_lock_path_is_local_for_local_state_and_absent_for_object_stores(tmp_path):
    local = PipelineConfig.model_validate(pipeline_body(str(tmp_path / "wh")))
    assert local.lock_path == Path(local.location("state")) / "run.lock"
    moved = PipelineConfig.model_validate(
        pipeline_body(str(tmp_path / "wh"), lock_dir=str(tmp_path / "locks"))
    )
    assert moved.lock_path == tmp_path / "locks" / f"{moved.name}.lock"
    remote = PipelineConfig.model_validate(
        pipeline_body("s3://lake/wh", lock_dir=str(tmp_path / "locks"))
    )
    assert remote.lock_path is None


def test_a_second_run_on_local_state_is_refused_naming_the_holder(tmp_path):
    body = pipeline_body(str(tmp_path / "wh"))
    cfg = PipelineConfig.model_validate(body)
    with Runner(body, tmp_path / "holder.log") as holder:
        assert holder.ask("acquire")["won"]
        assert json.loads(cfg.lock_path.read_text())["pid"] == holder.pid
        with pytest.raises(LockBusy) as busy:
            with run_lock(cfg.places()):
                pass
        assert "another run is in flight" in str(busy.value)
        assert f'"pid": {holder.pid}' in str(busy.value)
        # An flock cannot be taken from a live holder, so there is nothing to lose.
        assert holder.ask("check")["ok"]
        assert holder.ask("release")["released"]
        with run_lock(cfg.places()) as lock:
            assert isinstance(lock, FileLock) and lock.path == cfg.lock_path
            lock.check()
            assert json.loads(cfg.lock_path.read_text())["pid"] == os.getpid()
            # Nobody takes an flock from a paused holder: there is nothing to fence.
            assert lock.token is None


def test_two_locks_held_as_one_are_fenced_by_the_first(tmp_path):
    cfg = PipelineConfig.model_validate(pipeline_body(str(tmp_path / "wh")))
    with (
        run_lock(cfg.places()) as run,
        hold_lease(str(tmp_path / "lease"), {}, cfg.name, 600) as lease,
    ):
        assert BothLocks(lease, run).token == lease.token == 1
        assert BothLocks(run, lease).token is None
        BothLocks(lease, run).check()


def test_the_kernel_frees_the_local_lock_of_a_killed_holder_at_once(tmp_path):
    body = pipeline_body(str(tmp_path / "wh"))
    cfg = PipelineConfig.model_validate(body)
    with Runner(body, tmp_path / "holder.log") as holder:
        assert holder.ask("acquire")["won"]
        with Runner(body, tmp_path / "second.log") as second:
            refused = second.ask("acquire")
            assert not refused["won"] and f'"pid": {holder.pid}' in refused["busy"]
            holder.kill()
            assert second.ask("acquire")["won"]
            assert json.loads(cfg.lock_path.read_text())["pid"] == second.pid


def test_a_fence_lets_a_holder_act_below_it_and_says_truthfully_what_stopped_it():
    fence = Fence(7, "this-run", floor=6)
    newest = FenceRecord(7, "vacuum", "other-run", "2026-01-01T00:00:00+00:00")
    for held in (None, 3, 6):
        fence.admit("p", "t1", held, lambda: pytest.fail("no record is read below the token"))
    # Its own token, written by another run: refused, naming the other.
    with pytest.raises(LeaseLost) as equal:
        fence.admit("p", "t1", 7, lambda: newest)
    assert "t1 holds the maintenance fence 7 (left by vacuum run other-run at 2026-01-01" in str(
        equal.value
    )
    assert "equal to this run's fencing token 7" in str(equal.value)
    assert "lease's folder is removed while a maintenance run is in flight" in str(equal.value)
    # Written by this run (its reply was lost): its own, from then on without a read.
    fence.admit("p", "t1", 7, lambda: FenceRecord(7, "compaction", "this-run"))
    fence.admit("p", "t1", 7, lambda: pytest.fail("known to be this run's"))
    # Above it: the tables held 6 when this run took the lease, so a later run fenced.
    with pytest.raises(LeaseLost, match="above this run's fencing token 7; the tables held") as up:
        fence.admit("p", "t2", 9, lambda: FenceRecord(9, "vacuum", "later-run"))
    assert "a later maintenance run fenced it" in str(up.value)
    # A holder that never read the tables cannot tell when that fence was left.
    with pytest.raises(LeaseLost, match="another maintenance run left that fence") as unknown:
        Fence(1, "r").admit("p", "t2", 9, lambda: None)
    assert "later" not in str(unknown.value)
