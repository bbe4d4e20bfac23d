"""The run lease on an object store, and the create-if-absent write it stands on.

Runners are real processes taking the lease through `strata.lock.run_lock` against a
real S3 endpoint (moto_server); they are killed, paused and cut off with signals. A
runner "on another host" is a process with its own host name, in its own UTS
namespace (`unshare --uts`, as root).
"""

from __future__ import annotations

import dataclasses
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
from strata.lease import Epoch, Lease, hold_lease
from strata.lock import run_lock
from strata.storage import list_names, put_if_absent, read_object
from tests.test_lock import ROOT, Runner, pipeline_body

OTHER_HOST = "strata-other-host"


def s3_options(url: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": url,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }


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


def folder(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, dict]:
    """A fresh folder, locally or on the S3 endpoint, and its storage options."""
    if kind == "local":
        return str(tmp_path / "objects"), {}
    url = request.getfixturevalue("s3_endpoint")
    return f"s3://lake/put-{uuid.uuid4().hex[:8]}", s3_options(url)


WHERE = [
    pytest.param("local", id="local"),
    pytest.param("s3", id="s3", marks=pytest.mark.integration),
]


@pytest.mark.parametrize("kind", WHERE)
def test_put_if_absent_creates_once_and_never_replaces(kind, tmp_path, request):
    base, options = folder(kind, tmp_path, request)
    name = f"{base}/plans/batch-1.json"
    assert read_object(name, options) is None
    assert put_if_absent(name, options, b'{"first": true}') is True
    assert put_if_absent(name, options, b'{"second": true}') is False
    assert read_object(name, options) == b'{"first": true}'
    # No temporary file is left beside it.
    assert list_names(f"{base}/plans", options) == ["batch-1.json"]
    if kind == "local":
        assert sorted(os.listdir(f"{base}/plans")) == ["batch-1.json"]


def put_racer() -> None:
    """A process that creates `base/name-<i>` for every i once told to go; prints its wins."""
    base, options, tag, count = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
    sys.stdin.readline()
    wins = [put_if_absent(f"{base}/name-{i}", options, tag.encode()) for i in range(int(count))]
    sys.stdout.write(json.dumps(wins) + "\n")


@pytest.mark.parametrize("kind", WHERE)
def test_two_processes_racing_to_create_the_same_names_never_both_win(kind, tmp_path, request):
    base, options = folder(kind, tmp_path, request)
    count = 40
    racers = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from tests.test_lease import put_racer; put_racer()",
                base,
                json.dumps(options),
                tag,
                str(count),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for tag in ("a", "b")
    ]
    # Both are started and waiting before either begins, so their creates overlap.
    for racer in racers:
        assert racer.stdin is not None
        racer.stdin.write("go\n")
        racer.stdin.flush()
    results = [json.loads(racer.communicate(timeout=120)[0]) for racer in racers]
    for i in range(count):
        winners = [tag for tag, wins in zip("ab", results, strict=True) if wins[i]]
        assert len(winners) == 1, (i, results)
        assert read_object(f"{base}/name-{i}", options) == winners[0].encode()


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


@pytest.mark.integration
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


@pytest.mark.integration
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


@pytest.mark.integration
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
            with run_lock(cfg) as lock:
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


@pytest.mark.integration
def test_renewals_keep_the_lease_past_its_first_expiry(s3_endpoint, tmp_path):
    body = s3_body(s3_endpoint, "2s")
    cfg = PipelineConfig.model_validate(body)
    with Runner(body, tmp_path / "a.log") as a:
        assert a.ask("acquire")["won"]
        first = epochs(body)[-1]
        while time.time() < first.expires + 2:
            with pytest.raises(LockBusy, match=f'"pid": {a.pid}'):
                with run_lock(cfg):
                    pass
            time.sleep(0.3)
        assert a.ask("check")["ok"]
        kept = epochs(body)
        assert kept[-1].number > first.number and kept[-1].pid == a.pid
        # Old epochs are deleted as the lease is renewed.
        assert len(kept) <= 2


@pytest.mark.integration
def test_a_paused_holder_loses_its_lease_and_learns_it_when_it_wakes(s3_endpoint, tmp_path):
    body = s3_body(s3_endpoint, "3s")
    with Runner(body, tmp_path / "a.log") as a, Runner(body, tmp_path / "b.log") as b:
        assert a.ask("acquire")["won"]
        a.kill(signal.SIGSTOP)
        deadline = time.monotonic() + 60
        while not (reply := b.ask("acquire"))["won"]:
            # A stopped process is alive: only its lease running out frees it.
            assert f'"pid": {a.pid}' in reply["busy"]
            assert time.monotonic() < deadline, "the paused holder's lease never expired"
            time.sleep(0.2)
        taken = epochs(body)[-1]
        assert taken.pid == b.pid
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


@pytest.mark.integration
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
