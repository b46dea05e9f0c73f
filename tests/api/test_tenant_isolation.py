"""Tenant isolation: a second organisation's admin walks every route of the app, with every method
it answers, aimed at the first organisation's objects — and gets only 4xx, never their data.

The routes come from the app's own url_map, so a route added later is walked too; a path parameter
this test does not know how to fill fails the test rather than being skipped.
"""

from __future__ import annotations

import re
import uuid

import trio

from hub.auth.pat import digest, new_pat
from tests.hubtools import start_hub

ALLOWED = {400, 401, 403, 404, 405, 409, 422, 426}  # 426: a plain GET of the device link's WebSocket path


async def test_another_organisation_sees_and_touches_nothing(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        s = hub.services
        # Organisation A: a fleet, a device, a service account, a member, a relation.
        r = await hub.call("POST", "/v1/fleets", json={"name": "a-fleet", "tags": ["secret-tag"]})
        fleet_a = r.json()["data"]["id"]
        device_a, token_a = await hub.provision("a-device", fleet_id=fleet_a)
        r = await hub.call("POST", "/v1/service-accounts", json={"name": "a-sa", "policies": [{"relation": "viewer"}]})
        sa_a = r.json()["data"]["id"]
        member_a = await hub.new_user("member")
        user_a = (await hub.call("GET", "/v1/me", headers={"X-API-Token-ID": member_a[0],
                                                            "X-API-Secret-Key": member_a[1]})).json()["data"]["userId"]
        await hub.call("POST", "/v1/relations", json={"object_type": "device", "object_id": device_a,
                                                      "relation": "viewer", "subject_type": "user",
                                                      "subject_id": user_a})
        r = await hub.call("POST", "/v1/configurations", json={"name": "a-config", "spec": {"a-spec": 1}})
        config_a = r.json()["data"]["id"]
        r = await hub.call("POST", f"/v1/configurations/{config_a}/secret-files",
                           json={"path": "/etc/app/a-key", "content_base64": "YS1zZWNyZXQ="})
        file_a = r.json()["data"]["id"]
        r = await hub.call("POST", f"/v1/devices/{device_a}/secret-files",
                           json={"path": "/etc/app/a-device-key", "content_base64": "YS1zZWNyZXQ="})
        assert r.status_code == 201, r.text
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_id": fleet_a, "config_id": config_a})
        assert r.status_code == 201, r.text
        rollout_a = r.json()["data"]["id"]
        r = await hub.call("POST", "/v1/registry-credentials", json={"registry": "a-registry.example.com",
                                                                     "username": "a-puller", "password": "a-pw"})
        assert r.status_code == 201, r.text
        credential_a = r.json()["data"]["id"]
        r = await hub.call("POST", "/v1/webhooks", json={"url": "https://192.0.32.10/a-hook", "event_types": ["*"]})
        assert r.status_code == 201, r.text
        webhook_a, webhook_secret_a = r.json()["data"]["id"], r.json()["data"]["secret"]
        r = await hub.call("POST", "/v1/members", json={"email": "a-invitee@test.local"})
        assert r.status_code == 202, r.text
        invitation_a = r.json()["data"]["id"]
        secrets_a = {rollout_a, invitation_a, "a-invitee@test.local", fleet_a, device_a, sa_a, user_a, hub.pat[0], token_a, "a-device", "a-fleet", "secret-tag",
                     config_a, file_a, "a-config", "a-spec", "/etc/app/a-key", "a-secret", "YS1zZWNyZXQ=",
                     credential_a, "a-registry.example.com", "a-puller", "a-pw", webhook_a, "/a-hook",
                     webhook_secret_a}

        # Organisation B: its own admin with a PAT.
        now = s.clock.now()
        org_b = await s.stores.orgs.create_org("Org B", now)
        user_b = await s.stores.orgs.create_user("b-admin@test.local", now)
        await s.stores.orgs.add_member(org_b["id"], user_b["id"], "admin", now)
        pat_id, secret = new_pat()
        await s.stores.tokens.create_pat(pat_id, user_b["id"], digest(secret), now)
        headers_b = {"X-API-Token-ID": pat_id, "X-API-Secret-Key": secret, "X-Organization-ID": str(org_b["id"])}

        fill = {"device_id": device_a, "fleet_id": fleet_a, "sa_id": sa_a, "user_id": user_a, "pat_id": hub.pat[0],
                "config_id": config_a, "file_id": file_a, "rollout_id": rollout_a,
                "invitation_id": invitation_a, "credentialId": credential_a, "webhook_id": webhook_a,
                # the spec's own spelling of the same parameters (issue 15)
                "deviceId": device_a, "fleetId": fleet_a, "configId": config_a, "fileId": file_a,
                "id": device_a,  # the memory-test rows' {id}
                "run_id": str(uuid.uuid4()),  # no memory test ran in A: any id must be refused alike
                "name": "init.js",  # /v1/docs/<name>: Swagger UI's files, public
                "feature": "telemetry",
                # Session routes take tunnel tokens only (401 here); their isolation with B's own
                # tunnel token is tested in tests/api/test_tunnels.py.
                "sid": str(uuid.uuid4())}
        bodies = {"POST": {"name": "probe", "fleet_id": fleet_a, "config_id": config_a},
                  "PATCH": {"name": "probe", "fleet_id": fleet_a},
                  "PUT": {"name": "probe", "configId": config_a},
                  "DELETE": {"object_type": "device", "object_id": device_a, "relation": "viewer",
                             "subject_type": "user", "subject_id": user_a}}
        app_rules = [rule for rule in _url_map(hub) if rule.rule.startswith("/v1/") and "websocket" not in rule.endpoint
                     and not rule.websocket]
        assert len(app_rules) >= 15
        walked = 0
        for rule in app_rules:
            params = re.findall(r"<(?:[^:>]+:)?([^>]+)>", rule.rule)
            missing = [p for p in params if p not in fill]
            assert not missing, f"teach this test to fill {missing} in {rule.rule}"
            path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", lambda m: fill[m.group(1)], rule.rule)
            for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
                if path in ("/v1/oauth/token", "/v1/auth/login", "/v1/openapi.json") or path.startswith("/v1/docs"):
                    continue  # public, credential-free endpoints: no organisation to cross
                kw = {"json": bodies[method]} if method in bodies else {}
                if path.endswith("/events"):
                    with trio.move_on_after(2):
                        async with hub.client.stream(method, hub.base_url + path, headers=headers_b) as r:
                            status, text = r.status_code, (await r.aread()).decode() if r.status_code != 200 else ""
                else:
                    r = await hub.call(method, path, headers=headers_b, **kw)
                    status, text = r.status_code, r.text
                walked += 1
                if path == "/v1/audit-events":
                    # B's log holds B's own probes (whose paths carry A's ids, typed by B): check
                    # that every event is B's, not that the ids are absent.
                    events = r.json()["data"]
                    assert events and {e["organizationId"] for e in events} == {str(org_b["id"])}
                    assert {e["actorUserId"] for e in events} == {str(user_b["id"])}
                    continue
                leaked = [x for x in secrets_a if x in text]
                assert not leaked, f"{method} {path} leaked {leaked}: {text[:300]}"
                if status not in ALLOWED:
                    # Only B's own collections may answer 2xx, and they must hold nothing of A's.
                    assert status in (200, 201) and not params, f"{method} {path} -> {status}: {text[:300]}"
        assert walked >= 20

        # A's objects are untouched.
        r = await hub.call("GET", f"/v1/devices/{device_a}")
        assert r.status_code == 200 and r.json()["data"]["name"] == "a-device"
        assert r.json()["data"]["fleet_id"] == fleet_a
        r = await hub.call("GET", f"/v1/fleets/{fleet_a}")
        assert r.json()["data"]["name"] == "a-fleet"
        r = await hub.call("GET", f"/v1/configurations/{config_a}")
        assert r.json()["data"]["name"] == "a-config" and r.json()["data"]["secretFileCount"] == 1
        r = await hub.call("GET", f"/v1/devices/{device_a}/secret-files")
        assert [f["path"] for f in r.json()["data"]] == ["/etc/app/a-device-key"]
        r = await hub.call("GET", "/v1/service-accounts")
        assert [x["id"] for x in r.json()["data"]] == [sa_a]
        rows = await s.stores.identity.list_relations(uuid.UUID(hub.org_id))
        assert len(rows) == 2  # the service account's org-wide viewer and the member's device viewer


def _url_map(hub):
    from hub.app import create_app

    return list(create_app(hub.services).url_map.iter_rules())
