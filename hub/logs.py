"""Log records carry the request id and organisation of the request they were written in (as fields
of the JSON lines of device_client/logs.py, which formats them for every command).

The request context comes from Quart's ``g`` when the record is written inside a request (the
before-request hook sets ``g.request_id`` and the authentication sets ``g.org``); outside one (actors,
write-behind) those fields are absent. This module adds nothing but context.
"""

from __future__ import annotations

import logging

from quart import g, has_request_context, has_websocket_context

from device_client.logs import JsonFormatter
from device_client.logs import configure as configure_records

__all__ = ["JsonFormatter", "RequestContext", "configure"]


class RequestContext(logging.Filter):
    """Adds ``request_id`` and ``org_id`` to records written inside a request."""

    def filter(self, record: logging.LogRecord) -> bool:
        if has_request_context() or has_websocket_context():
            record.request_id = getattr(g, "request_id", None)
            org = getattr(g, "org", None)
            record.org_id = str(org.org_id) if org is not None else None
        return True


def configure(level: str, fmt: str = "text") -> None:
    configure_records(level, fmt, filters=(RequestContext(),))
    logging.getLogger("hypercorn.error").setLevel(logging.WARNING)
