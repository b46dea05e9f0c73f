"""How the device's parts plug into the agent: commands from the hub (the verb table, running one
command, the idempotent reply cache) and hooks (hello fields, boot, link and shutdown).

A command is ``{id, subject: cmd.<device_id>.<verb>, payload}``. The hub may send the same id again
(it timed out, or the link dropped before the reply arrived); the device answers a repeat with the
reply it already gave instead of doing the work twice, and a repeat that arrives while the first is
still running waits for that first reply.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any, Awaitable, Callable

import trio

from .shared import protocol
from .shared.link.replies import REPLY_MEMORY, ReplyMemory

log = logging.getLogger("fleethub.agent")

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any] | None]]
Hook = Callable[[], Awaitable[None]]

_current_command: ContextVar[str | None] = ContextVar("fleethub_current_command", default=None)


class CommandError(Exception):
    """Raised by a handler to answer ``ok: false`` with a specific error code."""

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message


def current_command() -> str | None:
    """The id of the command whose handler is running in this task, if any."""
    return _current_command.get()


def error_reply(command_id: str, code: str, message: str) -> protocol.Reply:
    return protocol.Reply(id=command_id, ok=False, error=protocol.ReplyError(code=code, message=message))


class CommandTable:
    def __init__(self, memory: int = REPLY_MEMORY, on_idle: Callable[[], None] | None = None) -> None:
        self.memory = memory
        self.on_idle = on_idle  # called when the last command being worked on has been answered
        self.inflight = 0
        self.handled = 0  # replies sent, duplicates included
        self._handlers: dict[str, Handler] = {}
        self._replies = ReplyMemory(memory)  # the sans-IO link's idempotency by command id
        self._running: dict[str, trio.Event] = {}

    def register(self, verb: str, handler: Handler, *, replace: bool = False) -> None:
        # two modules claiming one verb is a wiring mistake
        if verb in self._handlers and not replace:
            raise ValueError(f"a handler for {verb!r} is already registered")
        self._handlers[verb] = handler

    def verbs(self) -> list[str]:
        return sorted(self._handlers)

    async def dispatch(self, cmd: protocol.Command, send: Callable[[protocol.Reply], Awaitable[Any]],
                       device_id: str | None, who: str = "agent") -> None:
        """Answer ``cmd`` through ``send``; a command counts as in flight until its reply is sent."""
        self.inflight += 1
        try:
            await send(await self.reply_for(cmd, device_id, who))
            self.handled += 1
        finally:
            self.inflight -= 1
            if self.inflight == 0 and self.on_idle is not None:
                self.on_idle()

    async def reply_for(self, cmd: protocol.Command, device_id: str | None, who: str = "agent") -> protocol.Reply:
        """The reply to ``cmd``: the stored one for a repeated id, else the handler's answer."""
        if cmd.id in self._running:  # a repeat while the first still runs waits for its reply
            await self._running[cmd.id].wait()
        stored = self._replies.repeat(cmd.id)
        if stored is not None:
            return stored
        done = self._running[cmd.id] = trio.Event()
        try:
            reply = await self._execute(cmd, device_id, who)
        finally:
            del self._running[cmd.id]
            done.set()
        self.remember(cmd.id, reply)
        return reply

    def remember(self, command_id: str, reply: protocol.Reply) -> None:
        self._replies.remember(command_id, reply)

    def stored(self, command_id: str) -> protocol.Reply | None:
        return self._replies.stored(command_id)

    def forget(self) -> None:
        """A boot forgets what was in memory."""
        self._replies.forget()

    @property
    def duplicates(self) -> int:
        return self._replies.duplicates

    async def _execute(self, cmd: protocol.Command, device_id: str | None, who: str) -> protocol.Reply:
        try:
            verb = protocol.verb_of(cmd.subject)
        except protocol.ProtocolError as exc:
            return error_reply(cmd.id, "unknown_command", str(exc))
        addressee = cmd.subject.split(".", 2)[1]
        if device_id is not None and addressee != device_id:
            return error_reply(cmd.id, "wrong_device", f"this is device {device_id}, not {addressee}")
        handler = self._handlers.get(verb)
        if handler is None:
            return error_reply(cmd.id, "unknown_command", f"this agent has no command {verb!r}")
        token = _current_command.set(cmd.id)
        try:
            result = await handler(cmd.payload)
        except CommandError as exc:
            return error_reply(cmd.id, exc.code, exc.message)
        except Exception as exc:
            log.exception("%s: command %s (%s) failed", who, cmd.id, verb)
            return error_reply(cmd.id, "internal", f"{type(exc).__name__}: {exc}")
        finally:
            _current_command.reset(token)
        return protocol.Reply(id=cmd.id, ok=True, payload=result or {})


class Hooks:
    """What the device's parts ask of the agent besides commands.

    ``hello``: providers of hello fields (e.g. secretFileDigests), merged into every hello.
    ``boot``: run at every boot, in order, before the first link. ``link``: run after every welcome,
    e.g. to send what happened while there was no link. ``shutdown``: run before a reboot and when
    the agent stops, shielded from cancellation. A failing hook is logged: one broken part must not
    keep the device off the hub.
    """

    def __init__(self) -> None:
        self.hello: list[Callable[[], dict[str, Any]]] = []
        self.boot: list[Hook] = []
        self.link: list[Hook] = []
        self.shutdown: list[Hook] = []

    def hello_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        for provider in self.hello:
            fields.update(provider())
        return fields

    async def run(self, hooks: list[Hook], who: str) -> None:
        for hook in hooks:
            try:
                await hook()
            except Exception:
                log.exception("%s: hook %s failed", who, getattr(hook, "__qualname__", hook))
