"""How a timestamp is written on the wire: RFC 3339, UTC, with a Z (clock.py re-exports it).

Apart from clock.py because clock.py is trio's (deadlines are trio time) and the ``fleethub tunnel``
CLI, which has no trio (webrtc/cli_tunnel.py), reads grant times with webrtc/grant.py, which uses this.
"""

from __future__ import annotations

import datetime as dt

UTC = dt.timezone.utc


def utc_now() -> dt.datetime:
    """The wall clock, aware UTC: the one read of it. ``Clock.now`` (clock.py) is this; the
    ``fleethub tunnel`` CLI, which has no trio and so no Clock, calls it directly."""
    return dt.datetime.now(UTC)


def rfc3339(instant: dt.datetime | None) -> str | None:
    """RFC 3339 in UTC with a Z, millisecond precision: how every timestamp leaves the hub."""
    if instant is None:
        return None
    if instant.tzinfo is not UTC:  # asyncpg's and Clock's are UTC already: no conversion to make
        instant = instant.astimezone(UTC)
    return instant.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_rfc3339(value: str) -> dt.datetime:
    """An RFC 3339 time with its zone (``Z`` or an offset); ValueError for anything else."""
    instant = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if instant.tzinfo is None:
        raise ValueError(f"{value!r} has no time zone")
    return instant
