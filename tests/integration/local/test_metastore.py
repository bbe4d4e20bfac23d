"""The local Hive Metastore listens on loopback only, still serves there, and logs at home."""

from __future__ import annotations

import socket

import psutil

from strata.catalog.metastore import MetastoreClient
from strata.local.metastore import LOOPBACK


def _listening_addresses(port: int) -> set[str]:
    return {
        c.laddr.ip
        for c in psutil.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
    }


def _other_addresses() -> list[tuple[socket.AddressFamily, str]]:
    """This host's addresses that are not loopback (link-local IPv6 needs a scope; skipped)."""
    found = []
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                found.append((socket.AF_INET, a.address))
            elif (
                a.family == socket.AF_INET6
                and a.address != "::1"
                and not a.address.lower().startswith("fe80")
            ):
                found.append((socket.AF_INET6, a.address.split("%")[0]))
    return found


def _accepts(family: socket.AddressFamily, address: str, port: int) -> bool:
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        return s.connect_ex((address, port)) == 0


def test_the_local_metastore_listens_on_loopback_only(metastore, tmp_path):
    # Hive 2.3's own main binds every interface (`*:port` in `ss -ltn`), which would
    # put an unauthenticated metastore on the network.
    assert _listening_addresses(metastore.port) == {LOOPBACK}
    reachable = [a for family, a in _other_addresses() if _accepts(family, a, metastore.port)]
    assert reachable == [], f"the metastore answers on {reachable}, not only on loopback"
    # Bound to loopback, it is still the real service there: it keeps what it is told.
    with MetastoreClient(metastore.uri, 30) as client:
        created = client.ensure_database("bind_check", tmp_path.as_uri(), "bind test")
        assert (created, client.ensure_database("bind_check", tmp_path.as_uri(), "")) == (
            True,
            False,
        )
    # Hive's own log is the metastore's, in its directory, not the user's temporary one.
    assert "bind_check" in (metastore.directory / "hive.log").read_text()
