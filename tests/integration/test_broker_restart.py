"""A broker crash and restart in the middle of a batch: each message lands once, or the
run stops cleanly and the next run lands each once.

The module's own Apache Kafka is killed (SIGKILL, no controlled shutdown) and started
again on its log directory and port (`LocalKafka.unreachable()`): every connection
drops, connects are refused, then the restarted broker recovers its log and answers on
the same port with every acknowledged message. A task is frozen at the `mid_read` fault
point, with part of its ranges read and the rest still on the broker, so the outage
always falls in the middle of its read. The session's broker, which every other test
reads, is never killed.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from deltalake import DeltaTable

from strata import faults
from strata.batch.plan import PlanStore
from strata.local.kafka import LocalKafka
from strata.run import run_batch
from strata.store.ledger import read_ledger
from tests.conftest import ROOT, START_MS, expected_offsets, produce_clicks
from tests.faults import armed

# Small fetches and a small prefetch queue: when the task freezes, most of its range
# is still on the broker, as with production ranges far larger than librdkafka's queue.
SMALL_FETCHES = {
    "fetch.max.bytes": 16_384,
    "max.partition.fetch.bytes": 8_192,
    "message.max.bytes": 8_192,
    "queued.max.messages.kbytes": 16,
    "queued.min.messages": 20,
}
OUTAGE_S = 3.0


@pytest.fixture(scope="module")
def restartable_broker(tmp_path_factory):
    """A Kafka of the module's own, killed and restarted by its tests."""
    with LocalKafka(tmp_path_factory.mktemp("restarted")) as b:
        yield b


def _pipeline(make_pipeline, broker: LocalKafka, master: str = "local[2,4]", **limits: float):
    p = make_pipeline(
        partitions=2,
        create=False,
        overrides={
            "kafka": {"bootstrap_servers": broker.bootstrap, "properties": SMALL_FETCHES},
            "limits": limits,
            "spark": {"master": master},
        },
    )
    broker.create_topic(p.topic, 2)
    total = {0: 0, 1: 0}
    # Several rounds, so each partition holds many record batches, fetched one by one;
    # and enough of them that a task's first read (up to half a second of fetching)
    # never takes its whole range before the task freezes, however fast the machine.
    for round_ in range(6):
        new = produce_clicks(broker, p.topic, 2, 1000, seed=round_, start_ms=START_MS, hours=1)
        total = {q: total[q] + new[q] for q in total}
    return p, total


class FrozenRun:
    """`strata run` as a process, whose first task to read messages freezes there.

    Its output goes to files, not pipes: while the test waits on it, librdkafka's
    refusals and Spark's task tracebacks would fill a pipe and block the run.
    """

    def __init__(self, p, workdir: Path) -> None:
        self.out, self.err = workdir / "run.out", workdir / "run.err"
        env = p.env(**armed(stop_at=faults.MID_READ, once=workdir / "frozen"))
        # The run and its Spark workers import Strata as a script outside the checkout
        # does: from wherever the environment installed it, which must be this checkout
        # (a copy beside it, run with this one's virtualenv, would test this one's code).
        imported = subprocess.run(
            [sys.executable, "-c", "import strata; print(strata.__file__)"],
            env=env,
            cwd=Path(sys.executable).parent,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert Path(imported).resolve().parent == ROOT / "strata", imported
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen(
                [str(Path(sys.executable).parent / "strata"), "run", "--pipeline", p.name]
                + ["--conf-dir", str(p.conf_dir)],
                stdout=out,
                stderr=err,
                env=env,
            )

    def frozen(self) -> list[psutil.Process]:
        """The run's processes stopped at the fault point."""
        found = []
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                if child.status() == psutil.STATUS_STOPPED:
                    found.append(child)
            except psutil.NoSuchProcess:
                pass
        return found

    def wait_frozen(self, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not self.frozen():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"no task froze at mid_read:\n{self.stderr()[-3000:]}")
            time.sleep(0.1)

    def thaw_for(self, seconds: float) -> None:
        """Resume every frozen task, again and again, for this long or until the run ends.

        Again: should more than one task stop at the fault point, none stays stopped.
        """
        deadline = time.monotonic() + seconds
        while self.proc.poll() is None and time.monotonic() < deadline:
            for task in self.frozen():
                task.send_signal(signal.SIGCONT)
            time.sleep(0.1)

    def finish(self, timeout: float = 300) -> int:
        """Thaw until the run ends; its exit code."""
        self.thaw_for(timeout)
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait()

    def stderr(self) -> str:
        return self.err.read_text()


def _assert_each_message_once(p, total: dict[int, int]) -> None:
    assert p.landed() == expected_offsets(total)
    assert p.raw_copies() == expected_offsets(total)
    ledger = read_ledger(p.cfg().places()).to_pylist()
    assert sorted(
        (r["batch"], r["partition"], r["start_offset"], r["end_offset"]) for r in ledger
    ) == [(1, q, 0, total[q]) for q in (0, 1)]
    assert all(r["rows"] + r["quarantined"] + r["gaps"] == r["end_offset"] for r in ledger)


def test_a_broker_restart_mid_read_is_retried_and_lands_each_message_once(
    make_pipeline, restartable_broker, tmp_path
):
    broker = restartable_broker
    # One attempt per task (`local[2]`): an attempt that failed at the outage, retried
    # by Spark once the broker is back, would land every message too, and say it read
    # on; here it fails the run. The task waits out the crash and the restart, which
    # recovers the log (seconds more on a busy machine): it gives up after a minute.
    p, total = _pipeline(make_pipeline, broker, master="local[2]", read_stall_s=60)
    run = FrozenRun(p, tmp_path)
    run.wait_frozen()

    with broker.unreachable():
        # The task reads on, against a broker that refuses it, for the whole outage.
        run.thaw_for(OUTAGE_S)
    code, err = run.finish(), run.stderr()

    assert code == 0, err[-3000:]
    # A task met the outage mid-read, waited it out (its client reconnecting with
    # backoff) and read on, in the same attempt.
    waits = re.findall(
        rf"strata: batch 1: reading on after ([\d.]+)s without progress, while the broker "
        rf"at {re.escape(broker.bootstrap)} could not be reached \(",
        err,
    )
    assert waits and max(map(float, waits)) >= OUTAGE_S / 2, err[-3000:]
    _assert_each_message_once(p, total)


def test_a_broker_down_longer_than_every_attempt_stops_the_run_cleanly_and_a_rerun_lands_once(
    make_pipeline, restartable_broker, tmp_path, spark
):
    broker = restartable_broker
    # Each attempt gives up after 1s without progress; local[2,4] makes 4 attempts.
    p, total = _pipeline(make_pipeline, broker, read_stall_s=1)
    run = FrozenRun(p, tmp_path)
    run.wait_frozen()

    with broker.unreachable():
        code, err = run.finish(), run.stderr()

    assert code == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"strata: error: no progress for 1s: partition [01] of `{p.topic}` at offset \d+ of "
        rf"\[0, \d+\); the broker at {re.escape(broker.bootstrap)} cannot be reached \(.*\)\. "
        r"Nothing of the batch is committed, and the next run reads the same offsets",
        last,
    ), last
    # Nothing committed: no table was even created; the plan waits for the next run.
    cfg = p.cfg()
    assert not any(
        DeltaTable.is_deltatable(cfg.location(t)) for t in ("table", "raw", "quarantine", "ledger")
    )
    assert PlanStore(cfg.places()).load(1) is not None

    rerun = run_batch(cfg, session=lambda _: spark)
    assert (rerun.status, rerun.batch) == ("resumed", 1)
    _assert_each_message_once(p, total)
