"""``DeviceContext``: all that a device part gets from the agent.

A part (secret files, configurations, the memory tester, tunnels, telemetry, registry-proxy
accounting, the link's own verbs) is handed this object at its ``attach`` and never the Agent: what a
part may do to the device is then written down here, once, and a part cannot come to depend on the
agent's insides (its link, its boot state, its private methods) by reaching through it.

Each member and why it is here:

Wiring, at attach:
    register(verb, handler)       every part answers the hub's commands of its own verbs
    add_hello_provider(fn)        a part reports its state in every hello (digests, versions, runs)
    add_boot_hook / add_link_hook / add_shutdown_hook
                                  work at each boot (re-apply, resume), at each link (resend what the
                                  hub has not acknowledged) and before a reboot or stop (stop the
                                  workload, save counters); commands.Hooks says when each runs
    on_event_too_big(kind, trim)  the memory tester's results may outgrow the link's frame limit: it
                                  says how to trim its own event (linkframes.py)
    capabilities                  the hello's capabilities, which the memory tester and the tunnel
                                  engine fill in for themselves at attach

Acting:
    send_event(kind, payload)     every part reports results, progress and usage as events
    request_reboot(reason)        the memory tester's test boot and its return to service
    request_reconnect(after, url) the hub's link.drain (linkctl.py)
    set_hub_keys(keys)            the hub's link.keys rotates the keys that sign tunnel grants

Facts, read only (properties, because they change: a welcome, a boot, a failover):
    device_id                     configurations name the device in their results; tunnel grants are
                                  checked against it
    connected                     background loops (telemetry, registry bytes) send only when linked
    hub_keys                      the keys that verify tunnel grants (welcome.hubKeys, link.keys)
    hub_url, ssl_context, device_auth()
                                  the memory tester uploads page maps over HTTP to the hub the link is
                                  on, with the device's credential
    boot_reason                   the memory tester's test boot is a boot with reason memory_test
    public_key_b64                the tunnel key a grant is bound to
    nursery                       work that outlives a link (a memory test, a tunnel session, a
                                  background loop); None while the agent is not running
    clock, data_dir, facts        time as an input; where a part keeps its state; firmware and the like
                                  a memory-test result records
    workload                      the memory tester holds and releases the workload around a run
    uptime(), statistics()        telemetry samples the agent's uptime and link counters
    who()                         the name logs give the device
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping

if TYPE_CHECKING:
    import trio

    from .shared import protocol
    from .shared.clock import Clock
    from .commands import CommandTable, Handler, Hook, Hooks
    from .agentlink import Link
    from .linkframes import Trimmer
    from .workload import Workload


class DeviceContext:
    """The agent as its parts see it (the module's docstring says why each member is here)."""

    __slots__ = ("clock", "data_dir", "facts", "capabilities", "workload", "_commands", "_hooks", "_link",
                 "_reboot", "_boot_reason", "_public_key", "_nursery", "_uptime", "_statistics", "_who")

    def __init__(self, *, clock: Clock, data_dir: Path, facts: Mapping[str, Any],
                 capabilities: protocol.Capabilities, workload: Workload, commands: CommandTable, hooks: Hooks,
                 link: Link, request_reboot: Callable[[str], None], boot_reason: Callable[[], str | None],
                 public_key_b64: Callable[[], str | None], nursery: Callable[[], trio.Nursery | None],
                 uptime: Callable[[], float], statistics: Callable[[], Any], who: Callable[[], str]) -> None:
        self.clock = clock
        self.data_dir = data_dir
        self.facts = facts
        self.capabilities = capabilities
        self.workload = workload
        self._commands = commands
        self._hooks = hooks
        self._link = link
        self._reboot = request_reboot
        self._boot_reason = boot_reason
        self._public_key = public_key_b64
        self._nursery = nursery
        self._uptime = uptime
        self._statistics = statistics
        self._who = who

    # ---- wiring ----

    def register(self, verb: str, handler: Handler, *, replace: bool = False) -> None:
        """Answer commands ``cmd.<id>.<verb>`` with ``await handler(payload)`` (a dict, or None).

        Two parts claiming one verb is a wiring mistake, so that raises unless ``replace``."""
        self._commands.register(verb, handler, replace=replace)

    def add_hello_provider(self, provider: Callable[[], dict[str, Any]]) -> None:
        """``provider()`` returns hello fields (e.g. secretFileDigests) merged into every hello."""
        self._hooks.hello.append(provider)

    def add_boot_hook(self, hook: Hook) -> None:  # see commands.Hooks for when each kind runs
        self._hooks.boot.append(hook)

    def add_link_hook(self, hook: Hook) -> None:
        self._hooks.link.append(hook)

    def add_shutdown_hook(self, hook: Hook) -> None:
        self._hooks.shutdown.append(hook)

    def on_event_too_big(self, kind: str, trimmer: Trimmer) -> None:
        self._link.frames.on_too_big(kind, trimmer)

    # ---- acting ----

    def send_event(self, kind: str, payload: dict[str, Any] | None = None) -> Awaitable[bool]:
        """Send an event now; False when there is no link (the next hello carries the state)."""
        return self._link.send_event(kind, payload)

    def request_reboot(self, reason: str = "reboot") -> None:
        """Reboot once the replies being worked on are sent; the next hello reports ``reason``."""
        self._reboot(reason)

    def request_reconnect(self, after: float, url: str | None = None) -> None:
        """Leave the link once the replies being worked on are sent and come back within ``after``
        seconds, to ``url`` when given (ValueError if it is not a hub URL)."""
        self._link.request_reconnect(after, url)

    def set_hub_keys(self, keys: Mapping[str, str]) -> None:
        self._link.hub_keys = dict(keys)

    # ---- facts ----

    @property
    def device_id(self) -> str | None:
        return self._link.device_id

    @property
    def connected(self) -> bool:
        return self._link.connected

    @property
    def hub_keys(self) -> dict[str, str]:
        return self._link.hub_keys

    @property
    def hub_url(self) -> str:
        return self._link.hub_url

    @property
    def ssl_context(self) -> Any:
        return self._link.ssl_context

    def device_auth(self) -> dict[str, str]:
        """The device's credential for the hub's device HTTP endpoints (memory-test page maps)."""
        return self._link.device_auth()

    @property
    def boot_reason(self) -> str | None:
        return self._boot_reason()

    @property
    def public_key_b64(self) -> str | None:
        return self._public_key()

    @property
    def nursery(self) -> trio.Nursery | None:
        return self._nursery()

    def uptime(self) -> float:
        return self._uptime()

    def statistics(self) -> Any:
        return self._statistics()

    def who(self) -> str:
        return self._who()
