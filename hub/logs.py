"""Log records as one JSON object per line, each carrying the request id and organisation of the
request it was written in (FLEETHUB_LOG_FORMAT=json or ``--log-format json``).

The request context comes from Quart's ``g`` when the record is written inside a request (the
before-request hook sets ``g.request_id`` and the authentication sets ``g.org``); outside one (actors,
write-behind, the agent) those fields are absent. Messages are written as the code formatted them:
the code never formats a secret into a message, and this module adds nothing but context.
"""

from __future__ import annotations

import datetime as dt
import json
import logging

from quart import g, has_request_context, has_websocket_context

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class RequestContext(logging.Filter):
    """Adds ``request_id`` and ``org_id`` to records written inside a request."""

    def filter(self, record: logging.LogRecord) -> bool:
        if has_request_context() or has_websocket_context():
            record.request_id = getattr(g, "request_id", None)
            org = getattr(g, "org", None)
            record.org_id = str(org.org_id) if org is not None else None
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and value is not None and not key.startswith("_"):
                entry[key] = value if isinstance(value, (str, int, float, bool)) else str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(level: str, fmt: str = "text") -> None:
    handler = logging.StreamHandler()
    handler.addFilter(RequestContext())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    logging.getLogger("hypercorn.error").setLevel(logging.WARNING)
