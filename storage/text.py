"""Text PostgreSQL can store, made at the boundary where outside text becomes a row.

PostgreSQL refuses two kinds of text Python strings can hold: NUL (``invalid byte sequence for
encoding "UTF8": 0x00``; in jsonb ``unsupported Unicode escape sequence``) and lone surrogates
(UTF-8 cannot encode them; asyncpg fails before sending). One such value in a batched write fails the
whole statement, so text that records what an outsider sent (an audit row's path, query, details)
goes through ``storable`` first: the hostile request is recorded, escaped, instead of lost.

The escapes are visible and one-way: NUL becomes the four characters ``\\x00`` and a lone surrogate
its ``\\u`` escape with four hex digits (``\\udc80``); nothing decodes them back.
"""

from __future__ import annotations

from typing import Any


def storable(text: str) -> str:
    """``text`` with NUL and lone surrogates escaped; the same object when nothing needed escaping."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if text.isascii():  # the common case: no surrogate can be in it
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def storable_value(value: Any) -> Any:
    """``storable`` applied to every string (and mapping key) inside dicts, lists and tuples, as a
    jsonb column or a row of text columns needs; other values are returned as they are."""
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, dict):
        return {(storable(k) if isinstance(k, str) else k): storable_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable_value(v) for v in value]
    if isinstance(value, tuple):
        return tuple(storable_value(v) for v in value)
    return value


def refusal(text: str) -> str | None:
    """Why PostgreSQL would refuse ``text`` (for a boundary that refuses instead of escaping), or None."""
    if "\x00" in text:
        return "contains a NUL character"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "contains a lone surrogate"
    return None
