"""A real coturn on 127.0.0.1 (Debian's package, installed by ``make system-deps``) with a TURN REST
shared secret, for the tests that relay tunnels through it."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from tests.ports import free_ports

TURNSERVER = "/usr/bin/turnserver"


@contextlib.contextmanager
def running_coturn(where: Path, secret: str) -> Iterator[tuple[int, subprocess.Popen, IO[str]]]:
    """(port, process, its log file open for reading) while coturn runs; stopped afterwards."""
    binary = shutil.which("turnserver") or (TURNSERVER if Path(TURNSERVER).exists() else None)
    if binary is None:
        pytest.fail("turnserver is not installed: install the Debian package coturn (make system-deps)")
    port = free_ports(2)  # its listening port and the alternative one (RFC 5780), port + 1
    relay_low = free_ports(51)  # the relay ports, --min-port to --max-port
    with open(where / "coturn.log", "w+") as log:
        proc = subprocess.Popen(
            [binary, "-n", "--no-cli", "--log-file=stdout", "--simple-log", "--listening-ip=127.0.0.1",
             "--relay-ip=127.0.0.1", f"--listening-port={port}", "--use-auth-secret",
             f"--static-auth-secret={secret}", "--realm=fleethub.test", "--no-tls", "--no-dtls",
             "--allow-loopback-peers", f"--min-port={relay_low}", f"--max-port={relay_low + 50}",
             "--no-multicast-peers", "--fingerprint", f"--pidfile={where / 'turnserver.pid'}",
             f"--db={where / 'turndb'}"], stdout=log, stderr=subprocess.STDOUT)
        try:
            yield port, proc, log
        finally:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
