"""Helpers for the SIGKILL test (tests/e2e/test_kill.py): processes with extra environment, a
workload that counts its own starts, and reading a device's data directory as the agent left it."""

from __future__ import annotations

import hashlib
import json
import socket
import socketserver
import subprocess
import threading
from pathlib import Path

from device_client.shared.paths import VOLUMES_DIR
from device_client.state import TMP_SUFFIX
from tests.e2e.clitools import Proc, clean_env, fleethub_exe

STARTS_LOG = "workload-starts.log"

# The workload of the rolled-out version: it appends the version it runs for (FLEETHUB_CONFIG_FILE is
# <data dir>/configs/<versionId>.json) to a log in its volumes directory every time it is started,
# then lives as long as the agent that started it. One line per start is what "applied once" means:
# the agent restarts the workload for every version it applies and never for a version it already
# runs. Simulated workloads run as an unprivileged account (device_client/workload.py): the volumes
# directory is theirs, the agent's data dir is not, and they may not signal the agent (kill -0), so
# the agent's liveness is read from /proc.
COUNTING_WORKLOAD = {
    "command": ["sh", "-c", 'echo "$FLEETHUB_CONFIG_FILE" >> "$FLEETHUB_VOLUMES_DIR/' + STARTS_LOG
                + '"; while [ -e "/proc/$PPID" ]; do sleep 0.5; done'],
    "healthCheck": {"graceSeconds": 1.5, "timeoutSeconds": 5},
}


class EnvProc(Proc):
    """A ``Proc`` whose environment adds ``env`` (FLEETHUB_* settings for this test) to the clean one."""

    def __init__(self, name: str, args: list[str], log_dir: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen([fleethub_exe(), *args], stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env={**clean_env(), **env},
                                          start_new_session=True)


def workload_starts(device_dir: Path) -> list[str]:
    """The version ids the device's workload was started for, in order."""
    try:
        lines = (device_dir / "root" / VOLUMES_DIR.lstrip("/") / STARTS_LOG).read_text().split()
    except FileNotFoundError:
        return []
    return [Path(line).stem for line in lines]


def temp_files(root: Path) -> list[Path]:
    """Temporary files an interrupted atomic write would leave (device_client/state.write_atomic)."""
    return [p for p in root.rglob(f"*{TMP_SUFFIX}") if p.is_file()]


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def manifest(device_dir: Path) -> dict[str, dict]:
    """path → {fileId, sha256, ...} of the secret files the agent manages (device_client/files.py)."""
    try:
        return json.loads((device_dir / "secret-files.json").read_text())
    except FileNotFoundError:
        return {}


def _memtest_state(device_dir: Path) -> dict:
    try:
        return json.loads((device_dir / "memtest.json").read_text())
    except FileNotFoundError:
        return {}


def memtest_history(device_dir: Path) -> list[dict]:
    """The memory-test results the device keeps (device_client/memtest/store.py), newest first."""
    return _memtest_state(device_dir).get("history", [])


def memtest_unacked(device_dir: Path) -> list[dict]:
    """Results the device still resends at every link because the hub has not acknowledged them."""
    return _memtest_state(device_dir).get("unacked", [])


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


class EchoServer(socketserver.ThreadingTCPServer):
    """A TCP echo service on 127.0.0.1 for a device to offer as a tunnel target."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Echo)
        self.port = self.server_address[1]
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()


def echo_roundtrip(port: int, payload: bytes, timeout: float = 10) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        received = bytearray()
        while data := s.recv(65536):
            received += data
    return bytes(received)
