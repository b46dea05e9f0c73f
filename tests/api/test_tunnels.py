"""Tunnel control plane on a real hub: entitlements, tunnel tokens, open / renew / close, the error
table, the signalling socket, usage and audit. The device is scripted (tests/api/tunnel_device.py)
over a real WebSocket, so every refusal code the spec lists can be produced on demand.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

import pytest
import trio

from hub.tunnels.tokens import BadTunnelToken
from tests.api.tunnel_device import ANSWER, FINGERPRINT, OFFER, Refuse, TunnelDevice
from tests.hubtools import start_hub, wait_for
from webrtc.grant import parse_grant

COMMAND_TIMEOUT = 1.0


async def tunnel_hub(nursery, db_url, tmp_path):
    return await start_hub(nursery, db_url, tmp_path / "hub", command_timeout=COMMAND_TIMEOUT,
                           stun_urls=("stun:127.0.0.1:3478",), turn_urls=("turn:127.0.0.1:3478?transport=udp",),
                           turn_secret="s3cret-turn")


@pytest.fixture
async def hub(nursery, db_url, tmp_path):
    return await tunnel_hub(nursery, db_url, tmp_path)


async def entitle(hub, org_id=None, **changes):
    changes = {"enabled": True, "relay_allowed": True, **changes}
    return await hub.services.tunnels.store.set_entitlement(uuid.UUID(org_id or hub.org_id), changes,
                                                            hub.services.clock.now())


async def tunnel_token(hub, headers=None) -> str:
    r = await hub.call("POST", "/v1/cli/tunnel/token", headers=headers)
    assert r.status_code == 200, r.text
    return r.json()["data"]["token"]


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


async def connect(hub, nursery, **kw) -> tuple[str, TunnelDevice]:
    dev_id, token = await hub.provision(f"dev-{uuid.uuid4().hex[:6]}")
    device = TunnelDevice(hub, token, **kw)
    await nursery.start(device.run)
    return dev_id, device


async def open_session(hub, token, dev_id, target="ssh", **extra):
    return await hub.call("POST", "/v1/cli/tunnel/session", headers=bearer(token),
                          json={"device_id": dev_id, "target": target, "offer": OFFER, **extra})


def tunnel_error(r, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error_code"] == code, body
    assert isinstance(body["message"], str) and body["message"]
    assert "error" not in body  # the tunnel endpoints' own shape, not the general one
    return body


def signal_url(hub, sid: str) -> str:
    return hub.base_url.replace("http://", "ws://") + f"/v1/cli/tunnel/session/{sid}/signal"


# ---- entitlements and tokens ---------------------------------------------------------------------

async def test_entitlements_defaults_and_states(hub):
    with trio.fail_after(30):
        r = await hub.call("GET", "/v1/cli/tunnel/entitlements")
        data = r.json()["data"]
        assert r.status_code == 200
        assert data["sessions_enabled"] is False and data["relay_allowed"] is False  # never entitled
        assert data["limits"] == {"max_sessions": 10, "max_sessions_per_device": 2, "bandwidth_bps": 50_000_000,
                                  "max_session_seconds": 43200}
        assert data["turn_configured"] is True
        await entitle(hub, max_sessions=3)
        data = (await hub.call("GET", "/v1/cli/tunnel/entitlements")).json()["data"]
        assert data["sessions_enabled"] is True and data["relay_allowed"] is True
        assert data["limits"]["max_sessions"] == 3 and data["limits"]["max_sessions_per_device"] == 2
        headers = {k: v for k, v in hub.headers.items() if k != "X-Organization-ID"}
        assert (await hub.call("GET", "/v1/cli/tunnel/entitlements", headers=headers)).status_code == 400
        r = await hub.call("GET", "/v1/cli/tunnel/entitlements", headers={"X-Organization-ID": hub.org_id})
        tunnel_error(r, 401, "unauthenticated")
        s = hub.services
        s.settings = dataclasses.replace(s.settings, tunnels_enabled=False)
        tunnel_error(await hub.call("GET", "/v1/cli/tunnel/entitlements"), 503, "tunnels_unavailable")
        tunnel_error(await hub.call("POST", "/v1/cli/tunnel/token"), 503, "tunnels_unavailable")


async def test_tunnel_token_only_opens_the_session_routes(hub, nursery):
    with trio.fail_after(30):
        r = await hub.call("POST", "/v1/cli/tunnel/token")
        data = r.json()["data"]
        assert data["token_type"] == "Bearer" and data["expires_in"] == 900 and data["scope"] == "tunnel"
        token = data["token"]
        # Elsewhere a tunnel token is no credential at all.
        r = await hub.call("GET", "/v1/devices", headers={**bearer(token), "X-Organization-ID": hub.org_id})
        assert r.status_code == 401, r.text
        # And on the session routes PATs are refused.
        r = await hub.call("POST", "/v1/cli/tunnel/session", json={"device_id": str(uuid.uuid4()), "target": "ssh",
                                                                  "offer": OFFER})
        tunnel_error(r, 401, "unauthenticated")
        r = await hub.call("DELETE", f"/v1/cli/tunnel/session/{uuid.uuid4()}",
                           headers={"Authorization": f"Bearer {hub.pat[1]}", "X-Organization-ID": hub.org_id})
        tunnel_error(r, 401, "unauthenticated")
        tunnel_error(await open_session(hub, token + "x", str(uuid.uuid4())), 401, "unauthenticated")
        # A token expires after 15 minutes by the hub's clock.
        claims = hub.services.tunnels.tokens.verify(token, hub.services.clock.now())
        with pytest.raises(BadTunnelToken):
            hub.services.tunnels.tokens.verify(token, claims.expires_at)


# ---- opening ----------------------------------------------------------------------------------------

async def test_open_signs_a_grant_the_device_can_verify(hub, nursery):
    with trio.fail_after(30):
        await entitle(hub)
        dev_id, device = await connect(hub, nursery)
        token = await tunnel_token(hub)
        r = await open_session(hub, token, dev_id)
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        assert data["answer"] == ANSWER
        [sent] = device.sent("tunnel.open")
        assert sent["offer"] == OFFER and sent["grant"] == data["grant"]
        assert sent["iceServers"] == data["ice_servers"]
        grant = parse_grant(data["grant"], device.hub_keys, now=hub.services.clock.now())
        assert grant.sid == data["session_id"] and grant.device_id == dev_id and grant.org_id == hub.org_id
        assert grant.principal == f"user:{hub.user_id}" and grant.target == "ssh"
        assert grant.client_fingerprint == FINGERPRINT and grant.device_key == device.public_key
        assert grant.relay is True and grant.bandwidth_bps == 50_000_000
        assert (grant.expires_at - grant.not_before) == dt.timedelta(seconds=600)
        # TURN REST credentials: "expiry:principal", valid until the grant's end.
        turn = [x for x in data["ice_servers"] if x.get("username")]
        assert turn and turn[0]["urls"] == ["turn:127.0.0.1:3478?transport=udp"]
        assert turn[0]["username"] == f"{int(grant.expires_at.timestamp())}:user:{hub.user_id}"
        assert "s3cret-turn" not in r.text
        row = await hub.services.tunnels.store.get(uuid.UUID(data["session_id"]))
        assert row["state"] == "open" and row["target"] == "ssh" and row["relay_allowed"] is True
        # A port the device allows works as a target too; the device is asked for it.
        r = await open_session(hub, token, dev_id, target="8080")
        assert r.status_code == 200, r.text
        assert parse_grant(r.json()["data"]["grant"], device.hub_keys, now=hub.services.clock.now()).target == "8080"


async def test_no_relay_means_no_turn_credentials(hub, nursery):
    with trio.fail_after(30):
        await entitle(hub, relay_allowed=False)
        dev_id, device = await connect(hub, nursery)
        r = await open_session(hub, await tunnel_token(hub), dev_id)
        data = r.json()["data"]
        assert data["relay_allowed"] is False
        assert data["ice_servers"] == [{"urls": ["stun:127.0.0.1:3478"]}]


async def test_checks_run_in_the_spec_order(hub, nursery):
    with trio.fail_after(60):
        dev_id, device = await connect(hub, nursery)
        token = await tunnel_token(hub)
        # A member without the tunnel_access relation: 403, before anything else is looked at.
        member = await hub.new_user("member")
        member_headers = {"X-API-Token-ID": member[0], "X-API-Secret-Key": member[1], "X-Organization-ID": hub.org_id}
        member_token = await tunnel_token(hub, member_headers)
        tunnel_error(await open_session(hub, member_token, dev_id), 403, "missing_relation")
        # The organisation is not entitled.
        tunnel_error(await open_session(hub, token, dev_id), 403, "tunnel_not_entitled")
        await entitle(hub)
        # Billing-locked account.
        s = hub.services
        await s.stores.billing.put_profile(uuid.UUID(hub.org_id), s.clock.now(), plan="standard", locked=True)
        await s.invalidate(f"billing:{hub.org_id}")
        tunnel_error(await open_session(hub, token, dev_id), 403, "account_locked")
        await s.stores.billing.put_profile(uuid.UUID(hub.org_id), s.clock.now(), locked=False)
        await s.invalidate(f"billing:{hub.org_id}")
        # No such device / no tunnel identity.
        tunnel_error(await open_session(hub, token, str(uuid.uuid4())), 404, "no_device_identity")
        plain_id, _ = await connect(hub, nursery, identity=False)
        tunnel_error(await open_session(hub, token, plain_id), 404, "no_device_identity")
        # A target the device did not configure: refused before the device is asked.
        tunnel_error(await open_session(hub, token, dev_id, target="db"), 404, "target_not_configured")
        tunnel_error(await open_session(hub, token, dev_id, target="9999"), 404, "target_not_configured")
        assert device.sent("tunnel.open") == []
        # Limits asked for beyond the entitlement.
        body = tunnel_error(await open_session(hub, token, dev_id, bandwidth_bps=10**9), 429, "limit_exceeded")
        assert body["limit"] == "bandwidth_bps"
        body = tunnel_error(await open_session(hub, token, dev_id, duration_seconds=10**6), 429, "limit_exceeded")
        assert body["limit"] == "max_session_seconds"
        # Once granted, the member opens a session too.
        r = await hub.call("POST", "/v1/relations", json={"object_type": "device", "object_id": dev_id,
                                                          "relation": "tunnel_access", "subject_type": "user",
                                                          "subject_id": str((await member_user(hub, member_headers)))})
        assert r.status_code in (200, 201), r.text
        r = await open_session(hub, member_token, dev_id)
        assert r.status_code == 200, r.text
        assert device.sent("tunnel.open") != []
        # Bad bodies are 400 with the tunnel shape.
        r = await hub.call("POST", "/v1/cli/tunnel/session", headers=bearer(token),
                           json={"device_id": dev_id, "target": "ssh", "offer": {"type": "offer", "sdp": "v=0"}})
        tunnel_error(r, 400, "invalid_offer")
        r = await hub.call("POST", "/v1/cli/tunnel/session", headers=bearer(token), json={"device_id": dev_id})
        tunnel_error(r, 400, "missing_field")


async def member_user(hub, headers) -> str:
    r = await hub.call("GET", "/v1/me", headers={k: v for k, v in headers.items() if k != "X-Organization-ID"})
    return r.json()["data"]["userId"]


async def test_session_limits(hub, nursery):
    with trio.fail_after(30):
        await entitle(hub, max_sessions=3, max_sessions_per_device=2)
        a, _ = await connect(hub, nursery)
        b, _ = await connect(hub, nursery)
        token = await tunnel_token(hub)
        for _ in range(2):
            assert (await open_session(hub, token, a)).status_code == 200
        tunnel_error(await open_session(hub, token, a), 429, "device_busy")
        assert (await open_session(hub, token, b)).status_code == 200
        body = tunnel_error(await open_session(hub, token, b), 429, "too_many_sessions")
        assert body["max"] == 3


@pytest.mark.parametrize("code,status,expected", [
    ("target_not_configured", 409, "target_not_configured"),
    ("ssh_disabled", 409, "ssh_disabled"),
    ("device_unsupported", 409, "device_unsupported"),
    ("unknown_command", 409, "device_unsupported"),
    ("invalid_grant", 502, "device_rejected"),
    ("rejected", 502, "device_rejected"),
])
async def test_device_refusals(hub, nursery, code, status, expected):
    with trio.fail_after(30):
        await entitle(hub)
        dev_id, device = await connect(hub, nursery)
        device.refuse = Refuse(code, f"the device says {code}")
        r = await open_session(hub, await tunnel_token(hub), dev_id)
        body = tunnel_error(r, status, expected)
        if expected == "device_rejected":
            assert body["reason"] == f"the device says {code}"
        [row] = [x for x in await hub.services.stores.billing.tunnel_records(
            uuid.UUID(hub.org_id), dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc),
            dt.datetime(2100, 1, 1, tzinfo=dt.timezone.utc), None, 10)]
        assert row["state"] == "failed" and row["close_reason"] == expected


async def test_unreachable_device_and_signing_fault(hub, nursery):
    with trio.fail_after(30):
        await entitle(hub)
        token = await tunnel_token(hub)
        dev_id, device = await connect(hub, nursery)
        device.silent = True  # never answers: the hub gives up after its command timeout
        tunnel_error(await open_session(hub, token, dev_id), 504, "device_unreachable")
        device.scope.cancel()  # offline, with a known identity and targets: 504 too
        await wait_for(lambda: uuid.UUID(dev_id) not in hub.services.links)
        tunnel_error(await open_session(hub, token, dev_id), 504, "device_unreachable")

        class FaultyKey:
            """Fault injection: a signing key that fails (an HSM or key store outage)."""

            def sign(self, data: bytes) -> bytes:
                raise OSError("key store unavailable")

        dev2, device2 = await connect(hub, nursery)
        hub.services.tunnels.grants.keys.current = FaultyKey()
        body = tunnel_error(await open_session(hub, token, dev2), 500, "grant_rejected")
        assert "key store" not in body["message"]
        assert device2.sent("tunnel.open") == []
        hub.services.settings = dataclasses.replace(hub.services.settings, tunnels_enabled=False)
        tunnel_error(await open_session(hub, token, dev2), 503, "tunnels_unavailable")


async def test_another_organisation_cannot_reach_sessions_or_devices(hub, nursery):
    with trio.fail_after(30):
        await entitle(hub)
        dev_id, device = await connect(hub, nursery)
        data = (await open_session(hub, await tunnel_token(hub), dev_id)).json()["data"]
        sid = data["session_id"]
        s = hub.services
        org_b = await s.stores.orgs.create_org("Org B", s.clock.now())
        b = await hub.new_user("admin", str(org_b["id"]))
        await entitle(hub, str(org_b["id"]))
        b_token = await tunnel_token(hub, {"X-API-Token-ID": b[0], "X-API-Secret-Key": b[1],
                                           "X-Organization-ID": str(org_b["id"])})
        tunnel_error(await open_session(hub, b_token, dev_id), 404, "no_device_identity")
        tunnel_error(await hub.call("DELETE", f"/v1/cli/tunnel/session/{sid}", headers=bearer(b_token)),
                     404, "not_found")
        r = await hub.call("POST", f"/v1/cli/tunnel/session/{sid}/renew", headers=bearer(b_token),
                           json={"grant": data["grant"]})
        tunnel_error(r, 404, "not_found")
        # A's token named with B's organisation header is refused too.
        r = await hub.call("DELETE", f"/v1/cli/tunnel/session/{sid}",
                           headers={**bearer(await tunnel_token(hub)), "X-Organization-ID": str(org_b["id"])})
        tunnel_error(r, 403, "forbidden")
        assert device.sent("tunnel.close") == [] and len(device.sent("tunnel.open")) == 1
        assert (await s.tunnels.store.get(uuid.UUID(sid)))["state"] == "open"


async def test_admin_tunnel_entitle(hub):
    import argparse

    from hub.tunnels import admin

    parser = argparse.ArgumentParser()
    admin.add_parsers(parser.add_subparsers(dest="admin_command"))
    s = hub.services
    with trio.fail_after(30):
        args = parser.parse_args(["tunnel-entitle", hub.org_id, "--enabled", "--relay", "--max-sessions", "4",
                                  "--bandwidth-bps", "1000000"])
        out = await admin.run(s, args, s.clock.now())
        assert out["sessions_enabled"] is True and out["relay_allowed"] is True
        assert out["limits"]["max_sessions"] == 4 and out["limits"]["bandwidth_bps"] == 1_000_000
        out = await admin.run(s, parser.parse_args(["tunnel-entitle", hub.org_id, "--no-relay", "--default",
                                                     "max_sessions"]), s.clock.now())
        assert out["relay_allowed"] is False and out["sessions_enabled"] is True
        assert out["limits"]["max_sessions"] == 10 and out["limits"]["bandwidth_bps"] == 1_000_000
        data = (await hub.call("GET", "/v1/cli/tunnel/entitlements")).json()["data"]
        assert data["limits"] == out["limits"]
        with pytest.raises(SystemExit):
            await admin.run(s, parser.parse_args(["tunnel-entitle", str(uuid.uuid4()), "--enabled"]), s.clock.now())
        with pytest.raises(SystemExit):
            parser.parse_args(["tunnel-entitle", hub.org_id, "--max-sessions", "0"])
