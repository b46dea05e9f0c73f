"""A received frame's size against the link's limit, and the words that name a refused one."""

from __future__ import annotations

import re

from .. import protocol as p

_KIND = re.compile(r'"type"\s*:\s*"([a-z]{1,16})"(?:.{0,200}?"kind"\s*:\s*"([a-z0-9_.]{1,64})")?', re.S)


def frame_size(message: str | bytes, limit: int = p.MAX_FRAME_BYTES) -> int:
    """The frame's size in UTF-8 bytes, exact whenever it matters against ``limit``."""
    if isinstance(message, bytes):
        return len(message)
    # a character is at most 4 bytes in UTF-8: only a frame that might be too big is encoded
    return len(message) if len(message) * 4 <= limit else len(message.encode())


def what(message: str | bytes) -> str:
    """``event memtest.result``: from the frame's first bytes, without parsing the whole of it."""
    head = message[:400] if isinstance(message, str) else message[:400].decode(errors="replace")
    m = _KIND.search(head)
    if m is None:
        return "frame"
    return f"{m.group(1)} {m.group(2)}" if m.group(2) else m.group(1)


def too_big_reason(frame: str, size: int, limit: int = p.MAX_FRAME_BYTES) -> str:
    # a close reason is at most 123 bytes
    return f"{frame} frame of {size} bytes is over the limit of {limit} bytes"[:123]
