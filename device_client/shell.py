"""The ``shell`` tunnel target: one PTY with a login shell per ``shell`` data channel.

Off by default (``--tunnel-shell``), like ssh; the device owner picks the user it runs as
(``--tunnel-shell-user``; default: the agent's own user, and only root may pick another). The shell is
the user's login shell from the password database (``/bin/sh`` when it has none), started as a login
shell (``-sh``) in its home directory with a clean environment and TERM=xterm-256color, in a new
session whose controlling terminal is the PTY: Ctrl-C (byte 0x03) then interrupts the foreground job
through the line discipline, as on any terminal.

The bytes go through webrtc/forward.Pump, the same credit window and bounded buffering as a ``tcp``
channel; the PTY master is the Pump's transport (webrtc/stdio.Duplex over two dups of it). A resize
is a text message ``{"resize": {"cols": C, "rows": R}}`` on the same channel (TIOCSWINSZ; the kernel
sends SIGWINCH). When the channel or the session closes, every process of the shell's session gets
SIGHUP and, if still there after ``KILL_AFTER`` seconds, SIGKILL (``Shell.hangup`` says why the session); when the shell exits, reading the master
fails (EIO: no slave left open) and the Pump closes the channel.

This module holds the PTY and its session; webrtc/shell_channel.py connects one to a channel, on the
asyncio thread (webrtc/loop.py) like everything that touches a channel.
"""

from __future__ import annotations

import fcntl
import logging
import os
import pwd
import signal
import struct
import subprocess
import sys
import termios
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio  # the loop is webrtc's (webrtc/loop.py), started with the first tunnel: an idle agent has none

log = logging.getLogger("fleethub.agent.shell")

KILL_AFTER = 2.0  # seconds between SIGHUP and SIGKILL of a shell whose channel closed
MAX_SIZE = 1000  # columns or rows: a resize outside 1..MAX_SIZE is ignored
DEFAULT_SIZE = (80, 24)

# The shell must lead a new session whose controlling terminal is the PTY (fd 0). subprocess has no
# option for TIOCSCTTY and preexec_fn is unsafe in a threaded process, so an exec'd helper does it:
# util-linux's ``setsid --ctty`` where present (any user can run it), else this Python trampoline run
# by the agent's own interpreter (which another user may not be able to read: a venv under /root).
SETSID = "/usr/bin/setsid"
_TRAMPOLINE = ("import fcntl,os,sys,termios\n"
               "fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
               "os.execv(sys.argv[1], [sys.argv[2]])\n")


@dataclass(frozen=True)
class ShellUser:
    name: str
    uid: int
    gid: int
    home: str
    shell: str

    @classmethod
    def lookup(cls, name: str | None) -> "ShellUser":
        """``name`` from the password database (None: the agent's own user); ValueError if unknown."""
        try:
            entry = pwd.getpwnam(name) if name else pwd.getpwuid(os.getuid())
        except KeyError:
            raise ValueError(f"--tunnel-shell-user {name!r}: no such user") from None
        shell = entry.pw_shell if entry.pw_shell and os.access(entry.pw_shell, os.X_OK) \
            and not entry.pw_shell.endswith(("nologin", "false")) else "/bin/sh"
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir or "/", shell)


def set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def parse_resize(message: dict[str, Any]) -> tuple[int, int] | None:
    """(cols, rows) of a resize message, or None when it is not a valid one."""
    size = message.get("resize")
    if not isinstance(size, dict):
        return None
    cols, rows = size.get("cols"), size.get("rows")
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_SIZE for v in (cols, rows)):
        return None
    return cols, rows


class Shell:
    """One shell process on a PTY. ``start`` forks; ``hangup`` ends it (idempotent)."""

    def __init__(self, user: ShellUser) -> None:
        self.user = user
        self.master: int | None = None
        self.process: subprocess.Popen | None = None
        self._hung_up = False

    def start(self, cols: int = DEFAULT_SIZE[0], rows: int = DEFAULT_SIZE[1]) -> int:
        """Start the shell; returns the PTY master fd (owned by this object until ``hangup``)."""
        master, slave = os.openpty()
        try:
            set_size(master, cols, rows)
            user = self.user
            env = {"HOME": user.home, "USER": user.name, "LOGNAME": user.name, "SHELL": user.shell,
                   "TERM": "xterm-256color", "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
                   "LANG": os.environ.get("LANG", "C.UTF-8")}
            other = user.uid != os.getuid()
            cwd = user.home if os.path.isdir(user.home) else "/"
            if os.access(SETSID, os.X_OK):
                # not a process-group leader here, so setsid(1) calls setsid() itself without forking:
                # the shell keeps the pid we know, which is then its session id
                argv, new_session = [SETSID, "--ctty", user.shell, "-l"], False
            else:
                argv = [sys.executable, "-I", "-S", "-c", _TRAMPOLINE, user.shell, "-" + os.path.basename(user.shell)]
                new_session = True
            self.process = subprocess.Popen(
                argv, stdin=slave, stdout=slave, stderr=slave, close_fds=True, start_new_session=new_session,
                env=env, cwd=cwd, user=user.uid if other else None, group=user.gid if other else None,
                extra_groups=[] if other else None)
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)  # the child holds it: its exit then ends reads on the master with EIO
        self.master = master
        # reap it whenever it exits, without blocking the event loop
        threading.Thread(target=self.process.wait, name="shell-reaper", daemon=True).start()
        log.info("shell started for %s (pid %d)", self.user.name, self.process.pid)
        return master

    def resize(self, cols: int, rows: int) -> None:
        if self.master is not None:
            set_size(self.master, cols, rows)

    def hangup(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """SIGHUP to every process of the shell's session, SIGKILL later to those still there.

        The session, not the shell's process group: an interactive shell puts each job in a process
        group of its own, and not every shell passes its SIGHUP on to them (dash does not). A process
        that made a session of its own (setsid, a daemon) has left on purpose and is not followed."""
        process = self.process
        if process is None or self._hung_up:
            return
        self._hung_up = True
        _signal_session(process.pid, signal.SIGHUP)
        if loop is not None:
            loop.call_later(KILL_AFTER, _signal_session, process.pid, signal.SIGKILL)
        else:
            threading.Timer(KILL_AFTER, _signal_session, (process.pid, signal.SIGKILL)).start()


def session_members(sid: int) -> list[int]:
    """Pids of the live processes in session ``sid`` (Linux /proc; empty where it is missing)."""
    members = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return members
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        # after the command: state, ppid, pgrp, session
        if fields[0] != b"Z" and int(fields[3]) == sid:
            members.append(int(name))
    return members


def _signal_session(sid: int, sig: int) -> None:
    for pid in session_members(sid):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
