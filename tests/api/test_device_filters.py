"""The device list's console filters (firmware, architecture, condition, updating, search) on a real
hub and PostgreSQL: server-side, so a page of 10,000 devices never travels to filter it."""

from __future__ import annotations

import json
import uuid

import pytest
import trio

from tests.hubtools import assert_error, start_hub


@pytest.fixture
async def hub(nursery, db_url, tmp_path):
    return await start_hub(nursery, db_url, tmp_path / "hub")


async def _names(hub, query: str) -> list[str]:
    r = await hub.call("GET", "/v1/devices?limit=100&" + query)
    assert r.status_code == 200, r.text
    return sorted(d["name"] for d in r.json()["data"])


async def test_filters_and_search(hub):
    with trio.fail_after(30):
        ids = {}
        for name in ("robot-a", "robot-b", "kiosk_1", "kiosk%2"):
            ids[name], _ = await hub.provision(name)
        s = hub.services
        set_row = ("UPDATE devices SET firmware = $2, architecture = $3, conditions = $4::jsonb, "
                   "config_status = $5 WHERE id = $1")
        await s.db.execute(set_row, uuid.UUID(ids["robot-a"]), "os 1", "aarch64",
                           json.dumps([{"type": "MemoryFault", "reason": "x"}]), "applying")
        await s.db.execute(set_row, uuid.UUID(ids["robot-b"]), "os 2", "x86_64", "[]", "applied")
        await s.db.execute(set_row, uuid.UUID(ids["kiosk_1"]), "os 1", "x86_64", "[]", "pending")
        s.stores.devices.cache.evict([uuid.UUID(i) for i in ids.values()])

        assert await _names(hub, "firmware=os%201") == ["kiosk_1", "robot-a"]
        assert await _names(hub, "architecture=x86_64") == ["kiosk_1", "robot-b"]
        assert await _names(hub, "condition=MemoryFault") == ["robot-a"]
        assert await _names(hub, "updating=true") == ["kiosk_1", "robot-a"]
        assert await _names(hub, "updating=false") == ["kiosk%2", "robot-b"]
        assert await _names(hub, "search=ROBOT") == ["robot-a", "robot-b"]
        # LIKE's wildcards are taken literally: "_" and "%" match only themselves
        assert await _names(hub, "search=kiosk_") == ["kiosk_1"]
        assert await _names(hub, "search=k%25") == ["kiosk%2"]
        assert await _names(hub, "search=robot&architecture=aarch64&updating=true") == ["robot-a"]
        r = await hub.call("GET", "/v1/devices?limit=1&page=2&search=robot")
        assert [d["name"] for d in r.json()["data"]] == ["robot-b"] and r.json()["pagination"]["total"] == 2
        assert_error(await hub.call("GET", "/v1/devices?condition=Other"), 400)
