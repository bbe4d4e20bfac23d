"""The driver's Kafka clients: one per configuration, reused, replaced when a request fails."""

from __future__ import annotations

import pytest

from strata.batch import _clients


class Client:
    made = 0

    def __init__(self, conf: dict[str, object]) -> None:
        Client.made += 1
        self.conf = conf
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(_clients, "_kept", _clients._Kept())
    Client.made = 0


def _use(conf: dict[str, object]) -> Client:
    with _clients._held("test", conf, Client) as client:
        return client


def test_one_client_per_configuration_serves_every_request():
    first = _use({"bootstrap.servers": "a:9092", "logger": object()})
    again = _use({"bootstrap.servers": "a:9092", "logger": object()})
    other = _use({"bootstrap.servers": "b:9092"})
    assert again is first and other is not first
    assert Client.made == 2 and not first.closed


def test_a_client_whose_request_failed_is_closed_and_not_handed_out_again():
    first = _use({"bootstrap.servers": "a:9092"})
    with (
        pytest.raises(RuntimeError),
        _clients._held("test", {"bootstrap.servers": "a:9092"}, Client),
    ):
        raise RuntimeError("the broker did not answer")
    assert first.closed
    assert _use({"bootstrap.servers": "a:9092"}) is not first


def test_a_client_in_use_is_not_shared_and_the_spare_is_closed():
    conf = {"bootstrap.servers": "a:9092"}
    with _clients._held("test", conf, Client) as busy:
        inner = _use(conf)
        assert inner is not busy
    # The one kept meanwhile stays; the one that was busy is closed on its return.
    assert busy.closed and not inner.closed
    assert _use(conf) is inner


def test_at_most_kept_clients_stay_open_the_oldest_closed_first():
    made = [_use({"bootstrap.servers": f"h{i}:9092"}) for i in range(_clients.KEPT_CLIENTS + 2)]
    assert [c.closed for c in made] == [True, True] + [False] * _clients.KEPT_CLIENTS
    _clients.close_all()
    assert all(c.closed for c in made)


def test_a_forked_process_starts_with_no_client_of_its_parent(monkeypatch):
    first = _use({"bootstrap.servers": "a:9092"})
    monkeypatch.setattr(_clients._kept, "pid", -1)
    second = _use({"bootstrap.servers": "a:9092"})
    assert second is not first and not first.closed
