"""The run lock: an flock for local state locations, checked with real processes.

`Runner` drives a separate Python process that takes and gives up the run lock
through `strata.lock.run_lock`, one command per line; the lease tests use it too.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from strata.config import PipelineConfig
from strata.errors import LeaseLost, LockBusy
from strata.lock import FileLock, RunLock, run_lock

ROOT = Path(__file__).resolve().parents[1]


def pipeline_body(warehouse: str, **extra: Any) -> dict[str, Any]:
    """A minimal valid pipeline whose state lives under `warehouse`."""
    return {
        "name": "p_" + uuid.uuid4().hex[:8],
        "topics": ["clicks"],
        "schema_file": "clicks.avsc",
        "schemas_dir": str(ROOT / "schemas"),
        "event_time": {"field": "ts"},
        "warehouse": warehouse,
        **extra,
    }


def runner_main() -> None:
    """The runner process: reads commands from stdin, answers one JSON line each."""
    cfg = PipelineConfig.model_validate(json.loads(sys.argv[1]))
    held = ExitStack()
    lock: RunLock | None = None
    for line in sys.stdin:
        command = line.strip()
        reply: dict[str, Any] = {"pid": os.getpid()}
        if command == "acquire":
            try:
                lock = held.enter_context(run_lock(cfg))
                reply["won"] = True
            except LockBusy as exc:
                reply.update(won=False, busy=str(exc))
        elif command == "check":
            assert lock is not None
            try:
                lock.check()
                reply["ok"] = True
            except LeaseLost as exc:
                reply.update(ok=False, lost=str(exc))
        elif command == "lost_to":
            winner = getattr(lock, "lost_to", None)
            reply["lost_to"] = None if winner is None else winner.pid
        elif command == "release":
            held.close()
            lock = None
            reply["released"] = True
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


class Runner:
    """A runner process; `host` gives it its own host name (a UTS namespace, as root)."""

    def __init__(self, body: dict[str, Any], log: Path, host: str | None = None) -> None:
        command = [
            sys.executable,
            "-c",
            "from tests.test_lock import runner_main; runner_main()",
            json.dumps(body),
        ]
        if host is not None:
            # unshare and sh exec in place, so the pid stays the Python process's.
            command = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host, *command]
        self.log = log
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                cwd=ROOT,
            )
        self.pid = self.proc.pid

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def receive(self, timeout: float = 60) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"runner {self.pid} did not answer: {self.log.read_text()}"
        line = self.proc.stdout.readline()
        assert line, f"runner {self.pid} exited: {self.log.read_text()}"
        return json.loads(line)

    def ask(self, command: str) -> dict[str, Any]:
        self.send(command)
        return self.receive()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        os.kill(self.pid, sig)
        if sig == signal.SIGKILL:
            self.proc.wait(10)

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *_: object) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(10)


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
            with run_lock(cfg):
                pass
        assert "another run is in flight" in str(busy.value)
        assert f'"pid": {holder.pid}' in str(busy.value)
        # An flock cannot be taken from a live holder, so there is nothing to lose.
        assert holder.ask("check")["ok"]
        assert holder.ask("release")["released"]
        with run_lock(cfg) as lock:
            assert isinstance(lock, FileLock) and lock.path == cfg.lock_path
            lock.check()
            assert json.loads(cfg.lock_path.read_text())["pid"] == os.getpid()


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
