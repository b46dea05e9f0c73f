"""Identity and access against a real hub and PostgreSQL: service accounts and OAuth, dashboard
sessions, relation tuples, rate limits and the audit log."""

from __future__ import annotations

import base64
import datetime as dt
import json
import uuid

import httpx
import trio
from authlib.integrations.httpx_client import AsyncOAuth2Client

from tests.hubtools import assert_error, start_hub, threads_calling

NO_ORG = object()


def auth_headers(pat, org_id=None) -> dict:
    h = {"X-API-Token-ID": pat[0], "X-API-Secret-Key": pat[1]}
    if org_id:
        h["X-Organization-ID"] = org_id
    return h


async def make_service_account(hub, policies, name="ci") -> dict:
    r = await hub.call("POST", "/v1/service-accounts", json={"name": name, "policies": policies})
    assert r.status_code == 201, r.text
    return r.json()["data"]


async def make_fleet(hub, name) -> str:
    r = await hub.call("POST", "/v1/fleets", json={"name": name})
    assert r.status_code == 201, r.text
    return r.json()["data"]["id"]


# -- OAuth 2.0 client credentials ---------------------------------------------------------------
async def test_standard_oauth_client_obtains_and_uses_a_token(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        await hub.provision("d1")
        sa = await make_service_account(hub, [{"relation": "viewer", "object_type": "organization"}])
        assert sa["client_secret"] and sa["client_id"].startswith("sa_")
        for method in ("client_secret_basic", "client_secret_post"):
            async with AsyncOAuth2Client(sa["client_id"], sa["client_secret"],
                                         token_endpoint_auth_method=method) as client:
                token = await client.fetch_token(hub.base_url + "/v1/oauth/token", grant_type="client_credentials")
                assert token["token_type"] == "Bearer" and token["expires_in"] == 3600
                r = await client.get(hub.base_url + "/v1/devices", headers={"X-Organization-ID": hub.org_id})
                assert r.status_code == 200, r.text
                assert [d["name"] for d in r.json()["data"]] == ["d1"]
                # viewer only: no creating
                r = await client.post(hub.base_url + "/v1/devices", json={"name": "x"},
                                      headers={"X-Organization-ID": hub.org_id})
                assert r.status_code == 403


async def test_token_endpoint_errors_follow_rfc6749(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        sa = await make_service_account(hub, [])
        url = hub.base_url + "/v1/oauth/token"
        c = hub.client

        r = await c.post(url, data={"grant_type": "client_credentials", "client_id": sa["client_id"],
                                    "client_secret": "wrong"})
        assert r.status_code == 401 and r.json()["error"] == "invalid_client"
        assert r.headers["WWW-Authenticate"].startswith("Basic")
        assert r.headers["Cache-Control"] == "no-store"

        basic = base64.b64encode(f"{sa['client_id']}:nope".encode()).decode()
        r = await c.post(url, data={"grant_type": "client_credentials"}, headers={"Authorization": f"Basic {basic}"})
        assert r.status_code == 401 and r.json()["error"] == "invalid_client"

        r = await c.post(url, data={"client_id": sa["client_id"], "client_secret": sa["client_secret"]})
        assert r.status_code == 400 and r.json()["error"] == "invalid_request"

        r = await c.post(url, data={"grant_type": "password", "client_id": sa["client_id"],
                                    "client_secret": sa["client_secret"]})
        assert r.status_code == 400 and r.json()["error"] == "unsupported_grant_type"

        r = await c.post(url, json={"grant_type": "client_credentials"})
        assert r.status_code == 400 and r.json()["error"] == "invalid_request"
        assert set(r.json()) == {"error", "error_description"}
        assert sa["client_secret"] not in r.text


async def test_bearer_tokens_are_checked_for_signature_expiry_audience_and_account(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        sa = await make_service_account(hub, [{"relation": "viewer"}])
        r = await hub.client.post(hub.base_url + "/v1/oauth/token", data={
            "grant_type": "client_credentials", "client_id": sa["client_id"], "client_secret": sa["client_secret"]})
        token = r.json()["access_token"]
        org = {"X-Organization-ID": hub.org_id}

        async def get(tok):
            return await hub.client.get(hub.base_url + "/v1/devices", headers={**org, "Authorization": f"Bearer {tok}"})

        assert (await get(token)).status_code == 200
        head, payload, sig = token.split(".")
        tampered_sig = sig[:-2] + ("AA" if sig[-2:] != "AA" else "BB")
        assert (await get(f"{head}.{payload}.{tampered_sig}")).status_code == 401
        body = base64.urlsafe_b64decode(payload + "==").replace(b'"scope":"api"', b'"scope":"all"')
        forged = base64.urlsafe_b64encode(body).rstrip(b"=").decode()
        assert (await get(f"{head}.{forged}.{sig}")).status_code == 401
        signer = hub.services.access.token_signer
        sa_id, org_id = uuid.UUID(sa["id"]), uuid.UUID(hub.org_id)
        expired = signer.issue(sa_id, org_id, hub.services.clock.now() - dt.timedelta(hours=2))
        assert (await get(expired)).status_code == 401
        other_audience = signer.issue(sa_id, org_id, hub.services.clock.now(), audience="someone-else")
        assert (await get(other_audience)).status_code == 401
        # the token is bound to its organisation
        r = await hub.client.get(hub.base_url + "/v1/devices",
                                 headers={"X-Organization-ID": str(uuid.uuid4()), "Authorization": f"Bearer {token}"})
        assert r.status_code == 403
        # deleting the account revokes its tokens at once
        r = await hub.call("DELETE", f"/v1/service-accounts/{sa['id']}")
        assert r.status_code == 200
        assert (await get(token)).status_code == 401


async def test_service_account_policy_on_one_fleet(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        fa, fb = await make_fleet(hub, "a"), await make_fleet(hub, "b")
        da, _ = await hub.provision("in-a", fleet_id=fa)
        db_, _ = await hub.provision("in-b", fleet_id=fb)
        sa = await make_service_account(hub, [{"relation": "editor", "object_type": "fleet", "object_id": fa}])
        r = await hub.client.post(hub.base_url + "/v1/oauth/token", data={
            "grant_type": "client_credentials", "client_id": sa["client_id"], "client_secret": sa["client_secret"]})
        h = {"X-Organization-ID": hub.org_id, "Authorization": f"Bearer {r.json()['access_token']}"}
        r = await hub.client.get(hub.base_url + "/v1/devices", headers=h)
        assert [d["id"] for d in r.json()["data"]] == [da]
        assert (await hub.client.get(hub.base_url + f"/v1/devices/{db_}", headers=h)).status_code == 403
        r = await hub.client.patch(hub.base_url + f"/v1/devices/{da}", headers=h, json={"name": "renamed"})
        assert r.status_code == 200 and r.json()["data"]["name"] == "renamed"
        r = await hub.client.get(hub.base_url + "/v1/fleets", headers=h)
        assert [f["id"] for f in r.json()["data"]] == [fa]


# -- dashboard sessions -------------------------------------------------------------------------
async def _user_with_password(hub, email, password, role="admin"):
    from hub.auth.passwords import hash_password

    s = hub.services
    user = await s.stores.orgs.create_user(email, s.clock.now(), password_hash=hash_password(password))
    await s.stores.orgs.add_member(uuid.UUID(hub.org_id), user["id"], role, s.clock.now())
    return user


async def test_session_login_cookie_csrf_and_logout(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        await _user_with_password(hub, "ops@example.test", "correct horse")
        async with httpx.AsyncClient(base_url=hub.base_url) as browser:
            r = await browser.post("/v1/auth/login", json={"email": "ops@example.test", "password": "nope"})
            assert r.status_code == 401
            r = await browser.post("/v1/auth/login", json={"email": "ops@example.test", "password": "correct horse"})
            assert r.status_code == 200, r.text
            cookie = r.headers["set-cookie"]
            assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
            csrf = r.json()["data"]["csrfToken"]
            org = {"X-Organization-ID": hub.org_id}
            assert (await browser.get("/v1/devices", headers=org)).status_code == 200
            r = await browser.post("/v1/fleets", headers=org, json={"name": "f"})
            assert r.status_code == 403 and r.json()["error"] == "csrf_required"
            r = await browser.post("/v1/fleets", headers={**org, "X-CSRF-Token": "wrong"}, json={"name": "f"})
            assert r.status_code == 403
            r = await browser.post("/v1/fleets", headers={**org, "X-CSRF-Token": csrf}, json={"name": "f"})
            assert r.status_code == 201
            r = await browser.post("/v1/auth/logout", headers={"X-CSRF-Token": csrf})
            assert r.status_code == 200
            stolen = httpx.Cookies()
            r2 = await hub.client.get(hub.base_url + "/v1/devices", headers={
                **org, "Cookie": cookie.split(";")[0]})
            assert r2.status_code == 401, stolen
            assert "correct horse" not in (await _all_audit_text(hub))


async def test_login_and_session_calls_refuse_other_sites(nursery, db_url, tmp_path):
    """Issue 31 item 7: a text/plain body with a foreign Origin signed in (login CSRF: an HTML form
    on another site can send exactly that). Sign-in is JSON only and from the hub's own pages; every
    cookie-authenticated call a browser marks as another site's is refused."""
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        await _user_with_password(hub, "csrf@example.test", "correct horse")
        creds = json.dumps({"email": "csrf@example.test", "password": "correct horse"})
        async with httpx.AsyncClient(base_url=hub.base_url) as browser:
            r = await browser.post("/v1/auth/login", content=creds,
                                   headers={"Content-Type": "text/plain", "Origin": "https://evil.example"})
            assert_error(r, 400, "json_required")
            r = await browser.post("/v1/auth/login", content=creds, headers={"Content-Type": "text/plain"})
            assert_error(r, 400, "json_required")
            for foreign in ({"Origin": "https://evil.example"}, {"Origin": "null"},
                            {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}):
                r = await browser.post("/v1/auth/login", content=creds,
                                       headers={"Content-Type": "application/json", **foreign})
                assert_error(r, 403, "cross_origin")
            assert "set-cookie" not in r.headers
            host = hub.base_url.split("://", 1)[1]
            r = await browser.post("/v1/auth/login", content=creds, headers={
                "Content-Type": "application/json", "Origin": hub.base_url, "Sec-Fetch-Site": "same-origin"})
            assert r.status_code == 200, r.text
            csrf = r.json()["data"]["csrfToken"]
            org = {"X-Organization-ID": hub.org_id}
            assert (await browser.get("/v1/devices", headers={**org, "Sec-Fetch-Site": "same-origin"})).status_code == 200
            assert_error(await browser.get("/v1/devices", headers={**org, "Sec-Fetch-Site": "cross-site"}),
                         403, "cross_origin")
            r = await browser.post("/v1/fleets", json={"name": "x"}, headers={
                **org, "X-CSRF-Token": csrf, "Origin": "http://evil.example"})
            assert_error(r, 403, "cross_origin")
            r = await browser.post("/v1/fleets", json={"name": "x"}, headers={
                **org, "X-CSRF-Token": csrf, "Origin": f"http://{host}"})
            assert r.status_code == 201, r.text
        # A PAT carries no ambient authority: a foreign Origin does not matter to it.
        r = await hub.call("GET", "/v1/devices", headers={**hub.headers, "Origin": "https://evil.example"})
        assert r.status_code == 200


async def test_login_is_throttled_per_account(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        await _user_with_password(hub, "slow@example.test", "right")
        url = hub.base_url + "/v1/auth/login"
        for _ in range(5):
            r = await hub.client.post(url, json={"email": "slow@example.test", "password": "wrong"})
            assert r.status_code == 401
        r = await hub.client.post(url, json={"email": "slow@example.test", "password": "right"})
        assert r.status_code == 429 and int(r.headers["Retry-After"]) > 0


async def test_an_unknown_accounts_sign_in_hashes_in_a_worker_thread(nursery, db_url, tmp_path, monkeypatch):
    """An unknown email is checked against a dummy argon2id hash (timing tells no account apart); the
    first one is made then, about 0.1 s, and was made on the event loop, holding the whole hub."""
    from hub.api import sessions

    made = threads_calling(monkeypatch, sessions, "_dummy_hash")
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        r = await hub.client.post(hub.base_url + "/v1/auth/login", json={"email": "nobody@example.test",
                                                                           "password": "guess"})
        assert_error(r, 401, "invalid_credentials")
    assert made == [False]


# -- relations ----------------------------------------------------------------------------------
async def test_member_sees_only_permitted_fleets_and_relations_apply_at_once(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        fa, fb = await make_fleet(hub, "a"), await make_fleet(hub, "b")
        da, _ = await hub.provision("in-a", fleet_id=fa)
        db_, _ = await hub.provision("in-b", fleet_id=fb)
        member = await hub.new_user("member")
        mh = auth_headers(member, hub.org_id)
        r = await hub.call("GET", "/v1/devices", headers=mh)
        assert r.status_code == 200 and r.json()["data"] == []
        assert (await hub.call("GET", f"/v1/devices/{da}", headers=mh)).status_code == 403
        me = (await hub.call("GET", "/v1/me", headers=mh)).json()["data"]
        grant = {"object_type": "fleet", "object_id": fa, "relation": "viewer", "subject_type": "user",
                 "subject_id": me["userId"]}
        assert (await hub.call("POST", "/v1/relations", headers=mh, json=grant)).status_code == 403
        r = await hub.call("POST", "/v1/relations", json=grant)
        assert r.status_code == 201, r.text
        r = await hub.call("GET", "/v1/devices", headers=mh)
        assert [d["id"] for d in r.json()["data"]] == [da]
        assert (await hub.call("GET", f"/v1/devices/{da}", headers=mh)).status_code == 200
        assert (await hub.call("GET", f"/v1/devices/{db_}", headers=mh)).status_code == 403
        assert (await hub.call("PATCH", f"/v1/devices/{da}", headers=mh, json={"name": "x"})).status_code == 403
        r = await hub.call("POST", "/v1/relations", json={**grant, "object_type": "device", "object_id": da,
                                                          "relation": "editor"})
        assert r.status_code == 201
        assert (await hub.call("PATCH", f"/v1/devices/{da}", headers=mh, json={"name": "x"})).status_code == 200
        r = await hub.call("DELETE", "/v1/relations", json=grant)
        assert r.status_code == 200
        r = await hub.call("DELETE", "/v1/relations", json={**grant, "object_type": "device", "object_id": da,
                                                            "relation": "editor"})
        assert r.status_code == 200
        assert (await hub.call("GET", f"/v1/devices/{da}", headers=mh)).status_code == 403
        # a relation on another organisation's object is refused like an unknown one
        other = await hub.services.stores.orgs.create_org("Other", hub.services.clock.now())
        r = await hub.call("POST", "/v1/relations", json={**grant, "object_type": "organization",
                                                          "object_id": str(other["id"])})
        assert r.status_code == 400


async def test_removing_a_member_and_deleting_a_pat_revoke_at_once(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        member = await hub.new_user("admin")
        mh = auth_headers(member, hub.org_id)
        assert (await hub.call("GET", "/v1/devices", headers=mh)).status_code == 200  # warm the cache
        me = (await hub.call("GET", "/v1/me", headers=mh)).json()["data"]
        r = await hub.call("DELETE", f"/v1/members/{me['userId']}")
        assert r.status_code == 200
        assert (await hub.call("GET", "/v1/devices", headers=mh)).status_code == 403
        r = await hub.call("POST", "/v1/pats", headers=auth_headers(hub.pat), json={"description": "x"})
        new = (r.json()["data"]["id"], r.json()["data"]["secret"])
        assert (await hub.call("GET", "/v1/devices", headers=auth_headers(new, hub.org_id))).status_code == 200
        assert (await hub.call("DELETE", f"/v1/pats/{new[0]}", headers=auth_headers(hub.pat))).status_code == 200
        assert (await hub.call("GET", "/v1/devices", headers=auth_headers(new, hub.org_id))).status_code == 401


# -- rate limits --------------------------------------------------------------------------------
async def test_rate_limit_headers_and_429(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        r = await hub.call("GET", "/v1/devices")
        assert r.headers["X-RateLimit-Limit"] == "1000"
        first = int(r.headers["X-RateLimit-Remaining"])
        r = await hub.call("GET", "/v1/devices")
        assert int(r.headers["X-RateLimit-Remaining"]) == first - 1
        assert int(r.headers["X-RateLimit-Reset"]) > hub.services.clock.now().timestamp()
        # an operator gives the org a custom enterprise figure; it applies at once
        s = hub.services
        await s.db.execute("UPDATE organizations SET tier = 'enterprise', rate_limit = 3 WHERE id = $1",
                           uuid.UUID(hub.org_id))
        await s.invalidate(f"org:{hub.org_id}")
        s.access.rate_limiter._counts.clear()
        statuses = [(await hub.call("GET", "/v1/devices")).status_code for _ in range(4)]
        assert statuses == [200, 200, 200, 429]
        r = await hub.call("GET", "/v1/devices")
        assert r.status_code == 429 and r.json()["error"] == "rate_limited"
        assert r.headers["X-RateLimit-Remaining"] == "0" and int(r.headers["Retry-After"]) >= 1
        # errors carry the headers too
        r = await hub.call("GET", "/v1/devices/not-a-uuid")
        assert "X-RateLimit-Limit" in r.headers


# -- audit ----------------------------------------------------------------------------------------
async def _all_audit_text(hub) -> str:
    await hub.services.audit_log.flush()
    rows = await hub.services.db.fetch("SELECT * FROM audit_events")
    return "\n".join(str(dict(r)) for r in rows)


async def test_audit_log_records_calls_and_filters(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        dev, token = await hub.provision("d")
        await hub.call("GET", f"/v1/devices/{dev}", params={"token": "should-not-appear"})
        r = await hub.call("POST", "/v1/pats", headers=auth_headers(hub.pat), json={})
        secret = r.json()["data"]["secret"]
        r = await hub.call("GET", "/v1/audit-events", params={"limit": 10})
        assert r.status_code == 200, r.text
        body = r.json()
        events = body["data"]
        assert body["pagination"]["page"] == 1 and body["pagination"]["limit"] == 10
        assert events[0]["at"] >= events[-1]["at"]  # newest first
        post = next(e for e in events if e["method"] == "POST" and e["path"] == "/v1/devices")
        assert post["status"] == 201 and post["credentialKind"] == "pat" and post["credentialId"] == hub.pat[0]
        assert post["actorUserId"] == str(hub.user_id) and post["clientAddress"] == "127.0.0.1"
        assert post["durationMs"] is not None and post["requestId"]
        get = next(e for e in events if e["path"] == f"/v1/devices/{dev}")
        assert get["query"] == "token=[redacted]"
        r = await hub.call("GET", "/v1/audit-events", params={"method": "POST", "pathPrefix": "/v1/devices"})
        assert {(e["method"], e["path"]) for e in r.json()["data"]} == {("POST", "/v1/devices")}
        r = await hub.call("GET", "/v1/audit-events", params={"actorUserId": str(uuid.uuid4())})
        assert r.json()["data"] == [] and r.json()["pagination"]["total"] == 0
        future = (hub.services.clock.now() + dt.timedelta(days=1)).isoformat()
        r = await hub.call("GET", "/v1/audit-events", params={"from": future})
        assert r.json()["data"] == []
        for bad in ({"limit": 0}, {"limit": 1001}, {"page": 0}, {"from": "yesterday"}, {"to": "2026-01-01T00:00:00"},
                    {"method": "BREW"}, {"actorUserId": "x"}, {"bogus": 1}):
            r = await hub.call("GET", "/v1/audit-events", params=bad)
            assert r.status_code == 400, (bad, r.text)
        text = await _all_audit_text(hub)
        for forbidden in (secret, token, hub.pat[1], "should-not-appear"):
            assert forbidden not in text
        member = await hub.new_user("member")
        assert (await hub.call("GET", "/v1/audit-events", headers=auth_headers(member, hub.org_id))).status_code == 403
