"""The CLI's stdin and stdout as one TCP-like connection for a Pump (``fleethub tunnel --stdio``).

OpenSSH's ProxyCommand talks to its proxy over two pipes: it writes the ssh stream to our stdin and
reads the answer from our stdout. forward.Pump wants one full-duplex transport, so ``Duplex`` joins
asyncio's read-pipe transport (stdin) and write-pipe transport (stdout):

- writing, write_eof (closes stdout: ssh reads its EOF), write-buffer limits and pause/resume_writing
  go to the stdout side; pause/resume_reading and data/eof go to the stdin side;
- a pipe's read transport calls connection_lost right after eof_received; for a socket that would
  mean "gone", here it only means stdin ended, so it is passed on only with an error; the Pump then
  sends its EOF and keeps delivering the device's bytes to stdout until the channel's EOF;
- stdout lost with an error (ssh went away: EPIPE) is the connection gone.

The fds are the caller's (dups of 0 and 1, taken before anything could write to fd 1): closing them
here ends the stream for ssh.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any


class Duplex(asyncio.Transport):
    def __init__(self, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self._protocol = protocol
        self._reader: asyncio.ReadTransport | None = None
        self._writer: asyncio.WriteTransport | None = None
        self._reading_paused = False
        self._closed = False
        self._lost = False

    # ---- the Pump's view ----

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(data)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.close()  # flushes what is buffered, then closes stdout

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if self._writer is not None:
            self._writer.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._writer.get_write_buffer_size() if self._writer is not None else 0

    def pause_reading(self) -> None:
        self._reading_paused = True
        if self._reader is not None:
            self._reader.pause_reading()

    def resume_reading(self) -> None:
        self._reading_paused = False
        if self._reader is not None:
            self._reader.resume_reading()

    def is_reading(self) -> bool:
        return not self._reading_paused

    def is_closing(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for side in (self._reader, self._writer):
            if side is not None:
                side.close()

    def abort(self) -> None:
        self.close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    # ---- from the two pipe sides ----

    def _lose(self, exc: Exception | None) -> None:
        if not self._lost:
            self._lost = True
            self._protocol.connection_lost(exc)


class _ReadSide(asyncio.Protocol):
    def __init__(self, duplex: Duplex) -> None:
        self.duplex = duplex

    def data_received(self, data: bytes) -> None:
        self.duplex._protocol.data_received(data)

    def eof_received(self) -> bool | None:
        self.duplex._protocol.eof_received()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self.duplex._lose(exc)


class _WriteSide(asyncio.BaseProtocol):
    def __init__(self, duplex: Duplex) -> None:
        self.duplex = duplex

    def pause_writing(self) -> None:
        self.duplex._protocol.pause_writing()

    def resume_writing(self) -> None:
        self.duplex._protocol.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None or self.duplex._closed:
            self.duplex._lose(exc)


async def connect_stdio(protocol: asyncio.Protocol, fd_in: int, fd_out: int) -> Duplex:
    """Attach ``protocol`` to ``fd_in``/``fd_out`` (pipes, sockets or a terminal); on the asyncio side."""
    loop = asyncio.get_running_loop()
    duplex = Duplex(protocol)
    duplex._writer, _ = await loop.connect_write_pipe(lambda: _WriteSide(duplex), os.fdopen(fd_out, "wb", 0))
    # the protocol learns of its transport before the first byte of stdin can reach it
    protocol.connection_made(duplex)
    duplex._reader, _ = await loop.connect_read_pipe(lambda: _ReadSide(duplex), os.fdopen(fd_in, "rb", 0))
    if duplex._reading_paused:
        duplex._reader.pause_reading()
    return duplex
