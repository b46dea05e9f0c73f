"""Ports for servers that must be told one (a ``fleethub serve`` process, nats-server, coturn and its
relay ports, sshd, HAProxy, a PostgreSQL restarted on the same port), safe when pytest-xdist runs
several workers.

Whatever can bind 127.0.0.1 port 0 itself does so. A port handed to another process is free only
until someone else binds it, and the kernel gives port-0 binds and outgoing connections any free
port of ``ip_local_port_range`` (32768-60999 by default): another worker's hub, listener or client
could take it between our check and the server's bind. So these ports come from below that range,
which the kernel never hands out by itself, and each xdist worker walks a slice of its own (from a
random point, so that two sessions at once rarely meet); a port is handed out only if it can be
bound now, over TCP and UDP.
"""

from __future__ import annotations

import os
import random
import socket

LOW, HIGH = 15000, 32000  # below the kernel's ephemeral ports (see above)


def _slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", … under xdist
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1), 1)
    index = int(worker[2:]) % count if worker[2:].isdigit() else 0
    span = (HIGH - LOW) // count
    return range(LOW + index * span, LOW + (index + 1) * span)


_slice_ports = _slice()
_next = _slice_ports.start + random.Random(os.getpid()).randrange(len(_slice_ports))


def _bindable(port: int) -> bool:
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_INET, kind) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive free ports, none handed out before by this process."""
    global _next
    for _ in range(len(_slice_ports)):
        if _next + count > _slice_ports.stop:
            _next = _slice_ports.start
        block = range(_next, _next + count)
        _next += count
        if all(_bindable(port) for port in block):
            return block.start
    raise RuntimeError(f"no {count} free ports in {_slice_ports}")


def free_port() -> int:
    return free_ports(1)

