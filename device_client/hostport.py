"""``HOST:PORT`` as a flag gives it (``--tunnel-target ssh=127.0.0.1:22``, ``fleethub tunnel --listen``).

A module of its own, with nothing but ``re``: the ``fleethub tunnel`` CLI parses its ``--listen`` with it
and loads neither trio nor the agent's tunnel service (device_client/tunnel.py) for that.
"""

from __future__ import annotations

import re

_HOSTPORT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(?P<port>\d{1,5})$")


def parse_hostport(text: str) -> tuple[str, int]:
    """``(host, port)``, an IPv6 host without its brackets; ValueError for anything else or port 0."""
    match = _HOSTPORT.match(text.strip())
    if not match or not 0 < int(match["port"]) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return match["host"].strip("[]"), int(match["port"])
