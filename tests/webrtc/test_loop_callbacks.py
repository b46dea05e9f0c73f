"""A callback the asyncio side hands to trio (webrtc/loop.to_trio) must not end the trio run when it
raises: trio treats an exception from a run_sync_soon callback as an internal error of the run."""

from __future__ import annotations

import logging
import threading

import trio

from webrtc.loop import to_trio


async def test_a_failing_peer_callback_is_logged_and_the_run_goes_on(caplog):
    seen: list[int] = []

    def callback(n: int) -> None:
        if n == 1:
            raise RuntimeError("boom in a peer callback")
        seen.append(n)

    call = to_trio(callback)
    with trio.fail_after(5), caplog.at_level(logging.ERROR, logger="fleethub.webrtc"):
        # the asyncio side calls from its own thread, as aiortc's handlers do
        caller = threading.Thread(target=lambda: (call(1), call(2)))
        caller.start()
        while not seen:
            await trio.sleep(0.01)
        caller.join()
    assert seen == [2]
    assert any("peer callback" in r.getMessage() for r in caplog.records)
