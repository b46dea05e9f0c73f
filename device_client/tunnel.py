"""The device's tunnel configuration: what a tunnel may reach on this device, and the flags that set it.

Only configuration lives here; the tunnel verbs themselves (``tunnel.open``, ``tunnel.close``,
``tunnel.ice_restart``), the grant checks, the aiortc peer, the expiry and the ``tunnel.usage``
reports are webrtc/device_tunnel.py's. device_client is the bottom layer and imports nothing of
webrtc, so the agent does not attach them itself: its launcher passes ``webrtc.device_tunnel.attach``
as ``AgentConfig(tunnel_engine=...)`` with this ``TunnelConfig`` (docs/architecture.md, "Layers").

A tunnel's target is a name from the device's own configuration, never the hub's:

- a configured target ``NAME=HOST:PORT`` (``--tunnel-target``),
- ``ssh``: refused with ssh_disabled unless ssh is enabled (``--ssh``); goes to the configured
  ``ssh`` target, else 127.0.0.1:22,
- a TCP port number the device allows (``--tunnel-allow-port``), on 127.0.0.1,
- ``shell``: refused with shell_disabled unless enabled (``--tunnel-shell``); each ``shell`` channel
  gets its own PTY and login shell as ``--tunnel-shell-user`` (device_client/shell.py).

The hello's ``tunnelTargets`` (``TunnelConfig.hello_fields``) tells the hub which of them exist, so
it refuses any other before it asks the device.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from .commands import CommandError
from .hostport import parse_hostport
from .shell import ShellUser

SSH_DEFAULT = ("127.0.0.1", 22)
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,62}$")


@dataclass(frozen=True)
class TunnelConfig:
    """What this device lets a tunnel reach. Its own configuration: the hub cannot widen it."""

    targets: dict[str, tuple[str, int]] = field(default_factory=dict)
    allowed_ports: frozenset[int] = frozenset()
    ssh: bool = False
    shell: "ShellUser | None" = None  # the user the shell target runs as; None: the shell is off

    @classmethod
    def from_flags(cls, targets: list[str] | None, ports: list[int] | None, ssh: bool | None,
                   shell: bool = False, shell_user: str | None = None) -> "TunnelConfig":
        """From ``--tunnel-target NAME=HOST:PORT`` (repeatable), ``--tunnel-allow-port N``, ``--ssh``,
        ``--tunnel-shell [--tunnel-shell-user USER]``."""
        named: dict[str, tuple[str, int]] = {}
        for item in targets or []:
            name, sep, hostport = item.partition("=")
            if not sep or not _NAME.match(name):
                raise ValueError(f"--tunnel-target wants NAME=HOST:PORT, got {item!r}")
            named[name] = parse_hostport(hostport)
        for port in ports or []:
            if not 0 < port < 65536:
                raise ValueError(f"--tunnel-allow-port {port} is not a TCP port")
        if shell_user and not shell:
            raise ValueError("--tunnel-shell-user needs --tunnel-shell")
        if "shell" in named:
            raise ValueError("--tunnel-target: 'shell' is the name of the shell target (--tunnel-shell)")
        user = ShellUser.lookup(shell_user) if shell else None
        if user is not None and user.uid != os.getuid() and os.getuid() != 0:
            raise ValueError(f"--tunnel-shell-user {user.name}: only an agent running as root can start "
                             "a shell as another user")
        return cls(targets=named, allowed_ports=frozenset(ports or []), ssh=bool(ssh), shell=user)

    def describe(self) -> str:
        """One line for the agent's log at start: what a tunnel to this device can reach."""
        ssh = f"ssh on ({':'.join(map(str, self.targets.get('ssh', SSH_DEFAULT)))})" if self.ssh else \
            "ssh off (--ssh)"
        named = [f"{name}={host}:{port}" for name, (host, port) in sorted(self.targets.items())
                 if name != "ssh" or not self.ssh]
        ports = [f"port {port}" for port in sorted(self.allowed_ports)]
        shell = f"shell on (as {self.shell.name})" if self.shell else "shell off (--tunnel-shell)"
        return ", ".join([ssh, shell, *named, *ports])

    def resolve(self, target: str) -> "tuple[str, int] | ShellTarget":
        """Where ``target`` goes, or CommandError target_not_configured / ssh_disabled / shell_disabled."""
        if target == "shell":
            if self.shell is None:
                raise CommandError("shell_disabled", "the shell target is disabled on this device")
            return ShellTarget(self.shell)
        if target == "ssh":
            if not self.ssh:
                raise CommandError("ssh_disabled", "ssh is disabled on this device")
            return self.targets.get("ssh", SSH_DEFAULT)
        if target in self.targets:
            return self.targets[target]
        if target.isdigit() and int(target) in self.allowed_ports:
            return "127.0.0.1", int(target)
        raise CommandError("target_not_configured", f"target {target!r} is not configured on this device")

    def hello_fields(self) -> dict[str, Any]:
        # the hub refuses a target missing here before it asks the device (404 target_not_configured)
        return {"tunnelTargets": {"names": sorted(self.targets), "ports": sorted(self.allowed_ports),
                                  "ssh": self.ssh, "shell": self.shell is not None}}


def add_arguments(parser: Any) -> None:
    """The tunnel flags of ``fleethub agent`` and ``fleethub sim``."""
    import argparse

    parser.add_argument("--tunnel-target", action="append", default=[], metavar="NAME=HOST:PORT",
                        help="a TCP service tunnels may reach by NAME (repeatable)")
    parser.add_argument("--tunnel-allow-port", action="append", type=int, default=[], metavar="N",
                        help="a port on 127.0.0.1 tunnels may reach by number (repeatable)")
    parser.add_argument("--ssh", action=argparse.BooleanOptionalAction, default=False,
                        help="allow the ssh target (default: off)")
    parser.add_argument("--tunnel-shell", action=argparse.BooleanOptionalAction, default=False,
                        help="allow the shell target: a PTY with a login shell per browser terminal "
                             "(default: off)")
    parser.add_argument("--tunnel-shell-user", metavar="USER", default=None,
                        help="the user the shell target runs as (default: the agent's own user)")


@dataclass(frozen=True)
class ShellTarget:
    """Where ``shell`` goes: a login shell as ``user``, one per ``shell`` channel. Only the decision;
    joining a channel to a PTY is webrtc's (webrtc/device_tunnel.py ``peer_target``)."""

    user: ShellUser
