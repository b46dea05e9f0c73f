"""Authentication, organisation context, roles and tenancy against a real hub and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
import trio

from tests.hubtools import assert_error, start_hub, wait_for


@pytest.fixture
async def hub(nursery, db_url, tmp_path):
    return await start_hub(nursery, db_url, tmp_path)


def creds(pat: tuple[str, str], org_id: str | None) -> dict[str, str]:
    h = {"X-API-Token-ID": pat[0], "X-API-Secret-Key": pat[1]}
    if org_id is not None:
        h["X-Organization-ID"] = org_id
    return h


async def test_no_or_wrong_credentials_are_401(hub):
    with trio.fail_after(20):
        pat_id, secret = hub.pat
        cases = [
            {},  # nothing
            {"X-Organization-ID": hub.org_id},  # org but no token
            creds((pat_id, secret + "x"), hub.org_id),  # wrong secret
            creds((pat_id, "pat_secret_that_does_not_exist"), hub.org_id),
            creds(("pat_someoneelse", secret), hub.org_id),  # id does not match the secret
            {"Authorization": "Bearer nope", "X-Organization-ID": hub.org_id},
            {"Authorization": f"Basic {secret}", "X-Organization-ID": hub.org_id},  # not a bearer
            {"Authorization": "Bearer", "X-Organization-ID": hub.org_id},
        ]
        for headers in cases:
            r = await hub.call("GET", "/v1/devices", headers=headers)
            assert_error(r, 401, "unauthenticated")
        # a second user's secret with the first user's token id
        other_id, other_secret = await hub.new_user("admin")
        r = await hub.call("GET", "/v1/devices", headers=creds((pat_id, other_secret), hub.org_id))
        assert_error(r, 401, "unauthenticated")
        r = await hub.call("GET", "/v1/devices", headers=creds((other_id, other_secret), hub.org_id))
        assert r.status_code == 200
        # wrong credentials learn nothing about the org header
        r = await hub.call("GET", "/v1/devices", headers=creds((pat_id, "bad"), None))
        assert_error(r, 401)
        r = await hub.call("GET", "/v1/devices", headers=creds((pat_id, "bad"), "not-a-uuid"))
        assert_error(r, 401)


async def test_both_header_forms_work(hub):
    with trio.fail_after(20):
        pat_id, secret = hub.pat
        r = await hub.call("GET", "/v1/devices", headers=creds(hub.pat, hub.org_id))
        assert r.status_code == 200, r.text
        r = await hub.call("GET", "/v1/devices",
                           headers={"Authorization": f"Bearer {secret}", "X-Organization-ID": hub.org_id})
        assert r.status_code == 200, r.text
        r = await hub.call("GET", "/v1/devices",
                           headers={"authorization": f"bearer {secret}", "X-Organization-ID": hub.org_id})
        assert r.status_code == 200, r.text
        # the bearer form can mutate too
        r = await hub.call("POST", "/v1/devices", json={"name": "via-bearer"},
                           headers={"Authorization": f"Bearer {secret}", "X-Organization-ID": hub.org_id})
        assert r.status_code == 201, r.text


async def test_organisation_header(hub):
    with trio.fail_after(20):
        r = await hub.call("GET", "/v1/devices", headers=creds(hub.pat, None))
        body = assert_error(r, 400)
        assert "X-Organization-ID" in body["message"]
        for bad in ("not-a-uuid", "1234", "' OR 1=1 --"):
            r = await hub.call("GET", "/v1/devices", headers=creds(hub.pat, bad))
            assert_error(r, 400)
        # an org that exists but the user is not a member of, and one that does not exist
        other = await hub.services.stores.orgs.create_org("Other Org", hub.services.clock.now())
        for org_id in (str(other["id"]), str(uuid.uuid4())):
            r = await hub.call("GET", "/v1/devices", headers=creds(hub.pat, org_id))
            assert_error(r, 403, "forbidden")
        # PAT management is the caller's own and needs no org
        r = await hub.call("GET", "/v1/pats", headers=creds(hub.pat, None))
        assert r.status_code == 200, r.text


async def test_pat_secret_shown_once_and_both_forms_work_for_it(hub):
    with trio.fail_after(20):
        r = await hub.call("POST", "/v1/pats", json={"description": "ci"}, headers=creds(hub.pat, None))
        assert r.status_code == 201, r.text
        created = r.json()["data"]
        assert created["id"].startswith("pat_") and created["description"] == "ci"
        assert len(created["secret"]) >= 32
        r = await hub.call("GET", "/v1/pats", headers=creds(hub.pat, None))
        listed = r.json()["data"]
        assert {p["id"] for p in listed} == {hub.pat[0], created["id"]}
        assert all("secret" not in p and "secret_hash" not in p for p in listed)
        assert created["secret"] not in r.text
        new = (created["id"], created["secret"])
        r = await hub.call("GET", "/v1/devices", headers=creds(new, hub.org_id))
        assert r.status_code == 200
        r = await hub.call("GET", "/v1/devices",
                           headers={"Authorization": f"Bearer {new[1]}", "X-Organization-ID": hub.org_id})
        assert r.status_code == 200


async def test_pat_create_rejects_past_or_naive_expiry(hub):
    with trio.fail_after(20):
        past = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=1)).isoformat()
        r = await hub.call("POST", "/v1/pats", json={"expires_at": past}, headers=creds(hub.pat, None))
        assert_error(r, 400)
        naive = (dt.datetime.now() + dt.timedelta(days=1)).replace(tzinfo=None).isoformat()
        r = await hub.call("POST", "/v1/pats", json={"expires_at": naive}, headers=creds(hub.pat, None))
        assert_error(r, 400)
        r = await hub.call("POST", "/v1/pats", json={"expires_at": "tomorrow"}, headers=creds(hub.pat, None))
        assert_error(r, 400)


async def test_expired_pat_is_401(hub):
    with trio.fail_after(20):
        expires = hub.services.clock.now() + dt.timedelta(seconds=1)
        r = await hub.call("POST", "/v1/pats", json={"expires_at": expires.isoformat()},
                           headers=creds(hub.pat, None))
        assert r.status_code == 201, r.text
        short = (r.json()["data"]["id"], r.json()["data"]["secret"])
        assert r.json()["data"]["expires_at"] is not None
        r = await hub.call("GET", "/v1/devices", headers=creds(short, hub.org_id))
        assert r.status_code == 200, "valid until it expires"

        async def expired() -> bool:
            r = await hub.call("GET", "/v1/devices", headers=creds(short, hub.org_id))
            return r.status_code == 401

        await wait_for(expired, timeout=5, interval=0.1)
        assert hub.services.clock.now() >= expires
        for headers in (creds(short, hub.org_id),
                        {"Authorization": f"Bearer {short[1]}", "X-Organization-ID": hub.org_id},
                        creds(short, None)):
            r = await hub.call("GET", "/v1/pats", headers=headers)
            assert_error(r, 401, "unauthenticated")
        # the long-lived PAT is unaffected
        r = await hub.call("GET", "/v1/devices")
        assert r.status_code == 200


async def test_deleting_a_pat_revokes_it_at_once(hub):
    with trio.fail_after(20):
        r = await hub.call("POST", "/v1/pats", json={}, headers=creds(hub.pat, None))
        victim = (r.json()["data"]["id"], r.json()["data"]["secret"])
        r = await hub.call("GET", "/v1/devices", headers=creds(victim, hub.org_id))
        assert r.status_code == 200
        r = await hub.call("DELETE", f"/v1/pats/{victim[0]}", headers=creds(hub.pat, None))
        assert r.status_code == 200, r.text
        assert r.json()["data"] == {"id": victim[0], "deleted": True}
        r = await hub.call("GET", "/v1/devices", headers=creds(victim, hub.org_id))
        assert_error(r, 401, "unauthenticated")
        r = await hub.call("DELETE", f"/v1/pats/{victim[0]}", headers=creds(hub.pat, None))
        assert_error(r, 404, "not_found")
        r = await hub.call("GET", "/v1/pats", headers=creds(hub.pat, None))
        assert [p["id"] for p in r.json()["data"]] == [hub.pat[0]]
        # a PAT can delete itself; the next request with it is refused
        r = await hub.call("DELETE", f"/v1/pats/{hub.pat[0]}", headers=creds(hub.pat, None))
        assert r.status_code == 200
        r = await hub.call("GET", "/v1/devices")
        assert_error(r, 401)


async def test_cannot_delete_another_users_pat(hub):
    with trio.fail_after(20):
        other = await hub.new_user("admin")
        r = await hub.call("DELETE", f"/v1/pats/{hub.pat[0]}", headers=creds(other, None))
        assert_error(r, 404, "not_found")
        r = await hub.call("GET", "/v1/devices")
        assert r.status_code == 200, "the owner's PAT still works"
        r = await hub.call("GET", "/v1/pats", headers=creds(other, None))
        assert [p["id"] for p in r.json()["data"]] == [other[0]], "each user lists only their own"


async def test_member_reads_but_cannot_mutate(hub):
    """A member who may view a fleet (DESIGN.md section 8: members hold their permitted fleets)."""
    with trio.fail_after(20):
        r = await hub.call("POST", "/v1/fleets", json={"name": "f1"})
        fleet_id = r.json()["data"]["id"]
        dev_id, _ = await hub.provision("existing", fleet_id=fleet_id)
        member = creds(await hub.new_user("member"), hub.org_id)
        me = (await hub.call("GET", "/v1/me", headers=member)).json()["data"]
        r = await hub.call("POST", "/v1/relations", json={
            "object_type": "fleet", "object_id": fleet_id, "relation": "viewer", "subject_type": "user",
            "subject_id": me["userId"]})
        assert r.status_code == 201, r.text

        for path in ("/v1/devices", f"/v1/devices/{dev_id}", "/v1/fleets", f"/v1/fleets/{fleet_id}"):
            r = await hub.call("GET", path, headers=member)
            assert r.status_code == 200, (path, r.text)
        r = await hub.call("GET", "/v1/devices", headers=member)
        assert [d["id"] for d in r.json()["data"]] == [dev_id]
        mutations = [
            ("POST", "/v1/devices", {"name": "nope"}),
            ("POST", "/v1/devices", {"name": "nope", "fleet_id": fleet_id}),
            ("PATCH", f"/v1/devices/{dev_id}", {"name": "renamed"}),
            ("DELETE", f"/v1/devices/{dev_id}", None),
            ("POST", f"/v1/devices/{dev_id}/reboot", None),
            ("POST", "/v1/fleets", {"name": "nope"}),
            ("PATCH", f"/v1/fleets/{fleet_id}", {"name": "renamed"}),
        ]
        for method, path, body in mutations:
            r = await hub.call(method, path, headers=member, **({"json": body} if body is not None else {}))
            assert_error(r, 403)
        # nothing changed
        r = await hub.call("GET", f"/v1/devices/{dev_id}")
        assert r.json()["data"]["name"] == "existing"
        r = await hub.call("GET", "/v1/devices")
        assert r.json()["pagination"]["total"] == 1
        r = await hub.call("GET", f"/v1/fleets/{fleet_id}")
        assert r.json()["data"]["name"] == "f1"
        # ping changes nothing, so a viewer may send it: it gets past authorisation to the (offline) device
        r = await hub.call("POST", f"/v1/devices/{dev_id}/ping", headers=member)
        assert_error(r, 503, "device_offline")
        # a member manages their own PATs
        r = await hub.call("POST", "/v1/pats", json={"description": "mine"}, headers=member)
        assert r.status_code == 201, r.text


async def test_tenancy_other_orgs_resources_are_404_like_missing_ones(hub):
    with trio.fail_after(30):
        s = hub.services
        other_org = await s.stores.orgs.create_org("Rival", s.clock.now())
        rival = creds(await hub.new_user("admin", str(other_org["id"])), str(other_org["id"]))
        r = await hub.call("POST", "/v1/devices", json={"name": "theirs"}, headers=rival)
        assert r.status_code == 201
        their_dev = r.json()["data"]["id"]
        r = await hub.call("POST", "/v1/fleets", json={"name": "their-fleet"}, headers=rival)
        their_fleet = r.json()["data"]["id"]

        missing_dev, missing_fleet = str(uuid.uuid4()), str(uuid.uuid4())
        for method, path_t, body in [("GET", "/v1/devices/{d}", None), ("PATCH", "/v1/devices/{d}", {"name": "x"}),
                                     ("DELETE", "/v1/devices/{d}", None),
                                     ("POST", "/v1/devices/{d}/reboot", None),
                                     ("POST", "/v1/devices/{d}/ping", None),
                                     ("GET", "/v1/fleets/{f}", None), ("PATCH", "/v1/fleets/{f}", {"name": "x"})]:
            kw = {"json": body} if body is not None else {}
            foreign = await hub.call(method, path_t.format(d=their_dev, f=their_fleet), **kw)
            missing = await hub.call(method, path_t.format(d=missing_dev, f=missing_fleet), **kw)
            assert_error(foreign, 404, "not_found")
            assert_error(missing, 404, "not_found")
            assert foreign.json() == missing.json(), (method, path_t)
        # lists do not leak, and a foreign fleet cannot be referenced
        r = await hub.call("GET", "/v1/devices")
        assert r.json()["data"] == [] and r.json()["pagination"]["total"] == 0
        r = await hub.call("GET", "/v1/fleets")
        assert r.json()["data"] == []
        r = await hub.call("POST", "/v1/devices", json={"name": "mine", "fleet_id": their_fleet})
        assert_error(r, 400)
        r = await hub.call("GET", f"/v1/devices?fleet_id={their_fleet}")
        assert r.json()["data"] == []
        # the rival's device is untouched
        r = await hub.call("GET", f"/v1/devices/{their_dev}", headers=rival)
        assert r.status_code == 200 and r.json()["data"]["name"] == "theirs"
        r = await hub.call("GET", f"/v1/fleets/{their_fleet}", headers=rival)
        assert r.status_code == 200 and r.json()["data"]["name"] == "their-fleet"
        # and the other org's admin is a stranger to ours
        r = await hub.call("GET", "/v1/devices", headers={**rival, "X-Organization-ID": hub.org_id})
        assert_error(r, 403)


async def test_bad_uuid_in_path_is_400(hub):
    with trio.fail_after(20):
        for method, path, body in [("GET", "/v1/devices/xyz", None), ("PATCH", "/v1/devices/123", {"name": "a"}),
                                   ("DELETE", "/v1/devices/not-a-uuid", None),
                                   ("POST", "/v1/devices/zz/reboot", None), ("POST", "/v1/devices/zz/ping", None),
                                   ("GET", "/v1/fleets/nope", None), ("PATCH", "/v1/fleets/nope", {"name": "a"})]:
            r = await hub.call(method, path, **({"json": body} if body is not None else {}))
            assert_error(r, 400, "bad_uuid")
