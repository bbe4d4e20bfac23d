"""What the local services (broker, metastore, thrift server) share: a child process
on a free loopback port, started, waited for, and always stopped."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import NoReturn, Self


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    """Whether something accepts connections on a loopback port."""
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Supervised:
    """Something started and always stopped: a context manager over `start` and `stop`."""

    def start(self) -> Self:
        """Start it; subclasses implement it."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop it; subclasses implement it."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class LocalService(Supervised):
    """A child process serving on a loopback port; a context manager.

    Subclasses build the command in `start` and call `_spawn` then `_wait`.
    """

    name = "service"
    # Set before `start` to leave the process running after this one exits, in a session
    # of its own (`strata-local up`); whoever records its pid then stops it.
    detached = False

    def __init__(self, port: int | None, log_path: Path) -> None:
        """Choose the port and the log file.

        Args:
            port: Port to listen on; a free one if None.
            log_path: Where the process's output goes.
        """
        self.port = port or free_port()
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The process's id while it is started here, else None."""
        return None if self._proc is None else self._proc.pid

    def _spawn(
        self,
        command: list[str],
        *,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        detach: bool = False,
    ) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=cwd,
                env=env or dict(os.environ),
                start_new_session=detach or self.detached,
            )

    def _wait(self, timeout: float) -> None:
        """Wait until the port accepts connections, or fail with the log's tail."""
        deadline = time.monotonic() + timeout
        while not port_open(self.port):
            assert self._proc is not None
            if self._proc.poll() is not None:
                self._fail(f"the {self.name} exited with {self._proc.returncode}")
            if time.monotonic() > deadline:
                self._fail(f"the {self.name} did not listen within {timeout:.0f}s")
            time.sleep(0.1)

    def _fail(self, reason: str) -> NoReturn:
        tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
        self.stop()
        raise RuntimeError(f"{reason}; its log ({self.log_path}) ends with:\n{tail}")

    def stop(self) -> None:
        """Stop the process: politely, then firmly."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
