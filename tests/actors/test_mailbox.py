"""The actor's mailbox (actors/_runtime/mailbox.py) keeps a trio memory channel's promises for what the runtime
uses: order, a bound, waiting for room, closing, and no message lost to a cancelled receive."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from actors._runtime.mailbox import Mailbox


async def test_order_bound_and_close():
    with trio.fail_after(5):
        box = Mailbox(2)
        box.send_nowait(1)
        box.send_nowait(2)
        with pytest.raises(trio.WouldBlock):
            box.send_nowait(3)
        assert len(box) == 2
        assert [await box.receive(), await box.receive()] == [1, 2]
        box.close()
        with pytest.raises(trio.ClosedResourceError):
            box.send_nowait(4)


async def test_a_waiting_reader_gets_items_in_order_and_a_second_reader_is_refused():
    with trio.fail_after(5):
        box, got = Mailbox(4), []

        async def reader() -> None:
            for _ in range(3):
                got.append(await box.receive())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(trio.BusyResourceError):
                await box.receive()
            for item in "abc":  # the first is handed to the parked reader, the rest queue behind it
                box.send_nowait(item)
        assert got == ["a", "b", "c"]


async def test_a_cancelled_receive_loses_nothing(autojump_clock):
    with trio.fail_after(60):
        box = Mailbox(4)
        with trio.move_on_after(1):
            await box.receive()
            pytest.fail("nothing was sent")
        box.send_nowait("kept")  # the cancelled reader left: the item waits in the box
        assert len(box) == 1 and await box.receive() == "kept"


async def test_send_waits_for_room_and_close_wakes_waiting_senders():
    with trio.fail_after(5):
        box = Mailbox(1)
        box.send_nowait("first")
        sent = trio.Event()

        async def sender() -> None:
            await box.send("second")
            sent.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender)
            await trio.testing.wait_all_tasks_blocked()
            assert not sent.is_set()
            assert await box.receive() == "first"
            await sent.wait()
        assert await box.receive() == "second"

        box.send_nowait("fills it")
        refused = []

        async def blocked_sender() -> None:
            try:
                await box.send("never")
            except trio.ClosedResourceError:
                refused.append(True)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(blocked_sender)
            await trio.testing.wait_all_tasks_blocked()
            box.close()
        assert refused == [True]
