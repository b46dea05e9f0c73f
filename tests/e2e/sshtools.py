"""A real OpenSSH server and client for the tunnel tests, and the hub + agent they go through.

``Sshd``: Debian's sshd on 127.0.0.1 with a host key and one authorized key generated into a tmp dir,
run as a non-daemon child (``sshd -D -e -f config``) and killed at the end. ``ssh_world`` adds a
real hub (in the test's trio run) whose organisation may open tunnels and a real ``fleethub agent``
process offering ssh to that sshd. The CLI and ssh/scp run as the operator runs them: processes.
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator

import pytest
import trio

from tests.e2e.clitools import clean_env, fleethub_exe, free_port
from tests.hubtools import Hub, device, start_hub, wait_for

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def require_openssh() -> None:
    if not (os.path.exists(SSHD) and shutil.which("ssh") and shutil.which("scp") and shutil.which("ssh-keygen")):
        pytest.skip("OpenSSH (Debian's openssh-server and openssh-client) is not installed: make system-deps")


class Sshd:
    def __init__(self, root: Path) -> None:
        require_openssh()
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.user = getpass.getuser()
        self.client_key = root / "client_key"
        self.known_hosts = root / "known_hosts"
        for key in (root / "host_key", self.client_key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        (root / "authorized_keys").write_bytes((root / "client_key.pub").read_bytes())
        config = root / "sshd_config"
        config.write_text("\n".join([
            "ListenAddress 127.0.0.1", f"Port {self.port}", f"HostKey {root / 'host_key'}",
            f"AuthorizedKeysFile {root / 'authorized_keys'}", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no", "PidFile none",
            "Subsystem sftp internal-sftp", ""]))
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
        self.log_path = root / "sshd.log"
        with self.log_path.open("wb") as log:
            self.popen = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)

    async def wait_listening(self) -> None:
        async def up() -> bool:
            if self.popen.poll() is not None:
                raise AssertionError(f"sshd exited: {self.log_path.read_text()}")
            return "Server listening" in self.log_path.read_text(errors="replace")
        await wait_for(up, timeout=10, interval=0.05)

    def ssh_options(self) -> list[str]:
        """Client options: only our key, our known_hosts, no prompts, no user config."""
        return ["-F", "/dev/null", "-i", str(self.client_key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=accept-new",
                "-o", "LogLevel=ERROR"]

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(10)


class AgentProcess:
    def __init__(self, args: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.log_path = log_path
        with log_path.open("ab") as log:
            self.popen = subprocess.Popen([fleethub_exe(), *args], stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True,
                                          env={**clean_env(), **env})

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)


@dataclass
class SshWorld:
    hub: Hub
    sshd: Sshd
    agent: AgentProcess
    device_id: str
    tmp: Path

    def cli_env(self) -> dict[str, str]:
        """The operator's environment for ``fleethub tunnel`` (and for ssh, whose ProxyCommand it is)."""
        return {**clean_env(), "FLEETHUB_ICE_ADDRESSES": "127.0.0.1", "FLEETHUB_HUB_URL": self.hub.base_url,
                "FLEETHUB_PAT_ID": self.hub.pat[0], "FLEETHUB_PAT_SECRET": self.hub.pat[1],
                "FLEETHUB_ORG_ID": self.hub.org_id}

    def proxy_command(self, *extra: str) -> str:
        # %n, the host as typed: ssh lowercases %h, and device names are case-sensitive
        return " ".join([fleethub_exe(), "tunnel", "--stdio", "--device", "%n", "--target", "ssh", *extra])

    async def ssh(self, command: str, *extra: str, host: str | None = None,
                  timeout: float = 60) -> subprocess.CompletedProcess:
        """``ssh -o ProxyCommand='fleethub tunnel --stdio --device %n --target ssh' user@HOST command``, HOST
        the device's id unless given (a name)."""
        with trio.fail_after(timeout):
            return await trio.run_process(
                ["ssh", *self.sshd.ssh_options(), "-o", f"ProxyCommand={self.proxy_command(*extra)}",
                 f"{self.sshd.user}@{host or self.device_id}", command],
                capture_stdout=True, capture_stderr=True, check=False, env=self.cli_env(),
                stdin=subprocess.DEVNULL)

    async def scp(self, source: str, dest: str, *, timeout: float = 120) -> subprocess.CompletedProcess:
        """scp through the ProxyCommand; a remote path is written ``:PATH`` (the device's)."""
        def at(p: str) -> str:
            return f"{self.sshd.user}@{self.device_id}{p}" if p.startswith(":") else p
        with trio.fail_after(timeout):
            return await trio.run_process(
                ["scp", "-q", *self.sshd.ssh_options(), "-o", f"ProxyCommand={self.proxy_command()}", at(source),
                 at(dest)], capture_stdout=True, capture_stderr=True, check=False, env=self.cli_env(),
                stdin=subprocess.DEVNULL)

    async def open_sessions(self) -> list[str]:
        rows = await self.hub.services.db.fetch("SELECT state FROM tunnel_sessions WHERE device_id = $1",
                                                uuid.UUID(self.device_id))
        return [r["state"] for r in rows if r["state"] in ("opening", "open")]


@asynccontextmanager
async def ssh_world(nursery: trio.Nursery, db_url: str, tmp: Path, *, ssh: bool = True,
                    entitled: bool = True) -> AsyncIterator[SshWorld]:
    """A hub, an sshd and an agent offering ssh (``--ssh --tunnel-target ssh=127.0.0.1:PORT``)."""
    sshd = Sshd(tmp / "sshd")
    agent: AgentProcess | None = None
    try:
        await sshd.wait_listening()
        hub = await start_hub(nursery, db_url, tmp / "hub")
        s = hub.services
        if entitled:
            await s.tunnels.store.set_entitlement(uuid.UUID(hub.org_id), {"enabled": True}, s.clock.now())
        dev_id, token = await hub.provision("ssh-dev")
        (tmp / "logs").mkdir(parents=True, exist_ok=True)
        agent = AgentProcess(["agent", "--hub", hub.base_url, "--data-dir", str(tmp / "device"),
                              *(["--ssh"] if ssh else []), "--tunnel-target", f"ssh=127.0.0.1:{sshd.port}"],
                             tmp / "logs" / "agent.log",
                             {"FLEETHUB_ICE_ADDRESSES": "127.0.0.1", "FLEETHUB_DEVICE_TOKEN": token})

        async def online() -> bool:
            if agent.popen.poll() is not None:
                raise AssertionError(f"the agent exited: {agent.log()}")
            return bool((await device(hub, dev_id)).get("online"))
        await wait_for(online, timeout=30, interval=0.1)
        yield SshWorld(hub, sshd, agent, dev_id, tmp)
    finally:
        if agent is not None:
            agent.stop()
        sshd.stop()
