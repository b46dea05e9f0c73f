"""The agent's side of the link's frame limit: never send a frame the hub would refuse, and never
send one it did refuse again.

Frames are bounded by construction (device_client/shared/protocol.py), so this is the net under that:

- Before sending, ``protocol.encode`` refuses a frame over the link's limit (the smaller of ours and
  the welcome's ``maxFrameBytes``). The frame is not sent; its owner's trimmer (``on_too_big``,
  registered per event kind: the memory tester trims a result to its summary) is asked for a smaller
  payload, which is sent instead; without a trimmer, or if it is still too big, it is dropped.
- If the hub closes the link with 1009 anyway (a hub or proxy with a smaller limit), the frame it
  names in the close reason — or else the largest sent on that link — gets the same treatment before
  the agent reconnects, so it never sends the same refused frame in a loop: a trimmer changes what is
  stored for the next link, and a frame with no trimmer is remembered (by digest) and never sent again.
  A refused reply is remembered as an error reply (``too_large``), so a repeated command gets that.

Every refusal is recorded on disk (``link-frames.json``, the newest ``KEEP``) and reported to the hub
at the next link as event ``link.refused`` {refusals: [{frame, bytes, limit, by ("agent" | "hub"),
action ("trimmed" | "dropped"), reason, at}]}.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .shared import protocol
from .state import StateFile

log = logging.getLogger("fleethub.agent")

KEEP = 16  # refusals kept on disk and reported
REMEMBERED = 64  # digests of refused frames never sent again
WATCHED_BYTES = 4 << 10  # frames this big may be the one a 1009 refers to: watched, by digest

_LIMIT_IN_REASON = re.compile(r"over the (?:link's )?limit of (\d+) bytes")
_HELLO_STAGES = ((), ("lastMemoryTest", "memoryTestRunning"), ("retiredPages", "secretFileDigests"))
# kind -> trimmer(payload, reason) -> a smaller payload, or None to drop the frame
Trimmer = Callable[[dict[str, Any], str], dict[str, Any] | None]


@dataclass
class Sent:
    what: str  # "event memtest.result", "reply", "hello"
    size: int
    kind: str | None = None
    payload: dict[str, Any] | None = None
    reply_id: str | None = None
    digest: str = ""


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class FrameGuard:
    def __init__(self, data_dir: Path, clock: Any, limit: int = protocol.MAX_FRAME_BYTES) -> None:
        self.own_limit = limit
        self.limit = limit
        self.clock = clock
        self.state = StateFile(Path(data_dir) / "link-frames.json")
        self.trimmers: dict[str, Trimmer] = {}
        self.largest: Sent | None = None
        self.refused = 0
        self.hello_stage = 0
        # the hub's real limit as a refusal showed it (a proxy, or a hub stricter than its welcome):
        # frames past it are trimmed or dropped here, so one refusal is not followed by more
        self.learned: int | None = None

    # ---- the link's limit ----

    def linked(self, hub_limit: int | None) -> None:
        """A new link: the hub's limit from its welcome (and what a refusal taught us); forget the
        previous link's largest frame."""
        self.limit = min(self.own_limit, hub_limit or self.own_limit, self.learned or self.own_limit)
        self.largest = None

    def on_too_big(self, kind: str, trimmer: Trimmer) -> None:
        self.trimmers[kind] = trimmer

    # ---- sending ----

    def encode_event(self, kind: str, payload: dict[str, Any]) -> str | None:
        """The event's text within the limit (trimmed if need be), or None: dropped, not to be sent."""
        frame = protocol.Event(kind=kind, payload=payload)
        try:
            text = protocol.encode(frame, self.limit)
        except protocol.FrameTooLarge as exc:
            smaller = self._trim(kind, payload, str(exc), exc.size, by="agent")
            if smaller is None:
                return None
            try:
                text = protocol.encode(protocol.Event(kind=kind, payload=smaller), self.limit)
            except protocol.FrameTooLarge as again:
                self._record(again.what, again.size, "agent", "dropped", str(again))
                return None
            payload = smaller
        if self._remembered(text):
            log.warning("link: not sending event %s again: the hub refused it as too big", kind)
            return None
        self._watch(Sent(f"event {kind}", len(text), kind=kind, payload=payload), text)
        return text

    def encode_reply(self, reply: protocol.Reply) -> tuple[str, protocol.Reply]:
        """The reply's text within the limit: a reply too big becomes an error reply ``too_large``."""
        try:
            text = protocol.encode(reply, self.limit)
        except protocol.FrameTooLarge as exc:
            self._record("reply", exc.size, "agent", "dropped", str(exc))
            reply = too_large(reply.id, str(exc))
            text = protocol.encode(reply, self.limit)
        self._watch(Sent("reply", len(text), reply_id=reply.id), text)
        return text, reply

    def encode_hello(self, fields: dict[str, Any]) -> str:
        """The hello within the limit: past it, what the hub also learns later goes (the newest
        memory-test result and run, sent again as events), then the file digests (the hub re-pushes).
        A hello the hub refused starts one stage further the next time."""
        for stage, drop in enumerate(_HELLO_STAGES):
            for name in drop:
                fields.pop(name, None)
            if stage < self.hello_stage:
                continue
            try:
                text = protocol.encode(protocol.Hello(**fields), self.limit)
            except protocol.FrameTooLarge as exc:
                self._record("hello", exc.size, "agent", "trimmed", str(exc))
                continue
            self.largest = Sent("hello", len(text), digest=digest(text)) if len(text) >= WATCHED_BYTES else None
            return text
        return protocol.encode(protocol.Hello(**{k: fields[k] for k in ("agentVersion", "bootReason") if k in fields}))

    # ---- the hub refused a frame ----

    def refused_by_hub(self, reason: str) -> None:
        """The hub closed the link with 1009: deal with the frame it names (else the largest sent),
        and keep every later frame under the limit it showed."""
        sent = self.largest
        said = _LIMIT_IN_REASON.search(reason)
        shown = int(said.group(1)) if said else (sent.size - 1 if sent is not None else None)
        if shown is not None and shown > 0:
            self.learned = min(self.learned or shown, shown)
            self.limit = min(self.limit, self.learned)
        if sent is None:
            self._record("frame", 0, "hub", "unknown", reason)
            return
        self.largest = None
        if sent.what == "hello":
            self.hello_stage = min(self.hello_stage + 1, len(_HELLO_STAGES))
            self._record("hello", sent.size, "hub", "trimmed", reason)
            return
        if sent.kind is not None and sent.payload is not None and sent.kind in self.trimmers:
            self._trim(sent.kind, sent.payload, reason, sent.size, by="hub")
            return
        self._remember(sent.digest)
        self._record(sent.what, sent.size, "hub", "dropped", reason)

    # ---- records ----

    def take_report(self) -> list[dict[str, Any]]:
        """The refusals not yet reported to the hub (marked reported)."""
        records = self.state.get("refusals", [])
        new = [r for r in records if not r.get("reported")]
        if new:
            self.state.update(refusals=[{**r, "reported": True} for r in records])
        return [{k: v for k, v in r.items() if k != "reported"} for r in new]

    def records(self) -> list[dict[str, Any]]:
        return list(self.state.get("refusals", []))

    def _trim(self, kind: str, payload: dict[str, Any], reason: str, size: int, *, by: str) -> dict[str, Any] | None:
        trimmer = self.trimmers.get(kind)
        smaller = trimmer(payload, reason) if trimmer is not None else None
        self._record(f"event {kind}", size, by, "trimmed" if smaller is not None else "dropped", reason)
        return smaller

    def _record(self, what: str, size: int, by: str, action: str, reason: str) -> None:
        self.refused += 1
        log.warning("link: %s frame of %d bytes refused by the %s (limit %d): %s", what, size,
                    "hub" if by == "hub" else "agent itself", self.limit, action)
        from .shared.clock import rfc3339

        record = {"frame": what, "bytes": size, "limit": self.limit, "by": by, "action": action,
                  "reason": reason[:200], "at": rfc3339(self.clock.now())}
        self.state.update(refusals=(self.records() + [record])[-KEEP:])

    def _watch(self, sent: Sent, text: str) -> None:
        # what a 1009 without a reason refers to: the largest frame of the link
        if sent.size >= WATCHED_BYTES and (self.largest is None or sent.size >= self.largest.size):
            sent.digest = digest(text)
            self.largest = sent

    def _remember(self, value: str) -> None:
        if value:
            self.state.update(never=(self.state.get("never", []) + [value])[-REMEMBERED:])

    def _remembered(self, text: str) -> bool:
        never = self.state.get("never", [])
        return bool(never) and len(text) >= WATCHED_BYTES and digest(text) in never


def too_large(reply_id: str, message: str) -> protocol.Reply:
    return protocol.Reply(id=reply_id, ok=False,
                          error=protocol.ReplyError(code="too_large", message=message[:200]))
