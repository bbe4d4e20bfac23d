"""A run lease kept in an object store: one run per pipeline at a time, across hosts.

The lease lives under `<state location>/lease/` as immutable epoch objects
(`epoch-000000000001.json`, `epoch-000000000002.json`, ...), each created with
`put_if_absent` (S3's `If-None-Match: *`), so create-if-absent is the only primitive
the store must offer. An epoch records its holder (host, pid and the process's start
time, a run id, when the run took the lease), when it expires (UTC wall-clock epoch
seconds: when it was written plus `lock_lease`), and whether it is a release.

- **Acquire.** Read the newest epoch. The lease is free if there is none, it is a
  release, it has expired, or its holder ran on this machine and that process is gone
  (the pid is compared with its start time, so a reused pid is not taken for the
  holder). Then create the next epoch; whoever creates it holds the lease, and a
  runner that loses that race looks again and finds the winner holding it.
- **Renew.** A daemon thread creates the next epoch every `lock_lease / 4`. If that
  epoch already exists, another run took the lease over: it is lost. Older epochs are
  deleted best-effort; the newest is never deleted, so a runner that creates an epoch
  in the hole left by a deletion sees a higher one when it lists, and knows its claim
  is stale.
- **Check.** `Lease.check()` raises `LeaseLost` if a renewal was lost, or if the last
  successful renewal is older, on the host's boot-time clock, than the holder
  trusts its lease for (`lock_lease` less a quarter, below). A paused process's
  renewal thread is paused too; after SIGCONT the main thread may reach a commit
  before that thread runs, and the clock tells it to stop.
- **Release.** On exit the holder creates a release epoch, so the next run need not
  wait for the expiry. If that fails, the next run waits until the lease expires.
- **Fencing token.** `Lease.token` is fixed when the holder acquires the lease, and
  every epoch it writes records it. It is above the epoch acquired at, above the token
  the newest epoch records (the previous holder's: the newest epoch is never deleted,
  and a claim that filled a hole is refused), and above `floor`, the highest token the
  store of the acts holds (the tables' fences, read by the caller before the claim). So
  a store that records the token of each act can refuse the acts of a holder that was
  taken over, however long it was paused (see `strata.store.lock`); and removing the
  lease's folder costs nothing: the next holder starts above the fences the earlier
  ones left, instead of at 1 below them. Only a holder in flight while the folder is
  removed can be given a token the next one also gets; the stores then let neither
  pass as the other (`strata.store.fencing.Fence`).

**Clock skew.** Expiries are compared across hosts on their wall clocks, so the
lease tolerates hosts' clocks disagreeing by up to a quarter of `lock_lease` (30 s
with the default 2 minutes). A live holder renews every quarter lease, so its newest
epoch has about three quarters of the lease left at any time; and a holder that stops
renewing (paused, cut off from the store) stops trusting its lease a quarter lease
before the expiry it wrote, which is when a runner whose clock runs up to that much
ahead can take it over. A runner whose clock lags only waits longer. Keep clocks in sync (NTP)
and `lock_lease` well above the store's worst request time.

**The store** must honour `If-None-Match: *` on PUT, as AWS S3 does and as delta-rs's
commits with `conditional_put=etag` already require; a store that ignores it would
let two runs hold the lease.

**The store unavailable.** Acquiring fails with `LeaseUnavailable` and nothing is
done. A holder whose renewals fail keeps retrying, and its `check()` raises
`LeaseLost` once it has gone without a renewal for three quarters of the lease.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from strata.errors import LeaseLost, LeaseUnavailable, LockBusy
from strata.log import get_logger
from strata.store.fencing import Fence
from strata.store.files import delete_object, list_names, put_if_absent, read_object

__all__ = ["Epoch", "Lease", "LeaseLost", "LeaseUnavailable", "LockBusy", "hold_lease"]

logger = get_logger(__name__)

_EPOCH_NAME = re.compile(r"^epoch-(\d{12})\.json$")
# Renewals per lease; the holder also gives up this share of the lease early, which is
# the clock skew between hosts the lease tolerates.
_QUARTERS = 4
# Attempts at reading the newest epoch or winning the next, before giving up as busy.
_ATTEMPTS = 5


@dataclass(frozen=True)
class Epoch:
    """One immutable record of the lease.

    Attributes:
        number: The epoch's sequence number; the highest one is the lease's state.
        pipeline: Pipeline name.
        run: Id of the run holding the lease (unique per acquisition).
        host: Host name of the holder.
        pid: Process id of the holder.
        pid_start: The holder's start time in clock ticks since boot, or None off Linux.
        boot_id: The holder machine's boot id, or None off Linux.
        pid_ns: The holder's pid namespace, or None off Linux.
        since: When the run took the lease (UTC, ISO 8601).
        expires: When this epoch expires (UTC wall-clock epoch seconds).
        release: True if the holder gave the lease up with this epoch.
        token: The holder's fencing token; None in a record written before tokens
            were recorded, whose token was the epoch its holder acquired at.
    """

    number: int
    pipeline: str
    run: str
    host: str
    pid: int
    pid_start: int | None
    boot_id: str | None
    pid_ns: str | None
    since: str
    expires: float
    release: bool = False
    token: int | None = None

    def to_bytes(self) -> bytes:
        """The record as stored, with the expiry also written for people to read."""
        body = asdict(self)
        body["expires_at"] = _iso(self.expires)
        return json.dumps(body, sort_keys=True, indent=1).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Epoch:
        """Read a stored record.

        Args:
            data: The stored bytes.
            where: The object's location, for the message.

        Raises:
            LeaseUnavailable: If the object is not a lease record.
        """
        try:
            body = json.loads(data)
            return cls(
                number=int(body["number"]),
                pipeline=str(body["pipeline"]),
                run=str(body["run"]),
                host=str(body["host"]),
                pid=int(body["pid"]),
                pid_start=body.get("pid_start"),
                boot_id=body.get("boot_id"),
                pid_ns=body.get("pid_ns"),
                since=str(body["since"]),
                expires=float(body["expires"]),
                release=bool(body.get("release", False)),
                token=None if body.get("token") is None else int(body["token"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise LeaseUnavailable(
                f"{where} is not a run-lease record ({exc}); nothing was done. If no run of "
                "the pipeline is in flight, delete that object and run again."
            ) from exc

    def held_token(self) -> int:
        """The token its holder held: recorded, or (in an older record) at most its epoch."""
        return self.number if self.token is None else self.token

    def holder(self) -> str:
        """Who holds (or held) the lease, in the form the local lock file uses."""
        return json.dumps(
            {"host": self.host, "pid": self.pid, "run": self.run, "since": self.since}
        )


@dataclass(frozen=True)
class _Process:
    """This process, as an epoch records it."""

    host: str
    pid: int
    start: int | None
    boot_id: str | None
    pid_ns: str | None

    @classmethod
    def current(cls) -> _Process:
        boot_id = None
        pid_ns = None
        try:
            boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
            pid_ns = os.readlink("/proc/self/ns/pid")
        except OSError:
            pass
        stat = _proc_stat(os.getpid())
        return cls(
            host=socket.gethostname(),
            pid=os.getpid(),
            start=None if stat is None else stat[1],
            boot_id=boot_id,
            pid_ns=pid_ns,
        )

    def sees_gone(self, epoch: Epoch) -> bool:
        """True if the epoch's holder ran where this process can see it, and is gone."""
        # Only a holder on this machine, and in this pid namespace, can be looked up: two
        # containers may share a host name, and a pid means nothing across namespaces.
        if (epoch.host, epoch.boot_id, epoch.pid_ns) != (self.host, self.boot_id, self.pid_ns):
            return False
        if self.boot_id is not None:
            stat = _proc_stat(epoch.pid)
            # A zombie is dead but not yet reaped by its parent.
            return stat is None or stat[0] in ("Z", "X") or stat[1] != epoch.pid_start
        try:
            os.kill(epoch.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """A process's state letter and start time (clock ticks since boot), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or parentheses.
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[19])


def _elapsed_clock() -> float:
    """Seconds on a clock that keeps counting while the host is suspended.

    The monotonic clock stops during a suspend or hibernation: a host woken after
    longer than the lease would still trust it. The boot-time clock does not stop.
    """
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


class Lease:
    """A pipeline's run lease in a store folder; see the module docstring for the protocol."""

    def __init__(
        self,
        location: str,
        options: dict[str, str],
        pipeline: str,
        lease_s: float,
        what: str = "run",
        floor: Callable[[], int] | None = None,
    ) -> None:
        """Describe the lease; nothing is read or written until `acquire`.

        Args:
            location: The lease folder, `<state location>/lease`.
            options: The pipeline's `storage_options`.
            pipeline: Pipeline name, for records and messages.
            lease_s: `lock_lease` in seconds.
            what: What holds the lease (`run`, `maintenance`), for messages.
            floor: Reads the highest fencing token the stores of the holder's acts hold
                (the tables' fences); the token is taken above it. Called once, when the
                lease is found free.
        """
        self._what = what
        self._floor = floor
        self.location = location.rstrip("/")
        self._options = options
        self._pipeline = pipeline
        self._lease_s = lease_s
        self._trust_s = lease_s * (_QUARTERS - 1) / _QUARTERS
        self._me = _Process.current()
        self.run = uuid.uuid4().hex[:12]
        self._since = ""
        self._guard = threading.Lock()
        self._epoch = 0
        self._fence: Fence | None = None
        self._renewed = 0.0
        self._lost = False
        self._lost_to: Epoch | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def token(self) -> int | None:
        """The fencing token (see the module docstring); None before the lease is taken."""
        with self._guard:
            return None if self._fence is None else self._fence.token

    @property
    def fence(self) -> Fence | None:
        """The fencing token with this run's id; None before the lease is taken."""
        with self._guard:
            return self._fence

    @property
    def lost_to(self) -> Epoch | None:
        """The epoch of the run that took this lease over, once a renewal found it."""
        with self._guard:
            return self._lost_to

    def acquire(self) -> None:
        """Take the lease and start renewing it, or fail at once if another run holds it.

        Raises:
            LockBusy: Naming the holder and when its lease expires.
            LeaseUnavailable: If the store could not be read or written.
        """
        self._since = datetime.now(UTC).isoformat(timespec="seconds")
        newest: Epoch | None = None
        floor: int | None = None
        try:
            for _ in range(_ATTEMPTS):
                newest = self._newest()
                if newest is not None and not self._free(newest):
                    raise self._busy(newest)
                if floor is None and self._floor is not None:
                    # Read once the lease is free: a holder's fences are what it leaves.
                    floor = self._floor()
                number = 1 if newest is None else newest.number + 1
                held = 0 if newest is None else newest.held_token()
                fence = Fence(max(number, held + 1, (floor or 0) + 1), self.run, floor)
                if self._claim(number, release=False, fence=fence):
                    break
                # Lost the race: look again, and find the winner holding it.
            else:
                raise self._busy(self._newest() or newest)
        except OSError as exc:
            raise LeaseUnavailable(
                f"pipeline {self._pipeline}: could not take the run lease at {self.location}: "
                f"{exc}; nothing was done. Check that the store is reachable, then run again."
            ) from exc
        self._thread = threading.Thread(
            target=self._renew_until_stopped, name=f"strata-lease-{self._pipeline}", daemon=True
        )
        self._thread.start()

    def check(self) -> None:
        """Make sure this run still holds the lease; call it before each commit.

        Raises:
            LeaseLost: If another run took the lease over, or this run has gone too long
                without renewing it to be sure nobody did.
        """
        with self._guard:
            lost, lost_to, renewed = self._lost, self._lost_to, self._renewed
        if self._what == "run":
            taken = "the holder finishes the batch"
            unsure = "the holder, or the next run, finishes the batch"
        else:
            taken = unsure = f"the next {self._what} run does what this one left"
        if lost:
            holder = lost_to.holder() if lost_to is not None else "another run"
            raise LeaseLost(
                f"pipeline {self._pipeline}: this run lost its lease to {holder}; it was "
                f"paused or cut off from the store longer than lock_lease "
                f"({self._lease_s:g} s). Nothing more was committed by it; {taken}."
            )
        quiet = _elapsed_clock() - renewed
        if quiet > self._trust_s:
            raise LeaseLost(
                f"pipeline {self._pipeline}: this run lost its lease: it has not renewed it "
                f"for {quiet:.0f} s, and trusts it for {self._trust_s:g} s of lock_lease "
                f"({self._lease_s:g} s, less a quarter for clock skew); it was paused or cut "
                f"off from the store, and another run may hold it now (see {self.location}). "
                f"Nothing more was committed by it; {unsure}."
            )

    def release(self) -> None:
        """Stop renewing and give the lease up, so the next run need not wait (best-effort)."""
        self._stop.set()
        if self._thread is not None:
            # A renewal in flight finishes in a moment on a healthy store; on a sick one
            # the release below fails too, and the next run waits for the expiry.
            self._thread.join(timeout=min(self._lease_s, 10.0))
        with self._guard:
            if self._lost or self._epoch == 0:
                return
            number = self._epoch + 1
        try:
            if not self._claim(number, release=True):
                logger.warning(
                    "pipeline %s: the lease was taken over before this run released it",
                    self._pipeline,
                )
        except (OSError, LeaseUnavailable) as exc:
            logger.warning(
                "pipeline %s: could not release the run lease (%s); the next run waits "
                "until it expires, at most %g s",
                self._pipeline,
                exc,
                self._lease_s,
            )

    def _renew_until_stopped(self) -> None:
        while not self._stop.wait(self._lease_s / _QUARTERS):
            with self._guard:
                number = self._epoch + 1
            try:
                if self._claim(number, release=False):
                    continue
                winner = self._newest()
            except (OSError, LeaseUnavailable) as exc:
                # The store may come back; check() stops the run if it stays away.
                logger.warning(
                    "pipeline %s: could not renew the run lease (%s); retrying",
                    self._pipeline,
                    exc,
                )
                continue
            with self._guard:
                self._lost = True
                self._lost_to = winner
            logger.warning(
                "pipeline %s: this run lost its lease to %s",
                self._pipeline,
                winner.holder() if winner is not None else "another run",
            )
            return

    def _claim(self, number: int, *, release: bool, fence: Fence | None = None) -> bool:
        """Create epoch `number`; True if this run now holds (or released) the lease.

        Args:
            number: The epoch.
            release: Whether it gives the lease up.
            fence: The fence an acquisition takes; renewals and the release keep the
                one held.
        """
        wall, mono = time.time(), _elapsed_clock()
        with self._guard:
            fence = fence or self._fence
        record = Epoch(
            number=number,
            pipeline=self._pipeline,
            run=self.run,
            host=self._me.host,
            pid=self._me.pid,
            pid_start=self._me.start,
            boot_id=self._me.boot_id,
            pid_ns=self._me.pid_ns,
            since=self._since,
            expires=wall + self._lease_s,
            release=release,
            token=None if fence is None else fence.token,
        )
        if not put_if_absent(self._uri(number), self._options, record.to_bytes()):
            # A PUT retried after its first attempt landed finds this run's own record.
            existing = self._read(number)
            if existing is None or existing.run != self.run:
                return False
        if release:
            return True
        numbers = self._numbers()
        if any(n > number for n in numbers):
            # The epoch filled a hole left by a deletion: another run went on from there.
            return False
        with self._guard:
            self._epoch = number
            self._renewed = mono
            self._fence = fence
        for old in (n for n in numbers if n < number):
            try:
                delete_object(self._uri(old), self._options)
            except OSError as exc:
                logger.debug("could not delete an old lease epoch: %s", exc)
                break
        return True

    def _free(self, newest: Epoch) -> bool:
        return newest.release or time.time() >= newest.expires or self._me.sees_gone(newest)

    def _busy(self, holder: Epoch | None) -> LockBusy:
        if holder is None:
            return LockBusy(
                f"pipeline {self._pipeline}: another {self._what} is in flight and keeps "
                f"renewing its lease at {self.location}; nothing was done. Wait for it to "
                "finish."
            )
        left = max(0.0, holder.expires - time.time())
        return LockBusy(
            f"pipeline {self._pipeline}: another {self._what} is in flight "
            f"({holder.holder()}); its lease at {self.location} runs until "
            f"{_iso(holder.expires)} ({left:.0f} s from now) and is renewed while it runs; "
            "nothing was done. Wait for it to finish; if that run is gone (its host died "
            "or lost the network), the first run after that time takes over."
        )

    def _uri(self, number: int) -> str:
        return f"{self.location}/epoch-{number:012d}.json"

    def _numbers(self) -> list[int]:
        names = list_names(self.location, self._options)
        return sorted(int(m.group(1)) for m in map(_EPOCH_NAME.match, names) if m)

    def _read(self, number: int) -> Epoch | None:
        data = read_object(self._uri(number), self._options)
        return None if data is None else Epoch.from_bytes(data, self._uri(number))

    def _newest(self) -> Epoch | None:
        for _ in range(_ATTEMPTS):
            numbers = self._numbers()
            if not numbers:
                return None
            newest = self._read(numbers[-1])
            if newest is not None:
                return newest
            # Deleted between the listing and the read: a newer epoch exists; list again.
        raise LeaseUnavailable(
            f"pipeline {self._pipeline}: the run lease at {self.location} changed on every "
            "read; another run is renewing it very fast. Nothing was done; run again."
        )


@contextmanager
def hold_lease(
    location: str,
    options: dict[str, str],
    pipeline: str,
    lease_s: float,
    what: str = "run",
    floor: Callable[[], int] | None = None,
) -> Iterator[Lease]:
    """Hold a pipeline's run lease for the duration of the block, then release it.

    Args:
        location: The lease folder, `<state location>/lease`.
        options: The pipeline's `storage_options`.
        pipeline: Pipeline name.
        lease_s: `lock_lease` in seconds.
        what: What holds the lease (`run`, `maintenance`), for messages.
        floor: Reads the highest fencing token the stores of the holder's acts hold;
            the token is taken above it.

    Yields:
        The held lease; call its `check()` before each commit.

    Raises:
        LockBusy: Naming the holder and when its lease expires.
        LeaseUnavailable: If the store could not be read or written.
    """
    lease = Lease(location, options, pipeline, lease_s, what, floor)
    lease.acquire()
    try:
        yield lease
    finally:
        lease.release()
