"""What access to a device is decided on (its organisation and fleet) is kept per process without
expiry (storage/devices.py ``Devices.identities``), so a command to a warm device needs no storage
read. That is only true if every change reaches every process: these tests change devices the way
another hub process or a cascade would (plain SQL on another connection) and check the cache forgets
them, and that a read racing a write cannot put the old answer back."""

from __future__ import annotations

import datetime as dt
import uuid

import trio

from storage.db import Database
from storage.devices import CHANGED_CHANNEL, Devices
from storage.rowcache import RowCache

NOW = dt.datetime(2026, 11, 24, tzinfo=dt.timezone.utc)


async def _setup(db: Database) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID, uuid.UUID]:
    org, fleet_a, fleet_b, device = (uuid.uuid4() for _ in range(4))
    await db.execute("INSERT INTO organizations (id, name, created_at) VALUES ($1, 'o', $2)", org, NOW)
    for fleet, name in ((fleet_a, "a"), (fleet_b, "b")):
        await db.execute("INSERT INTO fleets (id, org_id, name, created_at, updated_at) VALUES ($1, $2, $3, $4, $4)",
                         fleet, org, name, NOW)
    await db.execute("INSERT INTO devices (id, org_id, fleet_id, name, tags, token_hash, created_at, updated_at) "
                     "VALUES ($1, $2, $3, 'd', '{}', $4, $5, $5)", device, org, fleet_a, uuid.uuid4().bytes, NOW)
    return org, fleet_a, fleet_b, device


async def _forgotten(devices: Devices, device: uuid.UUID) -> None:
    while devices.identities.get(device) is not None:
        await trio.sleep(0.01)


async def test_moves_deletes_and_cascades_by_another_process_reach_this_ones_cache(db_url):
    db, other = Database(db_url, min_size=1, max_size=2), Database(db_url, min_size=1, max_size=1)
    with trio.fail_after(60):
        await db.open()
        await other.open()
        try:
            devices = Devices(db)
            await db.listen(CHANGED_CHANNEL, devices.changed)
            org, fleet_a, fleet_b, device = await _setup(other)

            assert await devices.identity(org, device) == (device, fleet_a)
            reads = db.stats.count
            assert await devices.identity(org, device) == (device, fleet_a)
            assert db.stats.count == reads, "a warm identity crossed to storage"
            assert await devices.identity(uuid.uuid4(), device) is None  # another organisation's: not found

            # another process moves it: this one forgets, and the next read has the new fleet
            await other.execute("UPDATE devices SET fleet_id = $2 WHERE id = $1", device, fleet_b)
            await _forgotten(devices, device)
            assert await devices.identity(org, device) == (device, fleet_b)

            # a change that does not touch access (presence) does not evict it
            await other.execute("UPDATE devices SET last_seen_at = $2, online = true WHERE id = $1", device, NOW)
            await trio.sleep(0.3)
            assert devices.identities.get(device) is not None

            # its fleet is deleted: the cascade (ON DELETE SET NULL) notifies too
            await other.execute("DELETE FROM fleets WHERE id = $1", fleet_b)
            await _forgotten(devices, device)
            assert await devices.identity(org, device) == (device, None)

            # deleted by another process: not found here either
            await other.execute("DELETE FROM devices WHERE id = $1", device)
            await _forgotten(devices, device)
            assert await devices.identity(org, device) is None
        finally:
            await other.close()
            await db.close()


async def test_a_read_racing_an_eviction_is_not_kept():
    with trio.fail_after(5):
        cache = RowCache(ttl=float("inf"))
        seen = cache.generation
        cache.evict(["device"])  # a write committed while the read was on its way
        cache.put("device", "the row before the write", seen=seen)
        assert cache.get("device") is None
        cache.put("device", "a row read after", seen=cache.generation)
        assert cache.get("device") == "a row read after"


async def test_expired_rows_leave_without_new_reads(autojump_clock):
    """The rows read while devices connect must not stay for as long as nothing else is read."""
    with trio.fail_after(60):
        cache = RowCache(ttl=2.0)
        for k in range(100):
            cache.put(k, {"row": k})
        await trio.sleep(1)
        cache.put("late", {"row": "late"})
        async with trio.open_nursery() as nursery:
            await nursery.start(cache.keep_purged, 1.5)
            await trio.sleep(1.6)  # one purge: the 100 first rows have expired, "late" has not
            assert len(cache) == 1 and cache.get("late") is not None
            await trio.sleep(1.5)
            assert len(cache) == 0
            nursery.cancel_scope.cancel()
