"""The run lease on a local folder, and the create-if-absent write it stands on.

The same on a real S3 endpoint, with runners killed, paused and cut off, is in
tests/integration/test_lease.py.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from strata.errors import LockBusy
from strata.store.files import list_names, put_if_absent, read_object
from strata.store.lease import Epoch, Lease, hold_lease
from tests.locking import check_put_if_absent, check_racing_creates


def test_put_if_absent_creates_once_and_never_replaces(tmp_path):
    base = str(tmp_path / "objects")
    check_put_if_absent(base, {})
    # No temporary file is left beside it.
    assert sorted(os.listdir(f"{base}/plans")) == ["batch-1.json"]


def test_two_processes_racing_to_create_the_same_names_never_both_win(tmp_path):
    check_racing_creates(str(tmp_path / "objects"), {})


def test_a_holder_on_this_host_whose_pid_was_reused_is_not_taken_for_alive(tmp_path):
    # A recycled pid cannot be produced on demand, so the records are written by hand:
    # one naming a live process with its true start time, then one naming the same pid
    # with another start time, as a holder that died and whose pid was reused would.
    where = str(tmp_path / "lease")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        stat = Path(f"/proc/{sleeper.pid}/stat").read_text().rsplit(")", 1)[1].split()
        holder = Epoch(
            number=1,
            pipeline="p",
            run="someone",
            host=socket.gethostname(),
            pid=sleeper.pid,
            pid_start=int(stat[19]),
            boot_id=Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
            pid_ns=os.readlink("/proc/self/ns/pid"),
            since="2025-11-22T10:00:00+00:00",
            expires=time.time() + 600,
        )
        assert put_if_absent(f"{where}/epoch-000000000001.json", {}, holder.to_bytes())
        with pytest.raises(LockBusy, match=f'"pid": {sleeper.pid}'):
            with hold_lease(where, {}, "p", 600):
                pass
        reused = dataclasses.replace(holder, number=2, pid_start=(holder.pid_start or 0) - 1)
        assert put_if_absent(f"{where}/epoch-000000000002.json", {}, reused.to_bytes())
        with hold_lease(where, {}, "p", 600) as lease:
            lease.check()
            names = list_names(where, {})
            taken = Epoch.from_bytes(read_object(f"{where}/{names[-1]}", {}) or b"", names[-1])
            assert (taken.number, taken.run, taken.pid) == (3, lease.run, os.getpid())
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_lease_given_up_is_free_at_once_and_a_second_hold_in_one_process_is_refused(
    tmp_path,
):
    where = str(tmp_path / "lease")
    with hold_lease(where, {}, "p", 600) as first:
        with pytest.raises(LockBusy, match=f'"pid": {os.getpid()}'):
            Lease(where, {}, "p", 600).acquire()
        first.check()
    with hold_lease(where, {}, "p", 600) as second:
        second.check()
    names = list_names(where, {})
    released = Epoch.from_bytes(read_object(f"{where}/{names[-1]}", {}) or b"", names[-1])
    assert released.release and released.run == second.run


def test_the_fencing_token_is_the_epoch_taken_and_every_later_holder_takes_a_higher_one(
    tmp_path,
):
    where = str(tmp_path / "lease")

    def newest() -> int:
        return int(list_names(where, {})[-1].split("-")[1].split(".")[0])

    assert Lease(where, {}, "p", 600).token is None  # nothing held yet
    with hold_lease(where, {}, "p", 0.4) as first:
        assert first.token == newest() == 1
        # Renewals (every 0.1 s here) create newer epochs; the token stays.
        deadline = time.monotonic() + 30
        while newest() < 4:
            assert time.monotonic() < deadline, "the lease was never renewed"
            time.sleep(0.05)
        first.check()
        assert first.token == 1
    released = newest()
    with hold_lease(where, {}, "p", 600) as second:
        assert second.token == released + 1 > 1
    # Given up or taken over, the next holder's token is above every earlier one's.
    with hold_lease(where, {}, "p", 600) as third:
        assert third.token is not None and third.token > (second.token or 0)


def test_the_token_starts_above_the_tables_fences_and_the_last_holders_whatever_the_folder(
    tmp_path,
):
    where = tmp_path / "lease"
    read: list[int] = []

    def fences(highest: int):
        def floor() -> int:
            read.append(highest)
            return highest

        return floor

    # The tables hold fence 10 (an earlier deployment's, say): the token starts above it.
    with hold_lease(str(where), {}, "p", 600, "maintenance", fences(10)) as first:
        assert first.token == 11 and first.fence is not None and first.fence.floor == 10
        # Read only once the lease was free: a holder in flight is never asked about.
        with pytest.raises(LockBusy):
            hold_lease(str(where), {}, "p", 600, "maintenance", fences(99)).__enter__()
    assert read == [10]
    # Tables fenced lower than the last holder's token: above the holder's all the same.
    with hold_lease(str(where), {}, "p", 600, "maintenance", fences(0)) as second:
        assert second.token == 12
    # The folder removed by hand: its epochs start again at 1, and the token goes on
    # above what the tables hold, which the last holder's acts left there.
    shutil.rmtree(where)
    with hold_lease(str(where), {}, "p", 600, "maintenance", fences(12)) as third:
        assert third.token == 13
        [name] = list_names(str(where), {})
        epoch = Epoch.from_bytes(read_object(f"{where}/{name}", {}) or b"", name)
        assert (epoch.number, epoch.token, epoch.run) == (1, 13, third.run)
    # Each record carries the token, the release too: the next holder reads it there.
    with hold_lease(str(where), {}, "p", 600, "maintenance") as fourth:
        assert fourth.token == 14
