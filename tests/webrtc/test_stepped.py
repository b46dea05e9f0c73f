"""webrtc/stepped.py runs a coroutine in the callback that starts it and hands it to a task only if
it waits: what ran before the wait ran at once, the rest runs in order after it, errors reach the
caller or the task, and a cancelled task cancels the coroutine where it waits."""

from __future__ import annotations

import asyncio

import pytest

from webrtc.stepped import start


def test_a_coroutine_that_never_waits_runs_to_its_end_at_once_without_a_task():
    done: list[str] = []

    async def quick() -> None:
        done.append("ran")

    async def main() -> None:
        before = len(asyncio.all_tasks())
        assert start(quick()) is None
        assert done == ["ran"] and len(asyncio.all_tasks()) == before

    asyncio.run(main())


def test_one_that_waits_runs_up_to_the_wait_at_once_and_the_rest_in_a_task():
    steps: list[str] = []

    async def main() -> None:
        gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def waits() -> str:
            steps.append("before")
            got = await gate
            steps.append(f"after {got}")
            await asyncio.sleep(0)  # and again: the task goes on as any would
            steps.append("end")
            return got

        task = start(waits())
        assert task is not None and steps == ["before"]
        gate.set_result("x")
        assert await task == "x"
        assert steps == ["before", "after x", "end"]

    asyncio.run(main())


def test_an_error_before_the_wait_is_raised_to_the_caller_and_after_it_held_by_the_task():
    async def main() -> None:
        async def fails_at_once() -> None:
            raise ValueError("now")

        with pytest.raises(ValueError, match="now"):
            start(fails_at_once())

        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def fails_later() -> None:
            await gate
            raise ValueError("later")

        task = start(fails_later())
        assert task is not None
        gate.set_result(None)
        with pytest.raises(ValueError, match="later"):
            await task

    asyncio.run(main())


def test_cancelling_the_task_cancels_the_coroutine_where_it_waits():
    cleaned: list[bool] = []

    async def main() -> None:
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def waits() -> None:
            try:
                await gate
            finally:
                cleaned.append(True)

        task = start(waits())
        assert task is not None
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert cleaned == [True] and gate.cancelled()

    asyncio.run(main())
