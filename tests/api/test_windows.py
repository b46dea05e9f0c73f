"""Fleet update windows over REST on a real hub and PostgreSQL.

The hub runs on trio's real clock with a TestClock whose epoch is chosen so that the hub's wall time
starts at a known instant (TARGET) when the hub starts and then advances in real time: windows are
placed hours away from it (exact answers), or a couple of seconds away to watch the check flip.
"""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
import trio

from actors.machines.window import UpdateWindow, check
from device_client.shared.clock import TestClock, rfc3339
from storage.windows import UpdateWindows
from tests.hubtools import assert_error, start_hub

UTC = dt.timezone.utc
# Monday 5 Jan 2026, 11:59:58 UTC = 12:59:58 in Berlin (CET, +01:00).
TARGET = dt.datetime(2026, 1, 5, 11, 59, 58, tzinfo=UTC)

BERLIN_NIGHTS = {"enabled": True, "timezone": "Europe/Berlin", "start_time": "22:00", "end_time": "04:00",
                 "days_of_week": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]}


def clock_at(target: dt.datetime) -> TestClock:
    """Wall time = target at this moment, then real time (trio's own clock has a random offset)."""
    return TestClock(target - dt.timedelta(seconds=trio.current_time()))


def anchor(hub, target: dt.datetime) -> None:
    """Move the running hub's wall clock so that it reads ``target`` now."""
    hub.services.clock.epoch = target - dt.timedelta(seconds=trio.current_time())


@pytest.fixture
async def hub(nursery, db_url, tmp_path):
    return await start_hub(nursery, db_url, tmp_path, clock=clock_at(TARGET))


async def make_fleet(hub, name: str = "f", headers: dict | None = None) -> str:
    r = await hub.call("POST", "/v1/fleets", json={"name": name}, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()["data"]["id"]


def headers_for(pat, org_id: str) -> dict:
    return {"X-API-Token-ID": pat[0], "X-API-Secret-Key": pat[1], "X-Organization-ID": org_id}


def no_window(fleet_id: str) -> dict:
    return {"fleet_id": fleet_id, "enabled": False, "timezone": None, "start_time": None, "end_time": None,
            "days_of_week": None}


async def test_put_get_check_delete(hub):
    with trio.fail_after(30):
        fid = await make_fleet(hub)
        r = await hub.call("GET", f"/v1/fleets/{fid}/update-window")
        assert r.status_code == 200, r.text
        assert r.json() == {"data": no_window(fid)}
        r = await hub.call("GET", f"/v1/fleets/{fid}/update-window/check")
        assert r.json() == {"data": {"allowed": True, "next_window_at": None}}

        # Monday 12:59 in Berlin: closed; opens tonight at 22:00 CET = 21:00 UTC.
        r = await hub.call("PUT", f"/v1/fleets/{fid}/update-window",
                           json={**BERLIN_NIGHTS, "days_of_week": ["Friday", "Monday", "Wednesday", "Tuesday",
                                                                   "Thursday"]})
        assert r.status_code == 200, r.text
        assert r.json() == {"data": {"fleet_id": fid, **BERLIN_NIGHTS,
                                     "check": {"allowed": False, "next_window_at": "2026-01-05T21:00:00.000Z"}}}
        r = await hub.call("GET", f"/v1/fleets/{fid}/update-window")
        assert r.json() == {"data": {"fleet_id": fid, **BERLIN_NIGHTS}}
        r = await hub.call("GET", f"/v1/fleets/{fid}/update-window/check")
        assert r.status_code == 200
        assert r.json() == {"data": {"allowed": False, "next_window_at": "2026-01-05T21:00:00.000Z"}}

        # The fleet shows its window, read-only (the console's Fleets list): it changes through its own resource.
        r = await hub.call("GET", f"/v1/fleets/{fid}")
        assert r.status_code == 200 and r.json()["data"]["update_window"] == BERLIN_NIGHTS
        r = await hub.call("PATCH", f"/v1/fleets/{fid}", json={"update_window": None})
        assert r.status_code == 400

        # Replaced by a window open now: Monday 17:00–19:00 in Kolkata = 11:30–13:30 UTC.
        kolkata = {"enabled": True, "timezone": "Asia/Kolkata", "start_time": "17:00", "end_time": "19:00",
                   "days_of_week": ["Monday"]}
        r = await hub.call("PUT", f"/v1/fleets/{fid}/update-window", json=kolkata)
        assert r.json()["data"]["check"] == {"allowed": True, "next_window_at": None}
        r = await hub.call("GET", f"/v1/fleets/{fid}/update-window/check")
        assert r.json() == {"data": {"allowed": True, "next_window_at": None}}

        # Disabled: kept as sent, always allows.
        r = await hub.call("PUT", f"/v1/fleets/{fid}/update-window", json={**BERLIN_NIGHTS, "enabled": False})
        assert r.status_code == 200
        assert r.json()["data"]["check"] == {"allowed": True, "next_window_at": None}
        r = await hub.call("GET", f"/v1/fleets/{fid}/update-window")
        assert r.json() == {"data": {"fleet_id": fid, **BERLIN_NIGHTS, "enabled": False}}
        r = await hub.call("PUT", f"/v1/fleets/{fid}/update-window",
                           json={**BERLIN_NIGHTS, "enabled": False, "days_of_week": []})
        assert r.status_code == 200, r.text

        r = await hub.call("DELETE", f"/v1/fleets/{fid}/update-window")
        assert r.status_code == 200, r.text
        assert r.json() == {"data": no_window(fid)}
        r = await hub.call("GET", f"/v1/fleets/{fid}/update-window")
        assert r.json() == {"data": no_window(fid)}
        r = await hub.call("GET", f"/v1/fleets/{fid}/update-window/check")
        assert r.json() == {"data": {"allowed": True, "next_window_at": None}}
        r = await hub.call("DELETE", f"/v1/fleets/{fid}/update-window")
        assert r.status_code == 200 and r.json() == {"data": no_window(fid)}


async def test_check_follows_the_hub_clock_into_the_window(hub):
    with trio.fail_after(30):
        fid = await make_fleet(hub)
        # Opens at 13:00 Berlin = 12:00:00 UTC, two seconds from now.
        anchor(hub, TARGET)
        window = {"enabled": True, "timezone": "Europe/Berlin", "start_time": "13:00", "end_time": "13:30",
                  "days_of_week": ["Monday"]}
        r = await hub.call("PUT", f"/v1/fleets/{fid}/update-window", json=window)
        assert r.status_code == 200, r.text
        now = hub.services.clock.now()
        assert now < dt.datetime(2026, 1, 5, 12, 0, tzinfo=UTC), "the test took too long to get here"
        assert r.json()["data"]["check"] == {"allowed": False, "next_window_at": "2026-01-05T12:00:00.000Z"}
        opens = dt.datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
        await trio.sleep((opens - hub.services.clock.now()).total_seconds() + 0.05)
        r = await hub.call("GET", f"/v1/fleets/{fid}/update-window/check")
        assert r.json() == {"data": {"allowed": True, "next_window_at": None}}
        # and it agrees with the pure function at the hub's instant
        assert check(UpdateWindow.parse(window), hub.services.clock.now()).allowed


async def test_check_answer_is_the_pure_function_at_the_hub_instant(hub):
    with trio.fail_after(30):
        fid = await make_fleet(hub)
        for body in (BERLIN_NIGHTS,
                     {"enabled": True, "timezone": "Pacific/Chatham", "start_time": "03:00", "end_time": "03:00",
                      "days_of_week": ["Saturday"]},
                     {"enabled": True, "timezone": "America/New_York", "start_time": "06:00",
                      "end_time": "08:00", "days_of_week": ["Monday", "Sunday"]}):
            r = await hub.call("PUT", f"/v1/fleets/{fid}/update-window", json=body)
            assert r.status_code == 200, r.text
            before = hub.services.clock.now()
            r = await hub.call("GET", f"/v1/fleets/{fid}/update-window/check")
            after = hub.services.clock.now()
            w = UpdateWindow.parse(body)
            expected = check(w, before)
            assert expected == check(w, after)  # no boundary in between: one answer
            assert r.json() == {"data": {"allowed": expected.allowed,
                                         "next_window_at": rfc3339(expected.next_window_at)}}


BAD_VALUES = [
    ("enabled", "yes"), ("enabled", None),
    ("timezone", ""), ("timezone", "UTC+2"), ("timezone", "Europe/Atlantis"), ("timezone", "europe/berlin"),
    ("timezone", 7),
    ("start_time", "9:00"), ("start_time", "24:00"), ("start_time", "12:60"), ("start_time", "12:00:00"),
    ("end_time", "4"), ("end_time", None),
    ("days_of_week", ["monday"]), ("days_of_week", ["Monday", "Monday"]), ("days_of_week", []),
    ("days_of_week", "Monday"), ("days_of_week", ["Mon"]),
]


async def test_validation_names_the_field_and_stores_nothing(hub):
    with trio.fail_after(60):
        fid = await make_fleet(hub)
        url = f"/v1/fleets/{fid}/update-window"
        for field, value in BAD_VALUES:
            r = await hub.call("PUT", url, json={**BERLIN_NIGHTS, field: value})
            body = assert_error(r, 400, "invalid_window")
            assert body["message"].startswith(f"{field}: "), body
            assert body["details"][0]["field"] == field
        r = await hub.call("PUT", url, json={**BERLIN_NIGHTS, "note": "x"})
        body = assert_error(r, 400, "unknown_field")
        assert "note" in body["message"]
        for field in BERLIN_NIGHTS:
            partial = {k: v for k, v in BERLIN_NIGHTS.items() if k != field}
            body = assert_error(await hub.call("PUT", url, json=partial), 400, "missing_field")
            assert field in body["message"]
        assert_error(await hub.call("PUT", url, content=b"{not json", headers={**hub.headers,
                                                                                "Content-Type": "application/json"}),
                     400, "malformed_json")
        assert_error(await hub.call("PUT", url, json=["Monday"]), 400, "malformed_json")
        assert_error(await hub.call("PUT", "/v1/fleets/not-a-uuid/update-window", json=BERLIN_NIGHTS), 400,
                     "bad_uuid")
        assert_error(await hub.call("GET", "/v1/fleets/not-a-uuid/update-window/check"), 400, "bad_uuid")
        r = await hub.call("GET", url)
        assert r.json() == {"data": no_window(fid)}


async def test_unknown_and_other_organisations_fleets_are_404(hub):
    with trio.fail_after(30):
        s = hub.services
        org2 = await s.stores.orgs.create_org("Second", s.clock.now())
        other_admin = headers_for(await hub.new_user("admin", str(org2["id"])), str(org2["id"]))
        theirs = await make_fleet(hub, "theirs", headers=other_admin)
        r = await hub.call("PUT", f"/v1/fleets/{theirs}/update-window", json=BERLIN_NIGHTS, headers=other_admin)
        assert r.status_code == 200, r.text
        for fid in (theirs, str(uuid.uuid4())):
            url = f"/v1/fleets/{fid}/update-window"
            assert_error(await hub.call("GET", url), 404, "not_found")
            assert_error(await hub.call("PUT", url, json=BERLIN_NIGHTS), 404, "not_found")
            assert_error(await hub.call("DELETE", url), 404, "not_found")
            assert_error(await hub.call("GET", url + "/check"), 404, "not_found")
        # their window is untouched
        r = await hub.call("GET", f"/v1/fleets/{theirs}/update-window", headers=other_admin)
        assert r.json()["data"]["timezone"] == "Europe/Berlin"
        # the repository is scoped the same way
        repo = UpdateWindows(s.db)
        assert await repo.get(uuid.UUID(hub.org_id), uuid.UUID(theirs)) is None
        assert not await repo.set(uuid.UUID(hub.org_id), uuid.UUID(theirs), None, s.clock.now())
        assert await repo.get_many(uuid.UUID(hub.org_id), [uuid.UUID(theirs)]) == {}
        found = await repo.get(org2["id"], uuid.UUID(theirs))
        assert found.window == BERLIN_NIGHTS


async def test_relations_viewer_reads_editor_writes(hub):
    with trio.fail_after(30):
        fid = await make_fleet(hub)
        member = headers_for(await hub.new_user("member"), hub.org_id)
        url = f"/v1/fleets/{fid}/update-window"
        for method, path, body in (("GET", url, None), ("GET", url + "/check", None), ("PUT", url, BERLIN_NIGHTS),
                                   ("DELETE", url, None)):
            r = await hub.call(method, path, json=body, headers=member)
            assert_error(r, 403)
        me = (await hub.call("GET", "/v1/me", headers=member)).json()["data"]
        grant = {"object_type": "fleet", "object_id": fid, "relation": "viewer", "subject_type": "user",
                 "subject_id": me["userId"]}
        assert (await hub.call("POST", "/v1/relations", json=grant)).status_code == 201
        assert (await hub.call("GET", url, headers=member)).status_code == 200
        assert (await hub.call("GET", url + "/check", headers=member)).status_code == 200
        assert_error(await hub.call("PUT", url, json=BERLIN_NIGHTS, headers=member), 403)
        assert_error(await hub.call("DELETE", url, headers=member), 403)
        assert (await hub.call("POST", "/v1/relations", json={**grant, "relation": "editor"})).status_code == 201
        r = await hub.call("PUT", url, json=BERLIN_NIGHTS, headers=member)
        assert r.status_code == 200, r.text
        r = await hub.call("DELETE", url, headers=member)
        assert r.status_code == 200, r.text


async def test_openapi_documents_the_window_endpoints(hub):
    with trio.fail_after(30):
        r = await hub.client.get(hub.base_url + "/v1/openapi.json")
        assert r.status_code == 200
        doc = r.json()
        path = doc["paths"]["/v1/fleets/{fleetId}/update-window"]
        assert set(path) >= {"put", "get", "delete"}
        put = path["put"]
        assert "requestBody" in put
        assert {"200", "400", "403", "404"} <= set(put["responses"])
        check_path = doc["paths"]["/v1/fleets/{fleetId}/update-window/check"]["get"]
        assert "200" in check_path["responses"]
        text = r.text
        for name in ("days_of_week", "next_window_at", "start_time", "end_time", "timezone"):
            assert name in text


async def test_enabled_false_alone_switches_the_window_off_and_true_on_again(hub):
    """Issue 37 item 13: ``{"enabled": false}`` was refused for lack of a time zone. Alone, it switches
    the stored schedule off (none stored: the fleet has no window); ``{"enabled": true}`` alone switches
    it on again. Any other partial body is refused as before (test_validation_names_the_field...)."""
    with trio.fail_after(30):
        fid = await make_fleet(hub)
        url = f"/v1/fleets/{fid}/update-window"
        r = await hub.call("PUT", url, json={"enabled": False})
        assert r.status_code == 200, r.text
        assert r.json() == {"data": {**no_window(fid), "check": {"allowed": True, "next_window_at": None}}}
        assert (await hub.call("GET", url)).json() == {"data": no_window(fid)}
        shown = {k: v for k, v in no_window(fid).items() if k != "fleet_id"}  # what GET answered, PUT back
        assert (await hub.call("PUT", url, json=shown)).status_code == 200
        body = assert_error(await hub.call("PUT", url, json={"enabled": True}), 400, "missing_field")
        assert "timezone" in body["message"]

        assert (await hub.call("PUT", url, json=BERLIN_NIGHTS)).status_code == 200
        r = await hub.call("PUT", url, json={"enabled": False})
        assert r.status_code == 200, r.text
        off = {"fleet_id": fid, **BERLIN_NIGHTS, "enabled": False}
        assert r.json() == {"data": {**off, "check": {"allowed": True, "next_window_at": None}}}
        assert (await hub.call("GET", url)).json() == {"data": off}
        assert (await hub.call("GET", f"{url}/check")).json() == {"data": {"allowed": True, "next_window_at": None}}

        r = await hub.call("PUT", url, json={"enabled": True})
        assert r.status_code == 200, r.text
        expected = check(UpdateWindow.parse(BERLIN_NIGHTS), hub.services.clock.now())
        assert r.json() == {"data": {"fleet_id": fid, **BERLIN_NIGHTS,
                                     "check": {"allowed": expected.allowed,
                                               "next_window_at": rfc3339(expected.next_window_at)}}}
        assert_error(await hub.call("PUT", url, json={"enabled": "no"}), 400, "missing_field")
        assert_error(await hub.call("PUT", url, json={**shown, "enabled": True}), 400, "invalid_window")
        assert_error(await hub.call("PUT", url, json={"enabled": False, "timezone": "UTC"}), 400, "missing_field")
        assert (await hub.call("GET", url)).json() == {"data": {"fleet_id": fid, **BERLIN_NIGHTS}}
