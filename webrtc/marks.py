"""Where the time to a usable tunnel goes: named timestamps of one ``fleethub tunnel`` run (issue 35).

``FLEETHUB_TUNNEL_TIMING=1`` (or ``--verbose``) makes the CLI print them on stderr as it exits, one
line: ``tunnel timing: {"parsed": ..., "offer": ..., ...}``, wall-clock seconds since the epoch, so a
caller that noted when it started ssh can subtract its own start. bench/tunnel_product.py reads the
line to split ``ssh host true`` into its phases. Marks may be taken on any thread (the agent's peers
mark ICE and DTLS on its asyncio thread); the first time a name is marked is the one kept.
"""

from __future__ import annotations

import json
import os
import resource
import time
from typing import Callable

TIMING_ENV = "FLEETHUB_TUNNEL_TIMING"
PREFIX = "tunnel timing: "


def wanted() -> bool:
    return os.environ.get(TIMING_ENV, "") not in ("", "0")


class Marks:
    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self._at: dict[str, float] = {}
        self._now = now

    def mark(self, name: str) -> None:
        # dict.setdefault is one bytecode-level operation under the GIL: safe from the asyncio thread.
        # wall-clock time, not monotonic: these marks are compared with times taken in other processes
        # (ssh's start, read by bench/tunnel_product.py), and they decide nothing
        self._at.setdefault(name, self._now())

    def line(self) -> str:
        """The one line printed at exit: the marks and the process's CPU seconds so far."""
        usage = resource.getrusage(resource.RUSAGE_SELF)
        doc = {**self._at, "cpu": round(usage.ru_utime + usage.ru_stime, 4)}
        return PREFIX + json.dumps(doc, separators=(",", ":"))


def parse(text: str) -> dict[str, float] | None:
    """The marks in a stderr text (the last timing line), or None."""
    found = None
    for line in text.splitlines():
        if line.startswith(PREFIX):
            found = json.loads(line[len(PREFIX):])
    return found
