"""Access-control holes of issue 14 section 5, each against a real hub and PostgreSQL: login and
token-endpoint throttling, streams that end when access ends, rollout listing by relation,
invitations instead of attaching any registered user, the last admin, admin commands that reach
running hubs, and the credential rules for PATs and service-account tokens."""

from __future__ import annotations

import datetime as dt
import uuid

import httpx
import trio

from device_client.shared.clock import rfc3339

from hub.auth.passwords import hash_password
from hub.auth.sessions import LoginThrottle
from tests.hubtools import metric_value, metrics, start_hub

LOGIN = "/v1/auth/login"


async def _user_with_password(hub, email: str, password: str, role: str = "admin") -> dict:
    s = hub.services
    pw = await trio.to_thread.run_sync(hash_password, password)
    user = await s.stores.orgs.create_user(email, s.clock.now(), password_hash=pw)
    await s.stores.orgs.add_member(uuid.UUID(hub.org_id), user["id"], role, s.clock.now())
    return user


# -- login throttling ------------------------------------------------------------------------------
async def test_parallel_wrong_guesses_cannot_pass_the_login_limit(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        await _user_with_password(hub, "target@example.test", "right")
        url = hub.base_url + LOGIN
        statuses: list[int] = []

        async def guess(i: int) -> None:
            r = await hub.client.post(url, json={"email": "target@example.test", "password": f"wrong{i}"})
            statuses.append(r.status_code)

        async with trio.open_nursery() as guesses:
            for i in range(18):
                guesses.start_soon(guess, i)
        # Exactly the limit (5) reached the password check; every other guess was refused unchecked.
        assert sorted(statuses) == [401] * 5 + [429] * 13, statuses
        r = await hub.client.post(url, json={"email": "target@example.test", "password": "right"})
        assert r.status_code == 429 and int(r.headers["Retry-After"]) > 0


async def test_a_right_password_gives_its_attempt_back(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        await _user_with_password(hub, "ok@example.test", "right")
        url = hub.base_url + LOGIN
        for _ in range(8):  # more than the per-account limit, all right: none of them counts
            r = await hub.client.post(url, json={"email": "ok@example.test", "password": "right"})
            assert r.status_code == 200, r.text
        assert len(hub.services.access.login_throttle) == 0


def test_the_login_throttle_is_bounded_and_counts_what_it_drops():
    now = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    t = LoginThrottle(max_keys=6, max_failures_per_address=1000)
    for i in range(10):
        assert t.reserve(f"user{i}@example.test", "10.0.0.1", now + dt.timedelta(seconds=i)).allowed
    assert len(t) == 6  # never more than the bound
    assert t.dropped == 5  # ten accounts and one address, six kept: five live entries forgotten
    # the newest accounts are the ones kept, and they are still throttled
    for _ in range(4):
        t.reserve("user9@example.test", "10.0.0.1", now + dt.timedelta(seconds=20))
    assert not t.reserve("user9@example.test", "10.0.0.1", now + dt.timedelta(seconds=21)).allowed
    # keys whose attempts all left the window are pruned, not counted as dropped
    later = now + t.window + dt.timedelta(minutes=1)
    t.reserve("fresh@example.test", "10.0.0.2", later)
    assert len(t) == 2 and t.dropped == 5


async def test_login_throttle_size_and_drops_are_in_metrics(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        hub.services.access.login_throttle = LoginThrottle(max_keys=3)
        for i in range(4):
            r = await hub.client.post(hub.base_url + LOGIN, json={"email": f"nobody{i}@example.test",
                                                                  "password": "x"})
            assert r.status_code == 401
        text = await metrics(hub)
        assert metric_value(text, "fleethub_login_throttle_keys") == 3
        assert metric_value(text, "fleethub_login_throttle_dropped_total") == 2


# -- the OAuth token endpoint ------------------------------------------------------------------------
async def _service_account(hub, policies=(), name="ci") -> dict:
    r = await hub.call("POST", "/v1/service-accounts", json={"name": name, "policies": list(policies)})
    assert r.status_code == 201, r.text
    return r.json()["data"]


async def test_token_endpoint_throttles_guesses_per_client_id(nursery, db_url, tmp_path):
    from hub.api.oauth import PER_CLIENT

    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        sa = await _service_account(hub)
        url = hub.base_url + "/v1/oauth/token"
        form = {"grant_type": "client_credentials", "client_id": sa["client_id"]}
        statuses = []

        async def guess(i: int) -> None:
            r = await hub.client.post(url, data={**form, "client_secret": f"wrong-{i}"})
            statuses.append(r.status_code)
            assert r.headers["X-RateLimit-Limit"] and r.headers["X-RateLimit-Reset"]

        async with trio.open_nursery() as guesses:  # in parallel: counted before the secret is compared
            for i in range(PER_CLIENT + 15):
                guesses.start_soon(guess, i)
        assert sorted(statuses) == [401] * PER_CLIENT + [429] * 15
        # the right secret is refused too until the window ends: guessing gains nothing
        r = await hub.client.post(url, data={**form, "client_secret": sa["client_secret"]})
        assert r.status_code == 429, r.text
        assert r.json() == {"error": "slow_down", "error_description": r.json()["error_description"]}
        assert int(r.headers["Retry-After"]) >= 1 and r.headers["X-RateLimit-Remaining"] == "0"
        assert r.headers["Cache-Control"] == "no-store" and sa["client_secret"] not in r.text
        # Issue 31 item 8: the attacker's address was enough to lock the account out everywhere. The
        # account's own worker, on another address, still gets its token.
        async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2")) as worker:
            r = await worker.post(url, data={**form, "client_secret": sa["client_secret"]})
        assert r.status_code == 200, r.text
        # another client is not slowed down by this one's attacker
        other = await _service_account(hub, name="other")
        r = await hub.client.post(url, data={"grant_type": "client_credentials", "client_id": other["client_id"],
                                             "client_secret": other["client_secret"]})
        assert r.status_code == 200, r.text
        assert int(r.headers["X-RateLimit-Remaining"]) == PER_CLIENT - 1


async def test_token_endpoint_throttles_per_client_address(nursery, db_url, tmp_path):
    from hub.api.oauth import PER_ADDRESS

    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        url = hub.base_url + "/v1/oauth/token"
        statuses = []
        for i in range(PER_ADDRESS + 1):  # a new client id each time: only the address limit applies
            r = await hub.client.post(url, data={"grant_type": "client_credentials", "client_id": f"sa_guess{i}",
                                                 "client_secret": "x"})
            statuses.append(r.status_code)
        assert statuses == [401] * PER_ADDRESS + [429]
        r = await hub.client.post(url, data={"grant_type": "client_credentials"})  # malformed ones count too
        assert r.status_code == 429 and r.json()["error"] == "slow_down"


# -- credential rules --------------------------------------------------------------------------------
async def test_a_pat_needs_both_headers_and_the_bearer_form_stays(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        pat_id, secret = hub.pat
        org = {"X-Organization-ID": hub.org_id}
        r = await hub.call("GET", "/v1/devices", headers={**org, "X-API-Secret-Key": secret})
        assert r.status_code == 401 and r.json()["error"] == "unauthenticated"
        assert secret not in r.text
        r = await hub.call("GET", "/v1/devices", headers={**org, "X-API-Token-ID": pat_id})
        assert r.status_code == 401
        r = await hub.call("GET", "/v1/devices", headers={**org, "X-API-Token-ID": pat_id, "X-API-Secret-Key": secret})
        assert r.status_code == 200
        r = await hub.call("GET", "/v1/devices", headers={**org, "Authorization": f"Bearer {secret}"})
        assert r.status_code == 200


async def test_service_tokens_need_the_api_scope_nbf_passed_and_their_own_organisation(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        s = hub.services
        sa = await _service_account(hub, [{"relation": "viewer"}])
        sa_id, org_id, now = uuid.UUID(sa["id"]), uuid.UUID(hub.org_id), s.clock.now()
        other = await s.stores.orgs.create_org("Other", now)

        async def status(token: str, org: uuid.UUID = org_id) -> int:
            r = await hub.client.get(hub.base_url + "/v1/devices",
                                     headers={"X-Organization-ID": str(org), "Authorization": f"Bearer {token}"})
            return r.status_code

        assert await status(s.access.token_signer.issue(sa_id, org_id, now)) == 200
        # a token of another scope, signed by the hub with the API audience, is not an API token
        assert await status(s.access.token_signer.issue(sa_id, org_id, now, scope="tunnel")) == 401
        # not valid before its nbf
        claims = {"iss": "fleethub", "aud": "fleethub-api", "sub": str(sa_id), "org": str(org_id), "scope": "api",
                  "iat": int(now.timestamp()), "exp": int(now.timestamp()) + 3600,
                  "nbf": int(now.timestamp()) + 600}
        assert await status(s.access.signing_keys.sign_jwt(claims)) == 401
        assert await status(s.access.signing_keys.sign_jwt({**claims, "nbf": int(now.timestamp()) - 5})) == 200
        # a token naming an organisation the account does not belong to opens nothing there
        assert await status(s.access.token_signer.issue(sa_id, other["id"], now), other["id"]) == 401


# -- listing rollouts ----------------------------------------------------------------------------------
def _creds(pat, org_id: str) -> dict:
    return {"X-API-Token-ID": pat[0], "X-API-Secret-Key": pat[1], "X-Organization-ID": org_id}


async def test_rollouts_are_listed_only_to_viewers_of_all_their_fleets(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        fleets = {}
        for name in ("a", "b"):
            r = await hub.call("POST", "/v1/fleets", json={"name": name})
            fleets[name] = r.json()["data"]["id"]
            await hub.provision(f"in-{name}", fleet_id=fleets[name])
        r = await hub.call("POST", "/v1/configurations", json={"name": "c", "spec": {"replicas": 1}})
        config_id = r.json()["data"]["id"]
        made = {}
        for key, body in {"a": {"fleet_ids": [fleets["a"]]}, "b": {"fleet_ids": [fleets["b"]]},
                          "ab": {"fleet_ids": [fleets["a"], fleets["b"]]}}.items():
            if key == "ab":  # one active rollout per fleet: finish the others first
                for rid in made.values():
                    await hub.call("POST", f"/v1/rollouts/{rid}/cancel")
            r = await hub.call("POST", "/v1/rollouts", json={**body, "configuration_id": config_id, "batch_size": 1})
            assert r.status_code == 201, r.text
            made[key] = r.json()["data"]["id"]
        member = await hub.new_user("member")
        mh = _creds(member, hub.org_id)
        me = (await hub.call("GET", "/v1/me", headers=mh)).json()["data"]["userId"]

        async def listed(headers) -> set[str]:
            r = await hub.call("GET", "/v1/rollouts", headers=headers)
            assert r.status_code == 200, r.text
            assert r.json()["pagination"]["total"] == len(r.json()["data"])
            return {x["id"] for x in r.json()["data"]}

        assert await listed(hub.headers) == set(made.values())  # the admin sees all
        assert await listed(mh) == set()  # a member without relations sees none
        r = await hub.call("POST", "/v1/relations", json={"object_type": "fleet", "object_id": fleets["a"],
                                                          "relation": "viewer", "subject_type": "user", "subject_id": me})
        assert r.status_code == 201
        assert await listed(mh) == {made["a"]}  # not b's, and not the one spanning a and b
        for rid in (made["a"],):
            assert (await hub.call("GET", f"/v1/rollouts/{rid}", headers=mh)).status_code == 200
        assert (await hub.call("GET", f"/v1/rollouts/{made['ab']}", headers=mh)).status_code == 403
        # an org-wide viewer (here a service account's policy) sees them all
        sa = await _service_account(hub, [{"relation": "viewer"}])
        r = await hub.client.post(hub.base_url + "/v1/oauth/token", data={
            "grant_type": "client_credentials", "client_id": sa["client_id"], "client_secret": sa["client_secret"]})
        bearer = {"Authorization": f"Bearer {r.json()['access_token']}", "X-Organization-ID": hub.org_id}
        assert await listed(bearer) == set(made.values())


# -- invitations and the last admin -------------------------------------------------------------------
async def test_adding_a_member_by_email_is_an_invitation_that_tells_nothing_about_the_email(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        s = hub.services
        # someone registered in another organisation, and an email nobody has
        other = await s.stores.orgs.create_org("Elsewhere", s.clock.now())
        outsider = await hub.new_user("admin", org_id=str(other["id"]))
        outsider_me = (await hub.call("GET", "/v1/me", headers=_creds(outsider, str(other["id"])))).json()["data"]
        email = (await s.db.fetchval("SELECT email FROM users WHERE id = $1", uuid.UUID(outsider_me["userId"])))
        answers = []
        for address in (email, "nobody-at-all@example.test"):
            r = await hub.call("POST", "/v1/members", json={"email": address, "role": "member"})
            assert r.status_code == 202, r.text
            answers.append(r.json()["data"])
        # the same answer for both: no field says whether the email is registered
        assert [sorted(a) for a in answers] == [sorted(answers[1])] * 2
        assert {a["status"] for a in answers} == {"pending"} and answers[0]["email"] == email
        # nobody joined: the outsider is not a member until they accept
        oh = _creds(outsider, hub.org_id)
        assert (await hub.call("GET", "/v1/devices", headers=oh)).status_code == 403
        r = await hub.call("GET", "/v1/invitations")
        assert {i["email"] for i in r.json()["data"]} == {email, "nobody-at-all@example.test"}
        # the outsider lists and accepts their own invitation, and only theirs
        no_org = {"X-API-Token-ID": outsider[0], "X-API-Secret-Key": outsider[1]}
        r = await hub.call("GET", "/v1/me/invitations", headers=no_org)
        assert r.status_code == 200, r.text
        mine = r.json()["data"]
        assert [i["id"] for i in mine] == [answers[0]["id"]] and mine[0]["organization"]["id"] == hub.org_id
        r = await hub.call("POST", f"/v1/invitations/{answers[1]['id']}/accept", headers=no_org)
        assert r.status_code == 404  # another email's invitation is not theirs to take
        r = await hub.call("POST", f"/v1/invitations/{answers[0]['id']}/accept", headers=no_org)
        assert r.status_code == 200, r.text
        assert r.json()["data"] == {"organization_id": hub.org_id, "role": "member"}
        assert (await hub.call("GET", "/v1/devices", headers=oh)).status_code == 200  # at once
        r = await hub.call("POST", f"/v1/invitations/{answers[0]['id']}/accept", headers=no_org)
        assert r.status_code == 404  # once
        # audited in the organisation joined
        await s.audit_log.flush()
        rows = await s.db.fetch("SELECT org_id, action, details FROM audit_events WHERE path LIKE '/v1/invitations/%'"
                                " AND status = 200")
        assert [(str(r["org_id"]), r["action"]) for r in rows] == [(hub.org_id, "access.accept_invitation")]
        # a current member's email changes their role directly
        r = await hub.call("POST", "/v1/members", json={"email": email, "role": "admin"})
        assert r.status_code == 200 and r.json()["data"]["role"] == "admin"
        # a member cannot invite
        member = await hub.new_user("member")
        r = await hub.call("POST", "/v1/members", headers=_creds(member, hub.org_id),
                           json={"email": "x@example.test"})
        assert r.status_code == 403


async def test_the_last_admin_cannot_demote_themselves(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        s = hub.services
        me = await s.db.fetchval("SELECT email FROM users WHERE id = $1", hub.user_id)
        r = await hub.call("POST", "/v1/members", json={"email": me, "role": "member"})
        assert r.status_code == 409 and r.json()["error"] == "last_admin"
        assert await s.stores.orgs.role_of(uuid.UUID(hub.org_id), hub.user_id) == "admin"
        assert (await hub.call("GET", "/v1/members")).status_code == 200  # still admin
        # with a second admin, stepping down is allowed; then the other is the last one
        second = await hub.new_user("admin")
        r = await hub.call("POST", "/v1/members", json={"email": me, "role": "member"})
        assert r.status_code == 200, r.text
        assert (await hub.call("GET", "/v1/members")).status_code == 403  # the cached role was forgotten
        second_me = (await hub.call("GET", "/v1/me", headers=_creds(second, hub.org_id))).json()["data"]["userId"]
        second_email = await s.db.fetchval("SELECT email FROM users WHERE id = $1", uuid.UUID(second_me))
        r = await hub.call("POST", "/v1/members", headers=_creds(second, hub.org_id),
                           json={"email": second_email, "role": "member"})
        assert r.status_code == 409


# -- fleethub admin reaches running hubs ----------------------------------------------------------------
async def test_admin_commands_that_change_access_reach_a_running_hub_at_once(nursery, db_url, tmp_path):
    import argparse

    from hub.admin import run_admin
    from hub.settings import Settings

    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        s = hub.services
        admin2 = await hub.new_user("admin")
        me = (await hub.call("GET", "/v1/me", headers=_creds(admin2, hub.org_id))).json()["data"]["userId"]
        email = await s.db.fetchval("SELECT email FROM users WHERE id = $1", uuid.UUID(me))
        r = await hub.call("DELETE", f"/v1/members/{me}")
        assert r.status_code == 200
        h2 = _creds(admin2, hub.org_id)
        assert (await hub.call("GET", "/v1/members", headers=h2)).status_code == 403  # "not a member" now cached
        # the operator restores them, from another process on the same database
        tool = Settings(data_dir=tmp_path, database_url=db_url)
        await run_admin(tool, argparse.Namespace(admin_command="create-user", email=email, org=hub.org_id,
                                                 role="admin", name="", password=None))

        async def status() -> int:
            return (await hub.call("GET", "/v1/members", headers=h2)).status_code

        # at once: within the NOTIFY's delivery, far below the cache's 30 s
        with trio.fail_after(2):
            while await status() != 200:
                await trio.sleep(0.05)
        # a role change the same way
        await run_admin(tool, argparse.Namespace(admin_command="create-user", email=email, org=hub.org_id,
                                                 role="member", name="", password=None))
        with trio.fail_after(2):
            while await status() != 403:
                await trio.sleep(0.05)
        # and a tier
        assert (await hub.call("GET", "/v1/devices")).headers["X-RateLimit-Limit"] == "1000"
        await run_admin(tool, argparse.Namespace(admin_command="set-tier", org=hub.org_id, tier="professional",
                                                 rate_limit=None))
        with trio.fail_after(2):
            while (await hub.call("GET", "/v1/devices")).headers["X-RateLimit-Limit"] != "10000":
                await trio.sleep(0.05)


# -- open streams end when access does ---------------------------------------------------------------
async def _sse_events(response):
    """(event name, data) pairs of an SSE response as they arrive."""
    import json

    name, data = None, []
    async for line in response.aiter_lines():
        if line.startswith("event:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("data:"):
            data.append(line.split(":", 1)[1].strip())
        elif line == "" and name is not None:
            yield name, json.loads("\n".join(data))
            name, data = None, []


async def _member_with_viewer(hub, fleet_id: str) -> tuple[tuple[str, str], str]:
    member = await hub.new_user("member")
    me = (await hub.call("GET", "/v1/me", headers=_creds(member, hub.org_id))).json()["data"]["userId"]
    r = await hub.call("POST", "/v1/relations", json={"object_type": "fleet", "object_id": fleet_id,
                                                      "relation": "viewer", "subject_type": "user", "subject_id": me})
    assert r.status_code == 201, r.text
    return member, me


async def test_open_device_streams_end_when_the_pat_membership_or_relation_goes(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        s = hub.services
        r = await hub.call("POST", "/v1/fleets", json={"name": "f"})
        fleet = r.json()["data"]["id"]
        dev, _ = await hub.provision("d", fleet_id=fleet)
        url = hub.base_url + f"/v1/devices/{dev}/events"

        async def watch_until_revoked(headers, revoke, *, bystander=None) -> dict:
            async with hub.client.stream("GET", url, headers=headers) as stream:
                assert stream.status_code == 200
                events = _sse_events(stream)
                assert (await events.__anext__())[0] == "device.snapshot"
                if bystander is not None:  # an unrelated access change: the stream goes on delivering
                    await bystander()
                    # through the event log, as a DeviceActor's events go (hub/eventlog.py)
                    s.journal.record(uuid.UUID(hub.org_id), {"kind": "probe", "deviceId": dev,
                                                             "at": rfc3339(s.clock.now()), "payload": {}})
                    assert (await events.__anext__())[0] == "probe"
                await revoke()
                with trio.fail_after(5):  # at once, not at the next keepalive or cache expiry
                    name, body = await events.__anext__()
                assert name == "access_revoked" and body["deviceId"] == dev, (name, body)
                # and the stream is over
                rest = [e async for e in events]
                assert rest == []
                return body

        # 1. the PAT the stream was opened with is deleted
        member, me = await _member_with_viewer(hub, fleet)
        r = await hub.call("POST", "/v1/pats", headers={"X-API-Token-ID": member[0], "X-API-Secret-Key": member[1]},
                           json={"description": "stream"})
        second = (r.json()["data"]["id"], r.json()["data"]["secret"])
        other_member, _ = await _member_with_viewer(hub, fleet)

        async def delete_pat():
            r = await hub.call("DELETE", f"/v1/pats/{second[0]}",
                               headers={"X-API-Token-ID": member[0], "X-API-Secret-Key": member[1]})
            assert r.status_code == 200

        async def unrelated():
            r = await hub.call("DELETE", f"/v1/members/{(await _user_id(hub, other_member))}")
            assert r.status_code == 200

        body = await watch_until_revoked(_creds(second, hub.org_id), delete_pat, bystander=unrelated)
        assert "credential" in body["payload"]["reason"] and second[1] not in str(body)

        # 2. the member is removed from the organisation
        async def remove_member():
            assert (await hub.call("DELETE", f"/v1/members/{me}")).status_code == 200

        body = await watch_until_revoked(_creds(member, hub.org_id), remove_member)
        assert "member" in body["payload"]["reason"]

        # 3. the relation that let them see the device is revoked
        member3, me3 = await _member_with_viewer(hub, fleet)

        async def revoke_relation():
            r = await hub.call("DELETE", "/v1/relations", json={"object_type": "fleet", "object_id": fleet,
                                                                "relation": "viewer", "subject_type": "user",
                                                                "subject_id": me3})
            assert r.status_code == 200

        body = await watch_until_revoked(_creds(member3, hub.org_id), revoke_relation)
        assert "viewer" in body["payload"]["reason"]

        # 4. the device moves to a fleet the viewer cannot see (issue 31 item 2: the stream re-checked
        #    the device as it was when the stream opened, and went on)
        member4, _ = await _member_with_viewer(hub, fleet)
        hidden = (await hub.call("POST", "/v1/fleets", json={"name": "hidden"})).json()["data"]["id"]

        async def move_away():
            r = await hub.call("PATCH", f"/v1/devices/{dev}", json={"fleet_id": hidden})
            assert r.status_code == 200, r.text

        body = await watch_until_revoked(_creds(member4, hub.org_id), move_away)
        assert "viewer" in body["payload"]["reason"]
        assert s.events.subscriber_count() == 0


async def _user_id(hub, pat) -> str:
    return (await hub.call("GET", "/v1/me", headers=_creds(pat, hub.org_id))).json()["data"]["userId"]


async def test_open_rollout_streams_end_when_a_service_account_is_deleted(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        r = await hub.call("POST", "/v1/fleets", json={"name": "f"})
        fleet = r.json()["data"]["id"]
        await hub.provision("d", fleet_id=fleet)
        r = await hub.call("POST", "/v1/configurations", json={"name": "c", "spec": {"replicas": 1}})
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_ids": [fleet], "batch_size": 1,
                                                         "configuration_id": r.json()["data"]["id"]})
        rid = r.json()["data"]["id"]
        sa = await _service_account(hub, [{"relation": "viewer"}])
        r = await hub.client.post(hub.base_url + "/v1/oauth/token", data={
            "grant_type": "client_credentials", "client_id": sa["client_id"], "client_secret": sa["client_secret"]})
        bearer = {"Authorization": f"Bearer {r.json()['access_token']}", "X-Organization-ID": hub.org_id}
        async with hub.client.stream("GET", hub.base_url + f"/v1/rollouts/{rid}/events", headers=bearer) as stream:
            assert stream.status_code == 200
            events = _sse_events(stream)
            assert (await events.__anext__())[0] == "rollout.snapshot"
            assert (await hub.call("DELETE", f"/v1/service-accounts/{sa['id']}")).status_code == 200
            with trio.fail_after(5):
                name, body = await events.__anext__()
            assert name == "access_revoked" and body["rolloutId"] == rid
            assert [e async for e in events] == []
