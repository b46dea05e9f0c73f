"""A real nats-server (Debian's nats-server package, see Makefile system-deps) on a free 127.0.0.1 port."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

NATS_SERVER = shutil.which("nats-server") or "/usr/sbin/nats-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NatsServer:
    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"nats://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"nats-server exited with {self.proc.returncode}")
                time.sleep(0.02)
        raise RuntimeError("nats-server did not listen within 10 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@contextmanager
def running_nats() -> Iterator[NatsServer]:
    if not shutil.which("nats-server") and not shutil.os.path.exists(NATS_SERVER):
        pytest.skip("nats-server is not installed (make system-deps)")
    server = NatsServer(free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()
