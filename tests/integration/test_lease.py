"""The run lease on an object store, and the create-if-absent write it stands on.

Runners are real processes taking the lease through `strata.store.lock.run_lock` against a
real S3 endpoint (moto_server); they are killed, paused and cut off with signals. A
runner "on another host" is a process with its own host name, in its own UTS
namespace (`unshare --uts`, as root).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from strata.config import PipelineConfig
from strata.errors import LockBusy
from strata.maintenance._fences import held_fence
from strata.maintenance.compact import MAINTAINED
from strata.maintenance.vacuum import vacuum
from strata.store.files import delete_object, list_names, read_object
from strata.store.lease import Epoch
from strata.store.lock import run_lock
from tests.conftest import expected_offsets, s3_landed
from tests.locking import (
    Runner,
    check_put_if_absent,
    check_racing_creates,
    pipeline_body,
    s3_options,
)
from tests.maintenance_runs import FORMATS, leased_pipeline, small_batches

OTHER_HOST = "strata-other-host"


def s3_body(url: str, lease: str) -> dict[str, Any]:
    return pipeline_body(
        f"s3://lake/lease-{uuid.uuid4().hex[:8]}", storage_options=s3_options(url), lock_lease=lease
    )


def lease_location(body: dict[str, Any]) -> str:
    return f"{PipelineConfig.model_validate(body).location('state')}/lease"


def epochs(body: dict[str, Any]) -> list[Epoch]:
    """Every epoch object of the pipeline's lease, oldest first."""
    where = lease_location(body)
    options = body.get("storage_options", {})
    found = []
    for name in list_names(where, options):
        data = read_object(f"{where}/{name}", options)
        if data is not None:
            found.append(Epoch.from_bytes(data, name))
    return found


def test_put_if_absent_creates_once_and_never_replaces(s3_endpoint):
    check_put_if_absent(f"s3://lake/put-{uuid.uuid4().hex[:8]}", s3_options(s3_endpoint))


def test_two_processes_racing_to_create_the_same_names_never_both_win(s3_endpoint):
    check_racing_creates(f"s3://lake/put-{uuid.uuid4().hex[:8]}", s3_options(s3_endpoint))


def test_two_runners_racing_for_the_lease_exactly_one_wins_every_round(s3_endpoint, tmp_path):
    # A long lease, so only a release frees it between rounds.
    body = s3_body(s3_endpoint, "60s")
    with Runner(body, tmp_path / "a.log") as a, Runner(body, tmp_path / "b.log") as b:
        for _ in range(6):
            a.send("acquire")
            b.send("acquire")
            replies = {a.pid: a.receive(), b.pid: b.receive()}
            winners = [pid for pid, reply in replies.items() if reply["won"]]
            assert len(winners) == 1, replies
            (loser,) = set(replies) - set(winners)
            assert "another run is in flight" in replies[loser]["busy"]
            assert f'"pid": {winners[0]}' in replies[loser]["busy"]
            newest = epochs(body)[-1]
            assert (newest.pid, newest.release) == (winners[0], False)
            winner = a if winners[0] == a.pid else b
            assert winner.ask("release")["released"]
            newest = epochs(body)[-1]
            assert (newest.pid, newest.release) == (winners[0], True)


def test_a_holder_killed_on_this_host_is_taken_over_at_once(s3_endpoint, tmp_path):
    body = s3_body(s3_endpoint, "60s")
    with Runner(body, tmp_path / "a.log") as a, Runner(body, tmp_path / "b.log") as b:
        assert a.ask("acquire")["won"]
        refused = b.ask("acquire")
        assert not refused["won"] and f'"pid": {a.pid}' in refused["busy"]
        a.kill()
        held = epochs(body)[-1]
        assert held.pid == a.pid
        assert b.ask("acquire")["won"]
        # Taken because its holder is gone, long before the lease would have expired.
        assert time.time() < held.expires
        newest = epochs(body)[-1]
        assert (newest.number, newest.pid) == (held.number + 1, b.pid)


def test_a_holder_killed_on_another_host_holds_the_lease_until_it_expires(s3_endpoint, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("a UTS namespace of its own (unshare --uts) needs root")
    body = s3_body(s3_endpoint, "4s")
    cfg = PipelineConfig.model_validate(body)
    with Runner(body, tmp_path / "other.log", host=OTHER_HOST) as other:
        assert other.ask("acquire")["won"]
        other.kill()
    # The last epoch it wrote, whether or not it renewed before it died.
    held = epochs(body)[-1]
    assert held.host == OTHER_HOST and held.pid == other.pid
    refusals = 0
    deadline = time.monotonic() + 60
    while True:
        try:
            with run_lock(cfg.places()) as lock:
                lock.check()
                taken_at = time.time()
                taker = epochs(body)[-1]
            break
        except LockBusy as exc:
            # This host cannot see that process, so only the expiry frees the lease.
            assert OTHER_HOST in str(exc) and "runs until" in str(exc)
            refusals += 1
        assert time.monotonic() < deadline, "the dead holder's lease was never taken over"
        time.sleep(0.2)
    assert refusals > 0
    assert taken_at >= held.expires
    assert taker.pid == os.getpid() and taker.host == socket.gethostname()


def test_renewals_keep_the_lease_past_its_first_expiry(s3_endpoint, tmp_path):
    body = s3_body(s3_endpoint, "2s")
    cfg = PipelineConfig.model_validate(body)
    with Runner(body, tmp_path / "a.log") as a:
        assert a.ask("acquire")["won"]
        first = epochs(body)[-1]
        while time.time() < first.expires + 2:
            with pytest.raises(LockBusy, match=f'"pid": {a.pid}'):
                with run_lock(cfg.places()):
                    pass
            time.sleep(0.3)
        assert a.ask("check")["ok"]
        kept = epochs(body)
        assert kept[-1].number > first.number and kept[-1].pid == a.pid
        # Old epochs are deleted as the lease is renewed.
        assert len(kept) <= 2


def test_a_paused_holder_loses_its_lease_and_learns_it_when_it_wakes(s3_endpoint, tmp_path):
    body = s3_body(s3_endpoint, "3s")
    with Runner(body, tmp_path / "a.log") as a, Runner(body, tmp_path / "b.log") as b:
        assert a.ask("acquire")["won"]
        paused_token = a.ask("token")["token"]
        a.kill(signal.SIGSTOP)
        deadline = time.monotonic() + 60
        while not (reply := b.ask("acquire"))["won"]:
            # A stopped process is alive: only its lease running out frees it.
            assert f'"pid": {a.pid}' in reply["busy"]
            assert time.monotonic() < deadline, "the paused holder's lease never expired"
            time.sleep(0.2)
        taken = epochs(body)[-1]
        assert taken.pid == b.pid
        # The taker's fencing token is the epoch it took the lease at (renewals since
        # may have gone past it), above the paused holder's.
        assert 1 <= paused_token < b.ask("token")["token"] <= taken.number
        # Let the new holder renew a few times: it deletes the epochs behind it, so the
        # woken holder's next epochs are free names, and creating one proves nothing.
        while epochs(body)[-1].number < taken.number + 3:
            assert time.monotonic() < deadline, "the new holder never renewed"
            time.sleep(0.2)
        a.kill(signal.SIGCONT)
        # From the moment it wakes, it never again believes it holds the lease, and its
        # renewal thread finds the lease taken.
        while True:
            woke = a.ask("check")
            assert not woke["ok"] and "lost its lease" in woke["lost"]
            if a.ask("lost_to")["lost_to"] == b.pid:
                break
            assert time.monotonic() < deadline, "the woken holder's renewal never failed"
            time.sleep(0.05)
        assert f'"pid": {b.pid}' in a.ask("check")["lost"]
        # Giving up a lost lease writes nothing: the new holder keeps it.
        assert a.ask("release")["released"]
        newest = epochs(body)[-1]
        assert (newest.pid, newest.release) == (b.pid, False)
        assert b.ask("check")["ok"]


def test_a_holder_cut_off_from_the_store_stops_trusting_its_lease(tmp_path):
    from strata.local.service import free_port
    from tests.conftest import s3_client

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (tmp_path / "moto.log").open("w") as log:
        moto = subprocess.Popen(
            [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                s3_client(url).create_bucket(Bucket="lake")
                break
            except Exception:
                assert moto.poll() is None and time.monotonic() < deadline, "moto did not start"
                time.sleep(0.2)
        body = s3_body(url, "3s")
        with Runner(body, tmp_path / "a.log") as a:
            assert a.ask("acquire")["won"]
            assert a.ask("check")["ok"]
            moto.kill()
            moto.wait()
            deadline = time.monotonic() + 30
            while (reply := a.ask("check"))["ok"]:
                assert time.monotonic() < deadline, "the cut-off holder kept trusting its lease"
                time.sleep(0.2)
            assert "has not renewed it" in reply["lost"]
            # Nobody took it over: the holder only knows it can no longer be sure.
            assert a.ask("lost_to")["lost_to"] is None
    finally:
        moto.kill()
        moto.wait()


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_maintenance_leases_folder_removed_the_next_compaction_and_vacuum_go_on(
    fmt, make_pipeline, broker, spark, metastore, s3_endpoint, tmp_path
):
    # Five maintenance runs fence the tables (tokens up to about 10); then the lease's
    # folder is removed by hand, and its epochs would start again at 1, below them.
    p = leased_pipeline(fmt, make_pipeline, metastore, s3_endpoint, tmp_path, lock_lease="60s")
    per = small_batches(p, broker, spark, 2)
    cfg = p.cfg()
    assert cfg.lock_path is None  # runs hold leases in the store
    for _ in range(5):
        vacuum(cfg.places(), cfg.maintenance.vacuum_retention, cfg.metastore)
    built = held_fence(cfg.places(), MAINTAINED)
    assert built >= 9
    folder, options = f"{cfg.location('state')}/maintenance-lease", cfg.storage_options
    for name in list_names(folder, options):
        delete_object(f"{folder}/{name}", options)
    assert list_names(folder, options) == []

    merged = p.cli("compact", "--older-than", "0s", "--json")
    assert merged.returncode == 0, merged.stderr
    outcomes = [e["outcome"] for e in json.loads(merged.stdout.splitlines()[-1])["partitions"]]
    assert outcomes and set(outcomes) == {"compacted"}
    vacuumed = p.cli("vacuum")
    assert vacuumed.returncode == 0, vacuumed.stderr
    # The tokens went on above the fences the earlier runs left, and the vacuum's fence
    # is its own, above them all.
    assert held_fence(cfg.places(), MAINTAINED) > built
    names = sorted(list_names(folder, options))
    newest = Epoch.from_bytes(read_object(f"{folder}/{names[-1]}", options) or b"", names[-1])
    assert newest.release and newest.token == held_fence(cfg.places(), MAINTAINED)
    landed = s3_landed(p, options) if fmt == "delta" else p.landed()
    assert landed == expected_offsets(per)
