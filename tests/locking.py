"""Helpers the lock and lease tests share, in both tiers.

`Runner` drives a separate Python process that takes and gives up the run lock
through `strata.store.lock.run_lock`, one command per line. The create-if-absent checks run
on a local folder (unit tier) and on the S3 endpoint (integration tier).
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

from strata.config import PipelineConfig
from strata.errors import LeaseLost, LockBusy
from strata.store.files import list_names, put_if_absent, read_object
from strata.store.lock import RunLock, run_lock

# Not tests.conftest's: the runner processes import this module and need none of that.
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
                lock = held.enter_context(run_lock(cfg.places()))
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
        elif command == "token":
            reply["token"] = None if lock is None else lock.token
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
            "from tests.locking import runner_main; runner_main()",
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


def s3_options(url: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": url,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }


def check_put_if_absent(base: str, options: dict[str, str]) -> None:
    """Creates once, never replaces, and leaves no temporary object beside it."""
    name = f"{base}/plans/batch-1.json"
    assert read_object(name, options) is None
    assert put_if_absent(name, options, b'{"first": true}') is True
    assert put_if_absent(name, options, b'{"second": true}') is False
    assert read_object(name, options) == b'{"first": true}'
    assert list_names(f"{base}/plans", options) == ["batch-1.json"]


def put_racer() -> None:
    """A process that creates `base/name-<i>` for every i once told to go; prints its wins."""
    base, options, tag, count = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
    sys.stdin.readline()
    wins = [put_if_absent(f"{base}/name-{i}", options, tag.encode()) for i in range(int(count))]
    sys.stdout.write(json.dumps(wins) + "\n")


def check_racing_creates(base: str, options: dict[str, str], count: int = 40) -> None:
    """Two processes create the same names at once: exactly one wins each."""
    racers = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from tests.locking import put_racer; put_racer()",
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
