"""Commands are idempotent by id: the device answers a repeated id with the reply it already gave.

The memory is bounded (the newest ``memory`` replies; a lookup counts as use) and outlives a link
(the hub resends a command whose reply the dropped link lost); a boot forgets it. Whether a repeat
waits for a first run still going is the shell's (device_client/commands.py): this holds no tasks.
"""

from __future__ import annotations

from collections import OrderedDict

from .. import protocol as p

REPLY_MEMORY = 256  # command ids whose replies are kept for duplicates


class ReplyMemory:
    def __init__(self, memory: int = REPLY_MEMORY) -> None:
        if memory < 1:
            raise ValueError("a reply memory keeps at least one reply")
        self.memory = memory
        self.duplicates = 0
        self._replies: OrderedDict[str, p.Reply] = OrderedDict()

    def repeat(self, command_id: str) -> p.Reply | None:
        """The reply already given to ``command_id`` (counted as a duplicate), or None: run it."""
        reply = self._replies.get(command_id)
        if reply is not None:
            self._replies.move_to_end(command_id)
            self.duplicates += 1
        return reply

    def remember(self, command_id: str, reply: p.Reply) -> None:
        self._replies[command_id] = reply
        self._replies.move_to_end(command_id)
        while len(self._replies) > self.memory:
            self._replies.popitem(last=False)

    def stored(self, command_id: str) -> p.Reply | None:
        """The reply to ``command_id`` without counting a duplicate (a reboot persists its own)."""
        return self._replies.get(command_id)

    def forget(self) -> None:
        self._replies.clear()

    def __len__(self) -> int:
        return len(self._replies)
