"""Lookup by name (issue 37 item 8): ``?name=`` on the device, fleet and configuration lists is an
exact match inside the caller's organisation and visible set, so a name never reveals a resource the
list would not show; device names are not unique, and the total says how many share one."""

from __future__ import annotations

import pytest
import trio

from tests.hubtools import assert_error, start_hub


@pytest.fixture
async def hub(nursery, db_url, tmp_path):
    return await start_hub(nursery, db_url, tmp_path / "hub")


def _creds(pat: tuple[str, str], org_id: str) -> dict:
    return {"X-API-Token-ID": pat[0], "X-API-Secret-Key": pat[1], "X-Organization-ID": org_id}


async def _found(hub, path: str, name: str, headers=None, **more) -> tuple[list[str], int]:
    r = await hub.call("GET", path, params={"name": name, "limit": 10, **more}, headers=headers)
    assert r.status_code == 200, r.text
    body = r.json()
    return sorted(x["id"] for x in body["data"]), body["pagination"]["total"]


async def _fleet(hub, name: str) -> str:
    r = await hub.call("POST", "/v1/fleets", json={"name": name})
    assert r.status_code == 201, r.text
    return r.json()["data"]["id"]


async def _config(hub, name: str) -> str:
    r = await hub.call("POST", "/v1/configurations", json={"name": name, "spec": {}})
    assert r.status_code == 201, r.text
    return r.json()["data"]["id"]


async def test_device_names_are_exact_and_duplicates_are_all_listed(hub):
    with trio.fail_after(30):
        solo, _ = await hub.provision("solo")
        await hub.provision("solo-2")
        await hub.provision("SOLO")
        twins = sorted([(await hub.provision("twin"))[0], (await hub.provision("twin"))[0]])
        assert await _found(hub, "/v1/devices", "solo") == ([solo], 1)  # not solo-2, not SOLO
        assert await _found(hub, "/v1/devices", "twin") == (twins, 2)
        assert await _found(hub, "/v1/devices", "sol") == ([], 0)
        # the name filter narrows the other filters, it does not replace them
        assert await _found(hub, "/v1/devices", "solo", search="nothing-like-it") == ([], 0)
        assert_error(await hub.call("GET", "/v1/devices?name="), 400)
        assert_error(await hub.call("GET", "/v1/devices", params={"name": "x" * 201}), 400)


async def test_fleet_and_configuration_names_are_exact(hub):
    with trio.fail_after(30):
        edge = await _fleet(hub, "edge")
        await _fleet(hub, "edge-lab")
        web = await _config(hub, "web")
        await _config(hub, "web-canary")
        assert await _found(hub, "/v1/fleets", "edge") == ([edge], 1)
        assert await _found(hub, "/v1/fleets", "edg") == ([], 0)
        assert await _found(hub, "/v1/configurations", "web") == ([web], 1)
        assert await _found(hub, "/v1/configurations/summary", "web") == ([web], 1)
        assert await _found(hub, "/v1/configurations", "we") == ([], 0)
        assert_error(await hub.call("GET", "/v1/fleets?name="), 400)
        assert_error(await hub.call("GET", "/v1/configurations?name="), 400, "invalid_query")


async def test_a_name_reveals_nothing_outside_the_callers_organisation_or_visible_set(hub):
    with trio.fail_after(30):
        seen_fleet, hidden_fleet = await _fleet(hub, "seen"), await _fleet(hub, "hidden")
        seen_device, _ = await hub.provision("cam", fleet_id=seen_fleet)
        await hub.provision("cam", fleet_id=hidden_fleet)  # the same name, in a fleet the member cannot see
        await hub.provision("lonely", fleet_id=hidden_fleet)
        await _config(hub, "secret-config")

        member = await hub.new_user("member")
        mh = _creds(member, hub.org_id)
        me = (await hub.call("GET", "/v1/me", headers=mh)).json()["data"]["userId"]
        r = await hub.call("POST", "/v1/relations", json={"object_type": "fleet", "object_id": seen_fleet,
                                                          "relation": "viewer", "subject_type": "user",
                                                          "subject_id": me})
        assert r.status_code in (200, 201), r.text
        assert await _found(hub, "/v1/devices", "cam", mh) == ([seen_device], 1)  # one, not "two are named cam"
        assert await _found(hub, "/v1/devices", "lonely", mh) == ([], 0)
        assert await _found(hub, "/v1/fleets", "seen", mh) == ([seen_fleet], 1)
        assert await _found(hub, "/v1/fleets", "hidden", mh) == ([], 0)
        assert await _found(hub, "/v1/configurations", "secret-config", mh) == ([], 0)

        # another organisation's admin finds none of this organisation's names
        s = hub.services
        other = await s.stores.orgs.create_org("Other Org", s.clock.now())
        oh = _creds(await hub.new_user("admin", str(other["id"])), str(other["id"]))
        for path, name in (("/v1/devices", "cam"), ("/v1/fleets", "seen"), ("/v1/configurations", "secret-config")):
            assert await _found(hub, path, name, oh) == ([], 0)


async def test_the_openapi_document_offers_the_name_filter(hub):
    with trio.fail_after(30):
        doc = (await hub.client.get(hub.base_url + "/v1/openapi.json")).json()
        for path in ("/v1/devices", "/v1/fleets", "/v1/configurations"):
            names = {p["name"]: p for p in doc["paths"][path]["get"]["parameters"] if p["in"] == "query"}
            assert "name" in names, path
            assert names["name"].get("description"), path
