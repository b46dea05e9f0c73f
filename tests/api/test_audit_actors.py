"""The audit log names its actors as people read them (issue 37 item 8): the user's email with the
token's description, the service account's name; one deleted since shows its id and "(deleted)".
The ids stay beside the name."""

from __future__ import annotations

import uuid

import pytest
import trio

from hub.auth.pat import digest, new_pat
from tests.hubtools import start_hub


@pytest.fixture
async def hub(nursery, db_url, tmp_path):
    return await start_hub(nursery, db_url, tmp_path / "hub")


async def _user(hub, description: str = "") -> tuple[dict, tuple[str, str], dict]:
    """A member with a PAT described ``description``: (user row, PAT, its request headers)."""
    s = hub.services
    user = await s.stores.orgs.create_user(f"{uuid.uuid4().hex[:8]}@test.local", s.clock.now())
    await s.stores.orgs.add_member(uuid.UUID(hub.org_id), user["id"], "member", s.clock.now())
    pat_id, secret = new_pat()
    await s.stores.tokens.create_pat(pat_id, user["id"], digest(secret), s.clock.now(), description=description)
    return user, (pat_id, secret), {"X-API-Token-ID": pat_id, "X-API-Secret-Key": secret,
                                    "X-Organization-ID": hub.org_id}


async def _called(hub, headers: dict) -> str:
    """Make one call of its own (a path no one else uses) and return that path."""
    path = f"/v1/devices/{uuid.uuid4()}"
    await hub.call("GET", path, headers=headers)
    return path


async def _actor(hub, path: str) -> dict:
    r = await hub.call("GET", "/v1/audit-events", params={"pathPrefix": path})
    assert r.status_code == 200, r.text
    events = r.json()["data"]
    assert len(events) == 1, events
    return events[0]


async def test_actors_show_as_emails_token_descriptions_and_service_account_names(hub):
    with trio.fail_after(30):
        s = hub.services
        admin_email = await s.db.fetchval("SELECT email FROM users WHERE id = $1", hub.user_id)
        ci, _, ci_headers = await _user(hub, "ci deploy")
        gone_token, gone_pat, gone_token_headers = await _user(hub, "laptop")
        gone_user, gone_user_pat, gone_user_headers = await _user(hub, "old")
        r = await hub.call("POST", "/v1/service-accounts", json={"name": "nightly", "policies": []})
        assert r.status_code == 201, r.text
        sa = r.json()["data"]
        sa_token = s.access.token_signer.issue(uuid.UUID(sa["id"]), uuid.UUID(hub.org_id), s.clock.now())

        paths = {
            "admin": await _called(hub, hub.headers),  # a PAT without a description: its id
            "ci": await _called(hub, ci_headers),
            "service": await _called(hub, {"Authorization": f"Bearer {sa_token}", "X-Organization-ID": hub.org_id}),
            "gone_token": await _called(hub, gone_token_headers),
            "gone_user": await _called(hub, gone_user_headers),
        }
        r = await hub.call("DELETE", f"/v1/pats/{gone_pat[0]}", headers={k: v for k, v in gone_token_headers.items()
                                                                          if k != "X-Organization-ID"})
        assert r.status_code in (200, 204), r.text
        await s.db.execute("DELETE FROM users WHERE id = $1", gone_user["id"])  # as fleethub admin delete-user

        admin = await _actor(hub, paths["admin"])
        assert admin["actorDisplay"] == f"{admin_email}, token {hub.pat[0]}"
        assert admin["actorUserId"] == str(hub.user_id) and admin["credentialId"] == hub.pat[0]
        assert (await _actor(hub, paths["ci"]))["actorDisplay"] == f'{ci["email"]}, token "ci deploy"'
        service = await _actor(hub, paths["service"])
        assert service["actorDisplay"] == "service account nightly" and service["credentialId"] == sa["id"]
        token = await _actor(hub, paths["gone_token"])
        assert token["actorDisplay"] == f"{gone_token['email']}, token {gone_pat[0]} (deleted)"
        user = await _actor(hub, paths["gone_user"])
        assert user["actorDisplay"] == f"user {gone_user['id']} (deleted)"
        assert user["actorUserId"] == str(gone_user["id"]) and user["credentialId"] == gone_user_pat[0]

        r = await hub.call("DELETE", f"/v1/service-accounts/{sa['id']}")
        assert r.status_code in (200, 204), r.text
        assert (await _actor(hub, paths["service"]))["actorDisplay"] == f"service account {sa['id']} (deleted)"
