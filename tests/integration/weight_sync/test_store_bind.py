"""The weight-sync group's TCPStore listens only on the configured `master_address`: rank 0 hosts it on
127.0.0.1, the kernel's socket table shows it bound there (not on every interface, which TCPStore does
by itself), a member reaches it, and a connection through another local address is refused."""

from __future__ import annotations

import socket
from datetime import timedelta
from pathlib import Path

import pytest

from services.weight_sync import GroupInfo, free_port
from services.weight_sync.wire.group import open_store

TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
LISTEN = "0A"


def _listeners(port: int) -> list[tuple[str, str]]:
    """(table, local address in the kernel's hex form) of every listening socket on `port`."""
    found = []
    for table in TABLES:
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if int(hex_port, 16) == port and fields[3] == LISTEN:
                found.append((table.name, address))
    return found


def _other_local_address() -> str | None:
    """A non-loopback IPv4 address of this machine, if it has one (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


@pytest.mark.skipif(not TABLES[0].exists(), reason="needs Linux /proc/net/tcp")
def test_store_listens_on_the_configured_address_only():
    info = GroupInfo("127.0.0.1", free_port(), world_size=2, timeout_s=10)
    timeout = timedelta(seconds=10)
    host = open_store(info, 0, timeout)
    assert _listeners(info.master_port) == [("tcp", "0100007F")]  # 127.0.0.1, little-endian hex
    member = open_store(info, 1, timeout)
    host.set("k", "v")
    assert member.get("k") == b"v"
    other = _other_local_address()
    if other is not None:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((other, info.master_port), timeout=5).close()
