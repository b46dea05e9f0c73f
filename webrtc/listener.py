"""The client's local TCP listener: accepts connections on the asyncio thread and gives each the
protocol its factory makes (a Pump on a new ``tcp`` channel, peer.py).

Not asyncio's ``create_server``. Python 3.11's ``Server`` accepts a socket, then makes its transport in
a task a loop turn later; when the server was closed in between (a session ended while a connection
came in), making the transport fails on an assertion (``Server._attach``) that asyncio swallows outside
debug mode, and the accepted socket is never closed. Its client then waits for ever on a tunnel that is
gone: tests/webrtc/test_peer.py's mid-transfer close hung 4 rounds in 152 on a loaded host. Here every
accepted socket is held until its transport is made, and ``close`` stops the hand-overs still under
way, so each connection is either handed over (and closed with its protocol) or closed here.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable

log = logging.getLogger("fleethub.webrtc")

BACKLOG = 100  # what asyncio's create_server uses
# accept(2) failing for want of descriptors or memory: the listener waits, as asyncio's server does,
# instead of spinning on a socket that stays readable
EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
RETRY_AFTER = 1.0  # seconds


def listening_socket(host: str, port: int) -> socket.socket:
    """A non-blocking TCP socket bound to ``host:port`` (its first address) and listening, with
    SO_REUSEADDR as asyncio's create_server sets it. Raises ``socket.gaierror`` or ``OSError``."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class Listener:
    """Accepts on ``sock`` (listening; owned from here on) until ``close``. Made and used on the asyncio
    thread.

    Accepting is a reader callback, not a task awaiting ``sock_accept``: a task cancelled just after its
    accept completed would drop the accepted socket unseen. Here each accepted socket is recorded in the
    same step as its accept, and stays recorded until its transport holds it."""

    def __init__(self, sock: socket.socket, factory: Callable[[], asyncio.Protocol]) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._factory = factory
        self._loop = asyncio.get_running_loop()
        self._taking: dict[socket.socket, asyncio.Task[None]] = {}
        self._retry: asyncio.TimerHandle | None = None
        self._closed = False
        self._loop.add_reader(sock.fileno(), self._readable)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.sock.getsockname()[:2]
        return host, port

    async def close(self) -> None:
        """Stop accepting and close the listening socket (connections still in its backlog are reset by
        the kernel); a connection accepted but not yet handed over is closed."""
        if self._closed:
            return
        self._closed = True
        if self._retry is not None:
            self._retry.cancel()
        self._loop.remove_reader(self.sock.fileno())
        self.sock.close()
        taking = list(self._taking.values())
        for task in taking:
            task.cancel()
        await asyncio.gather(*taking, return_exceptions=True)
        for conn in self._taking:  # a hand-over cancelled before its first step never ran its own close
            conn.close()
        self._taking.clear()

    def _readable(self) -> None:
        for _ in range(BACKLOG):  # at most a backlog's worth per wake-up, as asyncio's server
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:  # the client gave up while queued
                continue
            except OSError as exc:
                self._loop.remove_reader(self.sock.fileno())
                if exc.errno in EXHAUSTED:
                    log.warning("local listener %s:%d cannot accept (%s); trying again in %gs",
                                *self.address, exc.strerror, RETRY_AFTER)
                    self._retry = self._loop.call_later(RETRY_AFTER, self._resume)
                else:
                    log.warning("local listener %s:%d stopped: %s", *self.address, exc)
                return
            conn.setblocking(False)
            self._taking[conn] = asyncio.ensure_future(self._take(conn))

    def _resume(self) -> None:
        self._retry = None
        if not self._closed:
            self._loop.add_reader(self.sock.fileno(), self._readable)

    async def _take(self, conn: socket.socket) -> None:
        try:
            # makes the transport and waits for connection_made; a failure (or a cancel) once the
            # transport exists closes the socket through it
            await self._loop.connect_accepted_socket(self._factory, conn)
        except Exception as exc:  # noqa: BLE001 - one connection's failure is not the listener's
            conn.close()
            log.info("a local connection could not be taken: %s", exc)
        except BaseException:
            conn.close()
            raise
        finally:
            self._taking.pop(conn, None)
