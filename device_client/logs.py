"""Log records as text or as one JSON object per line (FLEETHUB_LOG_FORMAT=json or ``--log-format json``),
for every ``fleethub`` command. The hub adds its request context with a filter (hub/logs.py); this
module stays free of the hub's dependencies because the agent, on a device without them, logs too.
Messages are written as the code formatted them: the code never formats a secret into a message, and
this module adds nothing but the record's own fields.
"""

from __future__ import annotations

import datetime as dt
import json
import logging

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


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


def configure(level: str, fmt: str = "text", filters: tuple[logging.Filter, ...] = ()) -> None:
    handler = logging.StreamHandler()
    for f in filters:
        handler.addFilter(f)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
