"""``fleethub tunnel`` and ``fleethub agent`` as separate processes through a real hub: bytes to an echo
target on the device and back, two connections at once, renewal past the first grant's expiry, a
clean Ctrl-C that deletes the session, and the usage the device reports recorded by the hub.

The hub runs in the test's trio run (a real hub on 127.0.0.1 with a fresh database); both peers run
their own aiortc in their own process, ICE limited to 127.0.0.1 (FLEETHUB_ICE_ADDRESSES). Grants
live 6 s here, so the CLI renews several times within the test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from functools import partial
from pathlib import Path

import trio

from tests.e2e.clitools import clean_env, fleethub_exe, free_port
from tests.hubtools import device, start_hub, wait_for
from tests.proctools import sigstop

GRANT_SECONDS = 6.0


class Process:
    def __init__(self, name: str, args: list[str], log_dir: Path, env: dict[str, str]) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.name, self.log_path = name, log_dir / f"{name}.log"
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen([fleethub_exe(), *args], stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True,
                                          env={**clean_env(), "FLEETHUB_ICE_ADDRESSES": "127.0.0.1", **env})

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)


async def echo(stream: trio.SocketStream) -> None:
    async with stream:
        while data := await stream.receive_some(65536):
            await stream.send_all(data)
        await stream.send_eof()


async def roundtrip(port: int, payload: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    received = bytearray()
    async with stream:
        async def send() -> None:
            for i in range(0, len(payload), 32768):
                await stream.send_all(payload[i:i + 32768])
            await stream.send_eof()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            while data := await stream.receive_some(1 << 20):
                received += data
    return bytes(received)


async def test_tunnel_cli_to_agent_through_the_hub(nursery, db_url, tmp_path):
    processes: list[Process] = []
    try:
        with trio.fail_after(120):
            listeners = await nursery.start(partial(trio.serve_tcp, echo, 0, host="127.0.0.1"))
            echo_port = listeners[0].socket.getsockname()[1]
            hub = await start_hub(nursery, db_url, tmp_path / "hub", tunnel_grant_seconds=GRANT_SECONDS)
            s = hub.services
            await s.tunnels.store.set_entitlement(uuid.UUID(hub.org_id), {"enabled": True, "relay_allowed": False},
                                                  s.clock.now())
            dev_id, token = await hub.provision("tunnel-dev")
            agent = Process("agent", ["agent", "--hub", hub.base_url, "--data-dir", str(tmp_path / "device"),
                                      "--tunnel-target", f"echo=127.0.0.1:{echo_port}"],
                            tmp_path / "logs", {"FLEETHUB_DEVICE_TOKEN": token})
            processes.append(agent)
            await wait_for(lambda: device(hub, dev_id), timeout=30)
            await wait_for(_online(hub, dev_id), timeout=30)

            listen_port = free_port()
            cli = Process("cli", ["tunnel", "--hub", hub.base_url, "--device", dev_id, "--target", "echo",
                                  "--listen", f"127.0.0.1:{listen_port}"], tmp_path / "logs",
                          {"FLEETHUB_PAT_ID": hub.pat[0], "FLEETHUB_PAT_SECRET": hub.pat[1],
                           "FLEETHUB_ORG_ID": hub.org_id})
            processes.append(cli)
            await wait_for(lambda: "tunnel ready" in cli.log() or cli.popen.poll() is not None, timeout=60)
            assert "tunnel ready" in cli.log(), cli.log() + agent.log()
            assert hub.pat[1] not in cli.log()

            # bytes through the tunnel come back unchanged; two connections at once
            payloads = [os.urandom(700_000), os.urandom(250_001)]
            results: list[bytes] = [b"", b""]

            async def one(i: int) -> None:
                results[i] = await roundtrip(listen_port, payloads[i])

            async with trio.open_nursery() as both:
                both.start_soon(one, 0)
                both.start_soon(one, 1)
            assert results == payloads

            # renewal keeps the session alive past the first grant's expiry (and the next ones)
            await trio.sleep(GRANT_SECONDS * 1.7)
            assert await roundtrip(listen_port, b"still here") == b"still here"
            assert cli.popen.poll() is None, cli.log()
            rows = await s.db.fetch("SELECT id, state, opened_at, expires_at FROM tunnel_sessions "
                                    "WHERE device_id = $1", uuid.UUID(dev_id))
            assert [r["state"] for r in rows] == ["open"]
            sid = rows[0]["id"]
            # the hub renewed it: the window now ends well after the first grant's
            assert (rows[0]["expires_at"] - rows[0]["opened_at"]).total_seconds() > GRANT_SECONDS * 1.5

            # Ctrl-C: the CLI closes the channels and deletes the session on the hub
            cli.popen.send_signal(signal.SIGINT)
            await wait_for(lambda: cli.popen.poll() is not None, timeout=30)
            assert cli.popen.returncode == 0, cli.log()
            assert "tunnel closed" in cli.log()
            row = await s.db.fetchrow("SELECT state FROM tunnel_sessions WHERE id = $1", sid)
            assert row["state"] == "closed"
            stream = None
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", listen_port)
            except OSError:
                pass  # the listener is gone with the CLI
            else:
                await stream.aclose()
                raise AssertionError("the CLI's listener outlived it")
            # the device's final tunnel.usage: every byte each way, nothing relayed (host candidates)
            sent = sum(map(len, payloads)) + len(b"still here")

            async def usage_recorded() -> bool:
                r = await s.db.fetchrow("SELECT bytes_in, bytes_out, relayed_bytes, duration_seconds "
                                        "FROM tunnel_sessions WHERE id = $1", sid)
                return r["bytes_in"] == sent and r["bytes_out"] == sent and r["duration_seconds"] > GRANT_SECONDS
            await wait_for(usage_recorded, timeout=20)
            assert (await s.db.fetchval("SELECT relayed_bytes FROM tunnel_sessions WHERE id = $1", sid)) == 0
    finally:
        for proc in processes:
            proc.stop()


async def test_a_session_the_cli_does_not_renew_is_closed_by_the_device(nursery, db_url, tmp_path):
    """The CLI is frozen (SIGSTOP) so it cannot renew: the agent closes the session at the grant's
    expiry and reports it, the hub records the end; the thawed CLI learns it and exits 1."""
    processes: list[Process] = []
    try:
        with trio.fail_after(120):
            listeners = await nursery.start(partial(trio.serve_tcp, echo, 0, host="127.0.0.1"))
            echo_port = listeners[0].socket.getsockname()[1]
            hub = await start_hub(nursery, db_url, tmp_path / "hub", tunnel_grant_seconds=GRANT_SECONDS)
            s = hub.services
            await s.tunnels.store.set_entitlement(uuid.UUID(hub.org_id), {"enabled": True}, s.clock.now())
            dev_id, token = await hub.provision("tunnel-dev")
            agent = Process("agent", ["agent", "--hub", hub.base_url, "--data-dir", str(tmp_path / "device"),
                                      "--tunnel-target", f"echo=127.0.0.1:{echo_port}"],
                            tmp_path / "logs", {"FLEETHUB_DEVICE_TOKEN": token})
            processes.append(agent)
            await wait_for(_online(hub, dev_id), timeout=30)
            listen_port = free_port()
            cli = Process("cli", ["tunnel", "--hub", hub.base_url, "--device", dev_id, "--target", "echo",
                                  "--listen", f"127.0.0.1:{listen_port}"], tmp_path / "logs",
                          {"FLEETHUB_PAT_ID": hub.pat[0], "FLEETHUB_PAT_SECRET": hub.pat[1],
                           "FLEETHUB_ORG_ID": hub.org_id})
            processes.append(cli)
            await wait_for(lambda: "tunnel ready" in cli.log() or cli.popen.poll() is not None, timeout=60)
            assert "tunnel ready" in cli.log(), cli.log() + agent.log()
            assert await roundtrip(listen_port, b"ping") == b"ping"
            sigstop(cli.popen.pid)  # returns once it has stopped
            sid = await s.db.fetchval("SELECT id FROM tunnel_sessions WHERE device_id = $1", uuid.UUID(dev_id))

            async def closed_by_device() -> bool:
                row = await s.db.fetchrow("SELECT state, bytes_in FROM tunnel_sessions WHERE id = $1", sid)
                return row["state"] != "open" and row["bytes_in"] == 4
            await wait_for(closed_by_device, timeout=GRANT_SECONDS + 15)
            cli.popen.send_signal(signal.SIGCONT)
            await wait_for(lambda: cli.popen.poll() is not None, timeout=40)
            assert cli.popen.returncode == 1, cli.log()
            assert "tunnel closed" in cli.log()
    finally:
        for proc in processes:
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGCONT)
            proc.stop()


def _online(hub, dev_id: str):
    async def check() -> bool:
        return bool((await device(hub, dev_id)).get("online"))
    return check
