"""Ports chosen for servers and a local Ray cluster's listeners: free, and
outside the range the OS hands out for ``bind(0)`` and outgoing connections."""

from __future__ import annotations

import socket

import pytest

from specdec_cpu.server import listen_ports
from specdec_cpu.server.listen_ports import WINDOW, free_port_range


def test_ports_come_from_the_window_outside_the_ephemeral_range() -> None:
    low, high = listen_ports._ephemeral_range()
    for n in (1, 64):
        taken: set = set()
        for _ in range(20):
            base = free_port_range(n, taken)
            ports = range(base, base + n)
            assert WINDOW[0] <= base and base + n - 1 <= WINDOW[1]
            assert not any(low <= p <= high for p in ports)
            assert not taken.intersection(ports)
            assert all(listen_ports._port_free(p) for p in ports)
            taken.update(ports)


def test_a_port_something_listens_on_is_never_chosen(monkeypatch) -> None:
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as Ray's listeners
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        monkeypatch.setattr(listen_ports, "_bases", lambda n: [port])
        with pytest.raises(RuntimeError, match="no 1 consecutive free ports"):
            free_port_range(1, tries=5)


def test_where_the_ephemeral_range_covers_the_window_the_os_picks(monkeypatch) -> None:
    monkeypatch.setattr(listen_ports, "_ephemeral_range", lambda: (1024, 65535))
    assert listen_ports._bases(1) == []
    port = free_port_range()
    assert listen_ports._port_free(port)


def test_a_bad_count_is_refused() -> None:
    with pytest.raises(ValueError, match="n: expected at least 1 port, got 0"):
        free_port_range(0)
