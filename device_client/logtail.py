"""The end of a program's output as an operator may read it on the hub: bounded, valid text, with
nothing in it a terminal or a browser would act on.

A rejected configuration carries two of these (device_client/configs.py): what the health check
printed and the workload log's last lines. Both are the operator's own programs' output, so they
are sent as they are apart from the bounds; the agent adds nothing of its own to them (no
environment, no file contents).

The bounds: the last ``MAX_LINES`` lines of the last ``MAX_BYTES`` bytes, and at most ``MAX_CHARS``
characters once made visible (the wire schema, device_client/shared/verbs.py, holds the hub to the
same figure). Undecodable bytes become U+FFFD; control characters other than newline and tab become
their visible escape (``\\x1b``), so a colour code or a carriage return cannot rewrite what is
shown.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import BinaryIO

from .shared.verbs import OUTPUT_TAIL_CHARS

log = logging.getLogger("fleethub.agent.workload")

MAX_BYTES = 2048
MAX_LINES = 20
MAX_CHARS = OUTPUT_TAIL_CHARS  # the wire limit (the hub refuses more)

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(data: bytes) -> str:
    """``data`` as bounded, visible text: see the module's docstring. Empty output gives ''."""
    data = data[-MAX_BYTES:]
    if len(data) == MAX_BYTES:
        # the cut may have split a line and a character: start at the next whole line if there is one
        newline = data.find(b"\n")
        if 0 <= newline < len(data) - 1:
            data = data[newline + 1:]
        else:  # one long line: at least do not start inside a character (UTF-8 continuation bytes)
            data = data[next((i for i, b in enumerate(data[:4]) if not 0x80 <= b <= 0xBF), 0):]
    text = data.decode("utf-8", "replace").replace("\r\n", "\n")
    lines = text.rstrip("\n").split("\n")[-MAX_LINES:]
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", "\n".join(lines))
    return text[-MAX_CHARS:]


def last_line(text: str, limit: int = 200) -> str | None:
    """The last non-blank line of ``visible`` text, cut to ``limit`` characters (an error's summary)."""
    for line in reversed(text.split("\n")):
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[:limit - 1] + "…"
    return None


def read_tail(source: BinaryIO) -> bytes:
    """The last ``MAX_BYTES`` of an open file, whatever its size."""
    size = source.seek(0, os.SEEK_END)
    source.seek(max(0, size - MAX_BYTES))
    return source.read(MAX_BYTES)


def file_tail(path: Path) -> str | None:
    """``visible`` of the file's end; None when there is no such file or nothing in it."""
    try:
        with open(path, "rb") as f:
            data = read_tail(f)
    except FileNotFoundError:
        return None
    return visible(data) or None


def append_and_tail(out: BinaryIO, log_path: Path) -> str | None:
    """A finished program's output (the open file ``out``) appended to the log at ``log_path``, and
    its ``visible`` end; None when it printed nothing. The log is for a human later: when it cannot
    be written the end is still returned."""
    tail = read_tail(out)
    if not tail:
        return None
    out.seek(0)
    try:
        with open(log_path, "ab") as log_file:
            shutil.copyfileobj(out, log_file)
    except OSError as exc:
        log.warning("a health check's output could not be added to %s: %s", log_path, exc.strerror or exc)
    return visible(tail) or None
