"""A ``shell`` data channel joined to a PTY shell (device_client/shell.py holds the PTY and its session).

Here, not in device_client: the channel's Pump and the PTY's transport are webrtc's, and device_client,
the bottom layer, imports nothing above it. Runs on the asyncio thread (webrtc/loop.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
from typing import Any

from device_client.shell import Shell, ShellUser, parse_resize

from .stdio import connect_stdio

log = logging.getLogger("fleethub.agent.shell")


async def connect_shell(pump: Any, user: ShellUser) -> None:
    """Start a shell for ``pump`` (a forward.Pump on a ``shell`` channel) and connect them."""
    loop = asyncio.get_running_loop()
    shell = Shell(user)
    try:
        master = shell.start()
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("cannot start a shell for %s: %s", user.name, exc)
        pump.close()
        return

    def on_control(message: dict[str, Any]) -> None:
        size = parse_resize(message)
        if size is not None:
            shell.resize(*size)

    pump.on_extra = on_control
    closed = pump.on_closed

    def on_closed(p: Any) -> None:
        shell.hangup(loop)
        if closed is not None:
            closed(p)

    pump.on_closed = on_closed
    # two fds: asyncio's read and write pipe transports each close the one they own
    write_fd = os.dup(master)
    try:
        duplex = await connect_stdio(pump, master, write_fd)
    except BaseException:
        shell.hangup(loop)
        raise
    if pump._closed:  # the channel went away while the pipes were being connected
        duplex.close()
