"""Memory tests of one device: a part of the DeviceActor, not an actor of its own (no mailbox, no
task): it runs inside the DeviceActor's ``receive`` and its background tasks (the machine is
actors/machines/memtest.py).

REST views ask the DeviceActor with ``StartTest``, ``CancelTest`` and ``ReadStatus``; the actor hands
them here. Commands go to the device on the bus in the actor's background tasks (so its mailbox keeps
moving while a device stops its workload) and their outcome comes back as ``_Answered``, which feeds
the machine and answers the asker. Device events (memtest.progress, .result, .health) and the hello's
memory-test facts come in through ``on_event``, ``on_link_up`` and ``on_hello``.

A device's reply error codes become the spec's errors here (actors/errors.py; the hub gives them
their statuses): busy (after a status read, so the 409
carries the running test), not_running, unsupported (also an agent that has no memtest verbs),
workload_stop_failed, invalid; anything else is internal (502).
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from actors.bus import NoResponders, RequestTimeout, Unavailable
from actors.errors import (
    AskError,
    BusUnavailable,
    Conflict,
    DeviceOffline,
    DeviceRefused,
    DeviceTimeout,
    Invalid,
    TooSoon,
    Unsupported,
)
from actors.machines import memory_fault as mf
from actors.machines import memtest as mm
from actors.runtime import ActorCrashed
from device_client.shared import verbs
from device_client.shared.clock import rfc3339
from device_client.shared.memtest_members import MemtestResult, MemtestStatus
from device_client.shared.protocol import memtest_result, memtest_status, subject

if TYPE_CHECKING:
    from actors.device import DeviceActor
    from actors.services import Services

log = logging.getLogger("fleethub.memtest")

HISTORY = 10
# A start answers after the device stopped its workload (full online): give it longer than a ping.
START_TIMEOUT_FACTOR = 3.0
JOBS_MAX = 256  # storage jobs from what one device said, waiting in order; past it health reports wait out


@dataclass(frozen=True)
class StartTest:
    """Ask: start a test with this plan (defaults applied); answered with the run's status."""
    run_id: str
    plan: dict[str, Any]


@dataclass(frozen=True)
class CancelTest:
    """Ask: cancel the running test (``run_id`` None: whatever runs); answered with its status."""
    run_id: str | None = None


@dataclass(frozen=True)
class ReadStatus:
    """Ask: the device's live memory-test status; answered with the reply payload (or an error)."""


@dataclass(frozen=True)
class _Answered:
    key: str
    verb: str
    payload: dict[str, Any] | None
    error: AskError | None
    running: dict[str, Any] | None = None  # the status read after a busy refusal


MESSAGES = (StartTest, CancelTest, ReadStatus, _Answered)


def unsupported(message: str) -> Unsupported:
    return Unsupported(message, code="unsupported")


def device_error(exc: DeviceRefused) -> AskError:
    """A device's refusal as the spec's error (the code the device sent decides)."""
    code, message = exc.code, exc.message
    if code == "not_running":
        return Conflict(message or "no memory test is running", code="not_running")
    if code in ("unsupported", "unknown_command"):
        return unsupported(message or mm.NO_MEMORY_TEST)
    if code == "workload_stop_failed":
        return DeviceRefused(message or "the workload could not be stopped; nothing was started",
                           code="workload_stop_failed")
    if code == "invalid":
        return Invalid(message or "the device refused the plan", code="invalid")
    if code == "busy":
        return Conflict(message or "a memory test is already running", code="busy")
    return DeviceRefused(message or "the device failed to handle the request", code="internal")


class DeviceMemtests:
    def __init__(self, actor: DeviceActor) -> None:
        self.actor = actor
        self.machine = mm.MemtestMachine()
        self._pending: dict[str, Any] = {}  # key -> Reply of the asker
        self._save_lock_made: trio.Lock | None = None  # made on first use (see ``_save_lock``)
        # The hello's workloadHeld (say, a test boot's hold after a failure) stands until a test
        # the hub saw running has ended.
        self._hello_held = False
        # Storage work in the device's order; made when there is some and let go when it is done: an
        # empty deque is 0.7 KiB, on every connected device (bench/memory_profile.py).
        self._jobs: deque[tuple[Any, tuple[Any, ...]]] | None = None
        self._working = False
        # A status save waits for the lock or runs: at most one more is started meanwhile, whatever
        # the device's rate of progress events (each save writes the newest status, not its own).
        self._save_queued = False
        self.health_dropped = 0  # health reports refused while JOBS_MAX jobs waited (counted, logged)

    @property
    def _save_lock(self) -> trio.Lock:
        """Orders status saves; made on first use: most devices never run a memory test."""
        if self._save_lock_made is None:
            self._save_lock_made = trio.Lock()
        return self._save_lock_made

    @property
    def s(self) -> Services:
        return self.actor.services

    # -- asks ---------------------------------------------------------------------------------------
    async def receive(self, msg: Any) -> Any:
        if isinstance(msg, _Answered):
            self._answered(msg)
            return None
        if not self.actor.machine.online:
            raise DeviceOffline("the device is not connected")
        if isinstance(msg, StartTest):
            caps = ((self.actor.facts or {}).get("capabilities") or {}).get("memoryTest") or {}
            self._handle(mm.Start(msg.run_id, msg.plan, caps))
            self._pending[msg.run_id] = self.actor.defer_reply()
            return None
        if isinstance(msg, CancelTest):
            key = "cancel:" + uuid.uuid4().hex
            effects = self._handle(mm.Cancel(msg.run_id))
            self._pending[key] = self.actor.defer_reply()
            for effect in effects:
                if isinstance(effect, mm.SendCancel):
                    payload = {"runId": effect.run_id} if effect.run_id else {}
                    self._spawn(self._command, key, "memtest.cancel", payload, self.s.settings.command_timeout)
            return None
        if isinstance(msg, ReadStatus):
            key = "status:" + uuid.uuid4().hex
            self._pending[key] = self.actor.defer_reply()
            self._spawn(self._command, key, "memtest.status", {}, self.s.settings.command_timeout)
            return None
        raise TypeError(f"not a memory-test message: {type(msg).__name__}")

    def _answered(self, msg: _Answered) -> None:
        reply = self._pending.pop(msg.key, None)
        if msg.verb == "memtest.start" and msg.error is None:
            self._handle(mm.StartAccepted((msg.payload or {}).get("status") or {}))
        elif msg.verb == "memtest.start" and self.machine.state is mm.RunState.STARTING:
            self._handle(mm.StartRefused(msg.running))
        elif msg.verb == "memtest.cancel" and msg.error is None:
            status = (msg.payload or {}).get("status")
            if status:
                self._handle(mm.Progress(status))
        elif msg.verb == "memtest.cancel" and msg.error is not None and msg.error.code == "not_running":
            self._handle(mm.Observed(None))
        elif msg.verb == "memtest.status" and msg.error is None:
            self._handle(mm.Observed(memtest_status((msg.payload or {}).get("status"))))
            health = (msg.payload or {}).get("health")
            if isinstance(health, dict):
                self._in_order(self._store_health, health)
        if reply is None:
            return
        if msg.error is not None:
            reply.fail(msg.error)
        elif msg.verb == "memtest.status":
            reply.set(msg.payload or {})
        else:
            status = (self.machine.status if msg.verb == "memtest.start"
                      else (msg.payload or {}).get("status")) or {}
            reply.set({"runId": status.get("runId"), "status": status})

    def restart(self) -> None:
        """The actor restarted: commands in flight lost their tasks; answer their askers."""
        for reply in self._pending.values():
            reply.fail(ActorCrashed(f"actor {self.actor.key} restarted while a memory-test command was in flight"))
        self._pending.clear()
        self._handle(mm.Reset())
        # its task was cancelled with the crash (actors/_runtime/background.py); what is queued goes on now
        self._working = False
        self._save_queued = False
        if self._jobs:
            self._working = True
            self._spawn(self._work_in_order)

    # -- what the device tells ----------------------------------------------------------------------
    def on_event(self, kind: str, payload: dict[str, Any]) -> None:
        # An older agent's sub-steps as phases and null verdicts read as the spec's (protocol.memtest_*),
        # then checked against the link's models (device_client/shared/memtest_members.py): a malformed
        # report is a protocol error, dropped and told to the device.
        if kind == "memtest.progress":
            status = payload.get("status", payload) if isinstance(payload.get("status"), dict) else payload
            status = memtest_status(status)
            if self._checked(verbs.check_event, kind, status):
                self._handle(mm.Progress(status))
        elif kind == "memtest.result":
            result = memtest_result(payload.get("result"))
            if self._checked(verbs.check_event, kind, {**payload, "result": result}):
                self._handle(mm.Finished(result))
        elif kind == "memtest.health":
            if self._checked(verbs.check_event, kind, payload):
                self._in_order(self._store_health, payload["health"])
        else:
            log.info("device %s: unknown memory-test event %s", self.actor.device_id, kind)

    def _checked(self, check: Callable[..., object], *args: Any) -> bool:
        """Whether what the device sent matches its model; if not, a protocol error (counted for the
        diagnosis and told to the device, as actors/device_delivery.py does for files and configs)."""
        try:
            check(*args)
        except verbs.Malformed as exc:
            self._spawn(self.actor.delivery.protocol_error, str(exc))
            return False
        return True

    def on_link_up(self, facts: dict[str, Any], *, rebooted: bool = False) -> None:
        """The hello's memory-test facts; ``rebooted``: it follows a reboot the device accepted, so an
        online test it still reports running is stale (the machine ends it interrupted)."""
        self._hello_held = bool(facts.get("workloadHeld"))
        running = memtest_status(facts.get("memoryTestRunning"))
        if running is not None and not self._checked(verbs.check_member, MemtestStatus, running,
                                                     "hello memoryTestRunning"):
            return
        self._handle(mm.Observed(running, rebooted=rebooted))

    def on_link_down(self) -> None:
        if self.machine.status is not None:
            self._queue_save()  # what a stored read shows while the device is away

    def on_hello(self, memtest: dict[str, Any] | None) -> None:
        memtest = memtest or {}
        last = memtest_result(memtest.get("lastMemoryTest"))
        if last is not None and self._checked(verbs.check_member, MemtestResult, last, "hello lastMemoryTest"):
            self._handle(mm.Finished(last))
        retired = [p for p in memtest.get("retiredPages") or [] if isinstance(p, int)]
        if retired:
            self._in_order(self._merge, retired, [], None)

    # -- effects ------------------------------------------------------------------------------------
    def _handle(self, event: object) -> list[object]:
        was = self.machine.state
        try:
            effects = self.machine.handle(event, self.s.clock.now())
        except mm.Busy as exc:
            raise Conflict(str(exc), code="busy", details=exc.status) from None
        except mm.NotRunning as exc:
            raise Conflict(str(exc), code="not_running") from None
        except mm.TooSoon as exc:
            raise TooSoon(str(exc), retry_after=exc.retry_after) from None
        except mm.Unsupported as exc:
            raise unsupported(str(exc)) from None
        if was is not mm.RunState.IDLE and self.machine.state is mm.RunState.IDLE:
            self._hello_held = False
        for effect in effects:
            self._carry_out(effect)
        return effects

    def _carry_out(self, effect: object) -> None:
        if isinstance(effect, mm.SendStart):
            timeout = self.s.settings.command_timeout * START_TIMEOUT_FACTOR
            self._spawn(self._command, effect.run_id, "memtest.start",
                        {"runId": effect.run_id, "plan": effect.plan}, timeout)
        elif isinstance(effect, mm.Publish):
            self.actor.publish("device.operation", effect.payload)
        elif isinstance(effect, mm.SaveStatus):
            self._queue_save()
        elif isinstance(effect, mm.StoreResult):
            self._in_order(self._store_result, effect.result)

    @property
    def workload_held(self) -> bool:
        """A test holds the device's workload (rollouts defer it); the DeviceActor folds this into
        its facts, this half never writes them."""
        return self.machine.workload_held or self._hello_held

    @property
    def running(self) -> dict[str, Any] | None:
        return self.machine.running

    def _in_order(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Storage work from what the device said, done one job at a time in the order it said it:
        a health report's retired pages and the next result's verdict decide MemoryFault together,
        and trio runs spawned tasks in no promised order."""
        if self._jobs is None:
            self._jobs = deque()
        if len(self._jobs) >= JOBS_MAX and fn == self._store_health:
            # A device reporting health faster than storage takes it: its newer reports say as much
            # (retired pages are merged, never removed), so this one is counted and left out. Results
            # are never left out: the device re-sends them until the hub acknowledges.
            self.health_dropped += 1
            if self.health_dropped == 1 or self.health_dropped % 1000 == 0:
                log.warning("device %s: %d memory-test health reports left out (%d jobs wait for storage)",
                            self.actor.device_id, self.health_dropped, len(self._jobs))
            return
        self._jobs.append((fn, args))
        if not self._working:
            self._working = True
            self._spawn(self._work_in_order)

    async def _work_in_order(self) -> None:
        try:
            while self._jobs:
                fn, args = self._jobs.popleft()
                try:
                    await fn(*args)
                except Exception:
                    # as _spawn: the device re-sends results until acknowledged
                    log.exception("device %s: %s failed", self.actor.device_id, getattr(fn, "__name__", fn))
        finally:
            self._working = False
            if not self._jobs:
                self._jobs = None  # nothing waits: let the deque go (a crash keeps what is queued)

    def _spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        async def guarded() -> None:
            try:
                await fn(*args)
            except Exception:
                # Storage trouble must not crash the actor in a loop; the device re-sends results
                # until acknowledged, and the next status change writes the status again.
                log.exception("device %s: %s failed", self.actor.device_id, getattr(fn, "__name__", fn))

        self.actor.tasks.start_soon(guarded)

    async def _request(self, verb: str, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        try:
            return await self.s.bus.request(subject(str(self.actor.device_id), verb), payload, timeout=timeout)
        except NoResponders:
            raise DeviceOffline("the device is not connected") from None
        except RequestTimeout:
            raise DeviceTimeout("the device did not answer in time") from None
        except Unavailable:
            raise BusUnavailable("the device's hub node cannot be reached now (the cluster's NATS is down or stalled)") from None
        except DeviceRefused as exc:
            raise device_error(exc) from None

    async def _command(self, key: str, verb: str, payload: dict[str, Any], timeout: float) -> None:
        running = None
        answer: dict[str, Any] | None = None
        error: AskError | None = None
        try:
            answer = await self._request(verb, payload, timeout)
            await self._check_answer(verb, answer)
            if verb == "memtest.start":
                status = {"runId": key, "plan": payload["plan"], **(answer.get("status") or {})}
                try:
                    await self._save(status)  # accepted starts are on record before the 202
                except Exception:
                    log.exception("device %s: the status of run %s was not stored", self.actor.device_id, key)
        except AskError as exc:
            error = exc
            if verb == "memtest.start" and exc.code == "busy":
                running = await self._running_status()
                exc.details = running
        except Exception:
            # A bug, not the device's answer: the asker hears now rather than at its timeout.
            await self.actor.post(_Answered(key, verb, None, AskError("internal error"), None))
            raise
        await self.actor.post(_Answered(key, verb, answer, error, running))

    async def _check_answer(self, verb: str, answer: dict[str, Any]) -> None:
        """The reply read as the spec's (an older agent's phases and verdicts) and checked against the
        verb's model: a malformed one is a protocol error, and the caller gets a device error."""
        answer = dict(answer or {})
        if isinstance(answer.get("status"), dict):
            answer["status"] = memtest_status(answer["status"])
        if isinstance(answer.get("history"), list):
            answer["history"] = [memtest_result(r) for r in answer["history"]]
        try:
            verbs.check_reply(verb, answer)
        except verbs.Malformed as exc:
            await self.actor.delivery.protocol_error(str(exc))
            raise DeviceRefused(f"the device's answer was malformed ({exc})"[:500], code="internal") from None

    async def _running_status(self) -> dict[str, Any] | None:
        """After the device said busy: what runs, for the 409 body (None if the read fails)."""
        try:
            answer = await self._request("memtest.status", {}, self.s.settings.command_timeout)
            await self._check_answer("memtest.status", answer)
        except AskError:
            return None
        return memtest_status(answer.get("status"))

    # -- storage ------------------------------------------------------------------------------------
    async def _save(self, status: dict[str, Any]) -> None:
        async with self._save_lock:
            await self.s.stores.memtests.save_status(self.actor.org_id, self.actor.device_id, status, self.s.clock.now())

    def _queue_save(self) -> None:
        if not self._save_queued:
            self._save_queued = True
            self._spawn(self._save_status)

    async def _save_status(self) -> None:
        async with self._save_lock:
            self._save_queued = False  # a change from here on needs a save of its own
            if self.machine.status is not None:  # the newest when the lock frees, not an old copy
                status = self.machine.status
                await self.s.stores.memtests.save_status(self.actor.org_id, self.actor.device_id, status,
                                                  self.s.clock.now())

    async def _store_health(self, health: dict[str, Any]) -> None:
        s = self.s
        await s.stores.memtests.save_health(self.actor.org_id, self.actor.device_id, health, s.clock.now())
        # The device's retired list: "retired" beside a count in "retiredPages", or the list itself.
        retired = health.get("retired") if isinstance(health.get("retired"), list) else health.get("retiredPages")
        if isinstance(retired, list) and retired:
            await self._merge([p for p in retired if isinstance(p, int)], [], None)

    async def _store_result(self, result: dict[str, Any]) -> None:
        s = self.s
        await s.stores.memtests.save_result(self.actor.org_id, self.actor.device_id, result, s.clock.now())
        complete = result.get("outcome") in ("pass", "fail")
        retired = [p for p in result.get("retired") or [] if isinstance(p, int)]
        await self._merge(retired, sorted(mf.bad_pages(result)), result.get("verdict") if complete else None)
        try:
            await self._request("memtest.ack", {"runIds": [str(result["runId"])]}, s.settings.command_timeout)
        except AskError as exc:
            # Stored already: the device sends it again at its next link and is acknowledged then.
            log.info("device %s: memtest.ack not delivered: %s", self.actor.device_id, exc.code)

    async def _merge(self, retired: list[int], bad: list[int], verdict: str | None) -> None:
        def rule(retired_count: int, bad_count: int, v: str | None) -> dict[str, Any] | None:
            return mf.memory_fault(retired=retired_count, bad_bytes=bad_count * mf.PAGE_SIZE, verdict=v)

        await self.s.stores.memtests.merge_memory(self.actor.org_id, self.actor.device_id, retired=retired, bad=bad,
                                           verdict=verdict, rule=rule, since=rfc3339(self.s.clock.now()))
