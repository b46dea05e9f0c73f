"""A PostgreSQL NOTIFY that arrives while the hub shuts down (issue 14 leftovers): the LISTEN side
calls into trio with ``run_sync_soon``, where an exception would crash the whole trio run, and the
services nursery may already be closed to new tasks. Real PostgreSQL, real LISTEN connections."""

from __future__ import annotations

import logging

import trio

import hub.services
from hub.auth.signing_keys import SIGNING_KEYS_TAG, rotate
from hub.services import AUTH_CHANNEL, open_services
from hub.settings import Settings
from storage.db import Database
from tests.hubtools import wait_for


class NotifyAtClose(Database):
    """The real bridge, but as it is asked to close — after the services nursery has closed — a key
    rotation's NOTIFY arrives, and the close waits until trio has run its handler."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.heard = trio.Event()

    async def listen(self, channel, callback) -> None:
        def handled_then_heard(payload: str) -> None:
            try:
                callback(payload)
            finally:
                self.heard.set()

        await super().listen(channel, handled_then_heard)

    async def close(self) -> None:
        await self.execute("SELECT pg_notify($1, $2)", AUTH_CHANNEL, SIGNING_KEYS_TAG)
        with trio.fail_after(10):
            await self.heard.wait()
        await super().close()


async def test_a_key_rotation_notify_after_the_services_nursery_closed_is_handled_without_a_task(
        db_url, tmp_path, monkeypatch, caplog):
    # Before the fix, on_notify started the key push in the closed nursery: RuntimeError inside
    # run_sync_soon, which trio turns into a TrioInternalError that ends the run.
    monkeypatch.setattr(hub.services, "Database", NotifyAtClose)
    caplog.set_level(logging.INFO)
    with trio.fail_after(30):
        async with open_services(Settings(data_dir=tmp_path, database_url=db_url), serving=False) as s:
            before = s.access.signing_keys.kid
            rotate(tmp_path)
        assert s.db.heard.is_set() and s.stopping
        assert s.access.signing_keys.kid != before  # the reload is done; only the push to devices is not
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_a_notify_handler_that_raises_is_logged_and_the_run_goes_on(db_url, caplog):
    # Whatever a handler does wrong, it must not reach trio's run_sync_soon (that crashes the run)
    # nor the asyncio side (that would kill the LISTEN connection's reader).
    with trio.fail_after(30):
        db = Database(db_url, min_size=1, max_size=1)
        await db.open()
        try:
            heard: list[str] = []
            done = trio.Event()

            def handler(payload: str) -> None:
                heard.append(payload)
                if payload == "boom":
                    raise RuntimeError("a handler bug")
                done.set()

            await db.listen("fleethub_test", handler)
            await db.execute("SELECT pg_notify('fleethub_test', 'boom')")
            await db.execute("SELECT pg_notify('fleethub_test', 'after')")
            await done.wait()
            await trio.sleep(0.05)  # the run is still alive a moment later
            assert heard == ["boom", "after"]
            assert "fleethub_test" in caplog.text and "RuntimeError" in caplog.text
            assert db.listening()
        finally:
            await db.close()


async def test_a_burst_of_key_rotations_costs_two_pushes_not_a_task_each(db_url, tmp_path, monkeypatch):
    # Each NOTIFY used to start its own push to every connected device; now one push runs at a time
    # and what is heard meanwhile is pushed once more after it.
    pushes: list[int] = []
    release = trio.Event()
    real = hub.services.push_hub_keys

    async def held(services):  # the real push, held open until the burst is over
        pushes.append(len(pushes))
        await release.wait()
        return await real(services)

    monkeypatch.setattr(hub.services, "push_hub_keys", held)
    with trio.fail_after(30):
        async with open_services(Settings(data_dir=tmp_path, database_url=db_url), serving=False) as s:
            for _ in range(10):
                s.on_notify(SIGNING_KEYS_TAG)
            await wait_for(lambda: len(pushes) == 1)
            for _ in range(10):
                s.on_notify(SIGNING_KEYS_TAG)
            await trio.sleep(0.05)
            assert len(pushes) == 1
            release.set()
            await wait_for(lambda: not s._pushing_keys)
            assert len(pushes) == 2
