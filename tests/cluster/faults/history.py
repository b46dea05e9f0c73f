"""The fault suite's history: one JSON object a line, each with ``t`` (seconds since the run began,
by this process's monotonic clock) and ``kind`` (checker.py lists the kinds)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


class History:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.started = time.monotonic()
        self._file: Any = None

    def __enter__(self) -> "History":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("w")
        return self

    def __exit__(self, *exc: Any) -> None:
        self._file.close()

    def add(self, kind: str, **fields: Any) -> None:
        record = {"t": round(time.monotonic() - self.started, 3), "kind": kind, **fields}
        self._file.write(json.dumps(record, default=str) + "\n")
        self._file.flush()


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
