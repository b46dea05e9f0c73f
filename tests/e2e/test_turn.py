"""TURN credentials against a real coturn (Debian package ``coturn``) on 127.0.0.1.

The hub hands out TURN REST shared-secret credentials in a session's ice_servers when the
organisation may relay. Here a real coturn runs with ``--use-auth-secret`` and the hub's secret; a
TURN client (aioice, which aiortc uses) allocates a relay with the credentials from a real
POST /v1/cli/tunnel/session, relays a datagram through it to a UDP peer and back, and is refused
with a wrong password, an expired username and another secret's credentials.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import socket
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest
import trio

from hub.tunnels.turn import credential
from tests.api.test_tunnels import connect, entitle, open_session, tunnel_token
from tests.hubtools import start_hub
from tests.turntools import running_coturn

SECRET = "turn-shared-" + uuid.uuid4().hex


@pytest.fixture
def coturn(tmp_path):
    with running_coturn(tmp_path, SECRET) as running:
        yield running


class _Peer(asyncio.DatagramProtocol):
    """A UDP echo peer: what the far side of a relayed path would be."""

    def connection_made(self, transport):
        self.transport = transport

    def datagram_received(self, data, addr):
        self.transport.sendto(b"echo:" + data, addr)


class _Client(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.received: asyncio.Queue = asyncio.Queue()

    def datagram_received(self, data, addr):
        self.received.put_nowait(data)


async def _allocate_and_relay(port: int, username: str, password: str) -> tuple[tuple[str, int], bytes]:
    """Allocate a relay on coturn and send one datagram through it to an echo peer; raises when the
    server refuses the credentials."""
    from aioice.turn import create_turn_endpoint

    loop = asyncio.get_running_loop()
    peer_transport, _ = await loop.create_datagram_endpoint(_Peer, local_addr=("127.0.0.1", 0))
    try:
        transport, client = await asyncio.wait_for(
            create_turn_endpoint(_Client, ("127.0.0.1", port), username, password, lifetime=60), 10)
        try:
            relayed = transport.get_extra_info("sockname")
            transport.sendto(b"hello", peer_transport.get_extra_info("sockname"))
            echoed = await asyncio.wait_for(client.received.get(), 10)
            return relayed, echoed
        finally:
            transport.close()
    finally:
        peer_transport.close()


async def relay(port: int, username: str, password: str):
    return await trio.to_thread.run_sync(lambda: asyncio.run(_allocate_and_relay(port, username, password)))


async def wait_listening(port: int, proc, log) -> None:
    """coturn has no readiness signal: it is up once it answers a STUN binding request on our port."""
    request = bytes.fromhex("0001" "0000" "2112a442") + uuid.uuid4().bytes[:12]
    # a readiness wait, not a timing claim: coturn took over 10 s to answer once on two loaded cores
    with trio.fail_after(30):
        while True:
            assert proc.poll() is None, f"turnserver exited: {Path(log.name).read_text()[-2000:]}"
            with trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                await sock.sendto(request, ("127.0.0.1", port))
                with trio.move_on_after(0.2):
                    data = await sock.recv(2048)
                    if data[:2] == bytes.fromhex("0101") and data[8:20] == request[8:20]:
                        return
            await trio.sleep(0.1)


async def test_session_turn_credentials_work_on_coturn(coturn, nursery, db_url, tmp_path):
    port, proc, log = coturn
    with trio.fail_after(60):
        await wait_listening(port, proc, log)
        hub = await start_hub(nursery, db_url, tmp_path / "hub", command_timeout=2.0,
                              turn_urls=(f"turn:127.0.0.1:{port}?transport=udp",), turn_secret=SECRET)
        await entitle(hub, relay_allowed=True)
        dev_id, _ = await connect(hub, nursery)
        token = await tunnel_token(hub)
        r = await open_session(hub, token, dev_id)
        assert r.status_code == 200, r.text
        [server] = [x for x in r.json()["data"]["ice_servers"] if x.get("username")]
        url = urlparse(server["urls"][0].split("?")[0].replace("turn:", "turn://"))
        assert (url.hostname, url.port) == ("127.0.0.1", port)
        assert SECRET not in r.text

        relayed, echoed = await relay(port, server["username"], server["credential"])
        assert relayed[0] == "127.0.0.1" and relayed[1] != port
        assert echoed == b"echo:hello"

        # Refused: a wrong password, an expired username, credentials made with another secret.
        wrong = [(server["username"], server["credential"][:-4] + "AAA="),
                 credential(SECRET, f"user:{hub.user_id}", dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)),
                 credential("not-the-secret", f"user:{hub.user_id}",
                            dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=5))]
        for username, password in wrong:
            with pytest.raises(Exception) as refused:
                await relay(port, username, password)
            assert "401" in str(refused.value) or "Unauthorized" in str(refused.value), refused.value
