"""The driver's Kafka clients: one per configuration, kept for the process and reused.

The driver asks the brokers small questions (which partitions a topic has, their
watermarks, the topics' ids and retention) and commits the consumer group's offsets.
A pipeline routing its topics to hundreds of tables asks them for every table: a new
client per question costs 15 to 30 ms to start and connect, against a fraction of a
millisecond for the request on a client already connected, which made the clients
most of an idle run's time. None of these questions leaves state in the client (no
subscription, no assignment), so one client per configuration serves them all.

A client is used by one caller at a time; one whose request failed is closed and
replaced, so a client in a bad state is never handed out again. At most
`KEPT_CLIENTS` are kept (the least recently used is closed first), and a process
forked from one that holds clients starts with none of its own: a librdkafka client
does not survive a fork.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

KEPT_CLIENTS = 8


C = TypeVar("C")


class _Kept:
    """The clients kept by this process, by kind and configuration."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.clients: OrderedDict[tuple[str, tuple[tuple[str, str], ...]], Any] = OrderedDict()
        self.busy: set[tuple[str, tuple[tuple[str, str], ...]]] = set()


_kept = _Kept()


def client_key(kind: str, conf: dict[str, Any]) -> tuple[str, tuple[tuple[str, str], ...]]:
    """What tells one client configuration from another: its settings but the log handler."""
    # The log handler is an object whose identity is the same for every client.
    return kind, tuple(sorted((k, repr(v)) for k, v in conf.items() if k != "logger"))


@contextmanager
def _held(kind: str, conf: dict[str, Any], make: Callable[[dict[str, Any]], C]) -> Iterator[C]:
    """A kept client of this configuration, or a new one; for the block's use alone."""
    global _kept
    if _kept.pid != os.getpid():
        # Forked: the parent's clients are not this process's to use or close.
        _kept = _Kept()
    key = client_key(kind, conf)
    with _kept.lock:
        client: Any = None if key in _kept.busy else _kept.clients.pop(key, None)
        if client is not None:
            _kept.busy.add(key)
    own = client is None
    if own:
        # In use elsewhere (another thread) or not made yet: a client of this call's own.
        client = make(conf)
    try:
        yield client
    except BaseException:
        _close(client)
        if not own:
            with _kept.lock:
                _kept.busy.discard(key)
        raise
    with _kept.lock:
        if not own:
            _kept.busy.discard(key)
        doomed = None
        if key in _kept.clients:
            # Another was kept meanwhile (this one was made while it was in use).
            doomed = client
        else:
            _kept.clients[key] = client
            if len(_kept.clients) > KEPT_CLIENTS:
                doomed = _kept.clients.popitem(last=False)[1]
    if doomed is not None:
        _close(doomed)


def consumer(conf: dict[str, Any]) -> AbstractContextManager[Consumer]:
    """A consumer of this configuration for the block's use (`with consumer(conf) as c`).

    Only for requests that leave no state in it: no `subscribe`, `assign` or `consume`.
    """
    return _held("consumer", conf, Consumer)


def admin(conf: dict[str, Any]) -> AbstractContextManager[AdminClient]:
    """An admin client of this configuration for the block's use (`with admin(conf) as a`)."""
    return _held("admin", conf, AdminClient)


def _close(client: Any) -> None:  # noqa: ANN401 - a Consumer or an AdminClient
    close = getattr(client, "close", None)
    if close is not None:
        try:
            close()
        except Exception:  # noqa: BLE001, S110 - a client already broken closes as it can
            pass


@atexit.register
def close_all() -> None:
    """Close every client this process keeps (at exit, and where a test needs it)."""
    if _kept.pid != os.getpid():
        return
    with _kept.lock:
        clients = list(_kept.clients.values())
        _kept.clients.clear()
    for client in clients:
        _close(client)
