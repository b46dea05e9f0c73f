"""A device, fleet or configuration as an operator types it on the command line: an id or a name.

A UUID-shaped argument (8-4-4-4-12 hex digits) is an id and is used as it is, without asking the hub:
ids are what scripts pass, and a name of that shape could not be told from one. Anything else is a
name, looked up with the list's exact ``?name=`` filter under the caller's own credentials, so a
lookup finds only what that caller's list would show (viewer; tunnel_access alone shows nothing).
Fleet and configuration names are unique in an organisation, device names are not: a name several
visible devices share is refused with their count and ids, never resolved to one of them.

The request itself is the caller's (``fetch``): each command already has its own client, headers
and way of turning a transport failure into its one line.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

LISTS = {"device": "/v1/devices", "fleet": "/v1/fleets", "configuration": "/v1/configurations"}
SHOWN_IDS = 5  # of a name's duplicates, how many ids the refusal lists
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")

# The list answer for (path, query parameters): {"data": [...], "pagination": {"total": N, ...}}.
Fetch = Callable[[str, dict[str, str]], Awaitable[Any]]


class NameLookupError(Exception):
    """The name matched no visible resource (``name_unknown``), several (``name_ambiguous``), or the
    hub's answer was not a list (``bad_answer``)."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


def id_shaped(text: str) -> bool:
    return _UUID.fullmatch(text) is not None


async def resolve(kind: str, text: str, fetch: Fetch) -> str:
    """The id of the ``kind`` ("device", "fleet", "configuration") the operator means by ``text``."""
    if id_shaped(text):
        return text.lower()
    # limit SHOWN_IDS: enough to name the duplicates; the total counts them all
    body = await fetch(LISTS[kind], {"name": text, "limit": str(SHOWN_IDS)})
    try:
        ids = [str(item["id"]) for item in body["data"]]
        total = int(body["pagination"]["total"])
    except (KeyError, TypeError, ValueError):
        raise NameLookupError(f"the hub's answer to GET {LISTS[kind]}?name= is not a list", code="bad_answer") from None
    if total == 1 and len(ids) == 1:
        return ids[0]
    if total == 0:
        raise NameLookupError(f"no {kind} you can see is named {text!r}", code="name_unknown")
    more = ", ..." if total > len(ids) else ""
    raise NameLookupError(f"{total} {kind}s are named {text!r} ({', '.join(ids)}{more}); use the id",
                          code="name_ambiguous")
