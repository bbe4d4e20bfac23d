"""Processes the playground started and recorded: recognised, then stopped with what they started.

A recorded process is only ever signalled while its command line is the one recorded
when it started, so a pid the system gave to another process since is never killed.
What it started (an Airflow component's workers and task processes) is found when it
is stopped, each child with its start time, and a child is only signalled while it
is still that process: still running, started at that time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_PROC = Path("/proc")


@dataclass(frozen=True)
class Running:
    """One process as the system lists it.

    Attributes:
        pid: Its id.
        parent: Its parent's id.
        group: Its process group's id.
        started: When it started, in the system's own terms: with the pid, its identity.
    """

    pid: int
    parent: int
    group: int
    started: str


def process_command(pid: int) -> str | None:
    """A live process's command line (arguments joined by spaces), or None if it is gone.

    A zombie (exited, not yet reaped) counts as gone: its command line is empty.
    """
    if _PROC.joinpath("self", "cmdline").exists():
        try:
            raw = (_PROC / str(pid) / "cmdline").read_bytes()
        except OSError:
            return None
        return " ".join(a.decode(errors="replace") for a in raw.split(b"\0") if a) or None
    # No /proc (macOS): ask ps.
    done = subprocess.run(
        ["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or None


def running() -> dict[int, Running]:
    """Every process of the system, by pid."""
    if not _PROC.joinpath("self", "stat").exists():
        return _running_from_ps()
    found = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # It ended while the list was read.
        # The command name, in parentheses, may hold spaces: the fields follow its end.
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] == "Z":
            continue  # Exited, only not reaped yet: gone, as `process_command` has it.
        # state, ppid, pgrp, ... starttime (the 22nd field of the whole line).
        found[int(entry.name)] = Running(
            int(entry.name), int(fields[1]), int(fields[2]), fields[19]
        )
    return found


def _running_from_ps() -> dict[int, Running]:
    done = subprocess.run(
        ["ps", "-A", "-o", "pid=,ppid=,pgid=,lstart="], capture_output=True, text=True, check=True
    )
    found = {}
    for line in done.stdout.splitlines():
        pid, parent, group, *started = line.split()
        found[int(pid)] = Running(int(pid), int(parent), int(group), " ".join(started))
    return found


def offspring(pid: int, table: dict[int, Running] | None = None) -> list[Running]:
    """What a process started and still runs: its descendants and its group's other members.

    Args:
        pid: The process, which may have ended: then what it left running.
        table: The system's processes (`running()`), if listed already.
    """
    table = running() if table is None else table
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.parent, []).append(proc.pid)
    found = {p.pid for p in table.values() if p.group == pid} | {pid}
    # Descendants too: a task process puts itself in a group of its own.
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    found.discard(pid)
    return [table[p] for p in sorted(found)]


def stop_recorded(recorded: Iterable[tuple[int, str]], timeout: float = 30.0) -> list[int]:
    """Stop recorded processes, and what they started, if each is still that process.

    All are asked to stop at once (their process group, when they lead one, as the
    playground's services do), then waited for together; one still running at the
    deadline is killed. Then whatever they had started and still runs is killed, each
    only while it is still the process that was found; so is what a recorded process
    that has ended left running.

    Args:
        recorded: Each process's pid and its command line when it started.
        timeout: Seconds to wait for them to stop before killing them.

    Returns:
        The pids that were still those processes (and so were stopped).
    """
    table = running()
    ours: list[tuple[int, str]] = []
    left: list[Running] = []
    for pid, command in recorded:
        if process_command(pid) == command:
            ours.append((pid, command))
            left += offspring(pid, table)
            _signal(pid, signal.SIGTERM)
        elif pid not in table:
            # Gone, but what it started may run on (a killed scheduler's workers). While
            # any member of its group runs, the system gives no process its pid, so
            # those members are what it started, not a stranger's.
            orphans = offspring(pid, table)
            for orphan in orphans:
                _signal(orphan.pid, signal.SIGTERM)
            left += orphans
    deadline = time.monotonic() + timeout
    waiting = list(ours)
    while waiting and time.monotonic() < deadline:
        time.sleep(0.2)
        waiting = [(pid, command) for pid, command in waiting if process_command(pid) == command]
    for pid, command in waiting:
        if process_command(pid) == command:
            _signal(pid, signal.SIGKILL)
    # And what they forked while they wound down: their groups' members now.
    table = running()
    left += [
        child
        for pid, command in ours
        if pid not in table or process_command(pid) == command
        for child in offspring(pid, table)
    ]
    # A grace for the children the leaders told to stop, then no more.
    grace = time.monotonic() + 5
    while _still(left) and time.monotonic() < grace:
        time.sleep(0.2)
    for child in _still(left):
        try:
            os.kill(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # It ended between the check and the signal.
    # Gone when this returns, not only told to go: the caller may start them again.
    gone = time.monotonic() + timeout
    while _still(left) and time.monotonic() < gone:
        time.sleep(0.1)
    return [pid for pid, _ in ours]


def _still(found: list[Running]) -> list[Running]:
    """The processes of `found` still running as themselves (same pid, same start)."""
    table = running()
    return [p for p in found if p.pid in table and table[p.pid].started == p.started]


def _signal(pid: int, sig: signal.Signals) -> None:
    """Signal a process, and its group with it when it leads one."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass  # It ended between the check and the signal.
