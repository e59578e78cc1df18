"""Free ports to listen on that nothing started later takes first.

A port the OS hands out for ``bind(port 0)`` comes from its ephemeral range,
the range it also draws from for every later ``bind(0)`` and outgoing
connection.  Between choosing such a port and a listener binding it, a
process that starts in the meantime can take it: a local Ray cluster starts
dozens, each binding ports that way, before its HAProxy binds the ports
chosen for it (a CI run saw a second ``serve --ray`` on one machine fail as
its HAProxy started, the likeliest cause being this race).  Ports are therefore chosen at random from a window the OS
never hands out by itself: 20000-29999, above Ray's worker ports
(10002-19999) and below its replicas' default range (30000-31000), less the
kernel's ephemeral range wherever that overlaps it.
"""

from __future__ import annotations

import random
import socket
from typing import AbstractSet

__all__ = ["free_port_range"]

#: the window ports are drawn from, both ends included
WINDOW = (20000, 29999)
_EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def free_port_range(n: int = 1, taken: AbstractSet[int] = frozenset(), tries: int = 200) -> int:
    """The first of ``n`` consecutive ports that nothing listens on now, none
    in ``taken`` and none the OS would hand out for ``bind(0)``.  Each is
    checked by binding it without SO_REUSEPORT (a listener that has it still
    refuses such a bind).  Where the ephemeral range covers the whole window,
    ports come from ``bind(0)`` instead, as before."""
    if n < 1:
        raise ValueError(f"n: expected at least 1 port, got {n}")
    bases = _bases(n)
    for _ in range(tries):
        base = random.choice(bases) if bases else _os_port()
        ports = range(base, base + n)
        if base + n <= 65536 and taken.isdisjoint(ports) and all(_port_free(p) for p in ports):
            return base
    raise RuntimeError(f"found no {n} consecutive free ports to listen on")


def _bases(n: int) -> list[int]:
    """First ports of the runs of ``n`` in WINDOW outside the ephemeral range."""
    low, high = _ephemeral_range()
    usable = [p for p in range(WINDOW[0], WINDOW[1] + 1) if not low <= p <= high]
    usable_set = set(usable)
    return [p for p in usable if all(q in usable_set for q in range(p, p + n))]


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open(_EPHEMERAL_RANGE_FILE) as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default; elsewhere the window is taken as is


def _os_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True
