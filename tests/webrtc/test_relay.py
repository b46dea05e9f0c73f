"""A tunnel through a real TURN relay (coturn on 127.0.0.1): the device peer may use only relayed
candidates, bytes still come back unchanged, and the peer knows its selected pair is relayed (which
is what the agent's relayedBytes counts).
"""

from __future__ import annotations

import datetime as dt
import os

import trio

from hub.tunnels.turn import credential
from tests.e2e.test_turn import SECRET, coturn, wait_listening  # noqa: F401  (coturn is a fixture)
from webrtc.loop import restrict_host_addresses
from webrtc.peer import TunnelPeer

from .peers import exchange, start_echo


async def test_bytes_through_a_turn_relay(coturn, nursery):  # noqa: F811
    port, proc, log = coturn
    with trio.fail_after(60):
        await wait_listening(port, proc, log)
        restrict_host_addresses(["127.0.0.1"])
        username, password = credential(SECRET, "user:test", dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=5))
        turn = [{"urls": [f"turn:127.0.0.1:{port}?transport=udp"], "username": username, "credential": password}]
        echo_port = await start_echo(nursery)
        client = TunnelPeer()
        device = TunnelPeer(ice_servers=turn, relay_only=True)
        try:
            offer = await client.create_offer()
            answer = await device.answer(offer, target=("127.0.0.1", echo_port))
            assert " typ relay" in answer["sdp"] and " typ host" not in answer["sdp"]
            await client.set_answer(answer)
            await client.wait_control_open()
            _, listen_port = await client.listen("127.0.0.1", 0)
            payload = os.urandom(200_000)
            assert await exchange(listen_port, payload) == payload
            assert device.uses_relay() and client.uses_relay()
            assert device.candidate_pair()[0] == "relay"
            # a relayed session is not probed for bigger packets (webrtc/pmtu.py): both keep aiortc's size
            assert [getattr(p.conn.pc.sctp, "_fleethub_chunk", None) for p in (client, device)] == [None, None]
            # The far end leaves first, as a browser closing its terminal does: the device still knows
            # the path its bytes took when its session counts them after the connection is gone.
            await client.close()
            with trio.fail_after(30):
                while device.state not in ("closed", "failed"):
                    await trio.sleep(0.05)
            assert device.uses_relay() and device.candidate_pair()[0] == "relay"
        finally:
            await client.close()
            await device.close()
