"""webrtc/connection.py on asyncio alone, as the ``fleethub tunnel`` CLI runs it (no trio in the process)."""

from __future__ import annotations

import asyncio

from webrtc import connection
from webrtc.connection import PeerConnection
from webrtc.ice import restrict_host_addresses


def test_a_peer_that_never_connected_closes_without_waiting_for_its_queue(monkeypatch):
    """A refused session (an unknown device, a hub that says no) ends with the peer's close: its SCTP
    queue holds the control channel's open, which no association will ever carry. close() used to poll
    that queue for CLOSE_FLUSH (0.5 s) before every refusal's line; it waits only on a connected one."""
    restrict_host_addresses(["127.0.0.1"])
    polls: list[float] = []
    real_sleep = asyncio.sleep

    async def counting_sleep(delay: float, *args):
        polls.append(delay)
        return await real_sleep(delay, *args)

    async def refused() -> tuple[bool, str]:
        peer = PeerConnection()
        offer = await peer.offer()
        queued = bool(peer.pc.sctp._data_channel_queue)
        monkeypatch.setattr(connection.asyncio, "sleep", counting_sleep)
        await peer.close()
        monkeypatch.setattr(connection.asyncio, "sleep", real_sleep)
        return queued, offer["sdp"]

    queued, sdp = asyncio.run(refused())
    assert "m=application" in sdp and queued  # the case: something in the queue, nothing connected
    assert 0.01 not in polls  # close()'s poll of the queue (aiortc's own waits, if any, are not its)
