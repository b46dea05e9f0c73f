"""Tunnel sessions after they open, on a real hub with a scripted device: close, renew (and its
limits), the signalling socket, usage recording and metering, expiry, and a hub restart.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from decimal import Decimal

import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

from tests.api.test_tunnels import (COMMAND_TIMEOUT, bearer, connect, entitle, open_session, signal_url,
                                    tunnel_error, tunnel_hub, tunnel_token)
from tests.api.tunnel_device import OFFER
from tests.hubtools import start_hub, wait_for
from webrtc.grant import parse_grant


@pytest.fixture
async def hub(nursery, db_url, tmp_path):
    return await tunnel_hub(nursery, db_url, tmp_path)


# ---- close, renew, signalling -------------------------------------------------------------------------

async def test_close_only_by_its_principal(hub, nursery):
    with trio.fail_after(30):
        await entitle(hub)
        dev_id, device = await connect(hub, nursery)
        token = await tunnel_token(hub)
        sid = (await open_session(hub, token, dev_id)).json()["data"]["session_id"]
        other = await hub.new_user("admin")
        other_token = await tunnel_token(hub, {"X-API-Token-ID": other[0], "X-API-Secret-Key": other[1],
                                               "X-Organization-ID": hub.org_id})
        tunnel_error(await hub.call("DELETE", f"/v1/cli/tunnel/session/{sid}", headers=bearer(other_token)),
                     404, "not_found")
        r = await hub.call("DELETE", f"/v1/cli/tunnel/session/{sid}", headers=bearer(token))
        assert r.status_code == 200, r.text
        assert r.json()["data"] == {"session_id": sid, "closed": True, "device_acknowledged": True}
        assert device.sent("tunnel.close") == [{"sessionId": sid, "reason": "closed by the client"}]
        row = await hub.services.tunnels.store.get(uuid.UUID(sid))
        assert row["state"] == "closed" and row["closed_at"] is not None
        tunnel_error(await hub.call("DELETE", f"/v1/cli/tunnel/session/{sid}", headers=bearer(token)), 404, "not_found")
        tunnel_error(await hub.call("DELETE", f"/v1/cli/tunnel/session/{uuid.uuid4()}", headers=bearer(token)),
                     404, "not_found")
        # Audited: open and close, with the session id.
        await hub.services.audit_log.flush()
        r = await hub.call("GET", "/v1/audit-events", params={"pathPrefix": "/v1/cli/tunnel/session", "limit": 50})
        ops = {(e.get("details") or {}).get("operation") for e in r.json()["data"] if e["status"] == 200}
        assert {"tunnel.open", "tunnel.close"} <= ops, r.json()["data"]


async def test_renew(hub, nursery):
    with trio.fail_after(30):
        await entitle(hub)
        dev_id, device = await connect(hub, nursery)
        token = await tunnel_token(hub)
        first = (await open_session(hub, token, dev_id)).json()["data"]
        other = (await open_session(hub, token, dev_id, target="web")).json()["data"]
        sid = first["session_id"]
        await trio.sleep(1.2)  # wall time moves: the renewed window must end later
        r = await hub.call("POST", f"/v1/cli/tunnel/session/{sid}/renew", headers=bearer(token),
                           json={"grant": first["grant"]})
        assert r.status_code == 200, r.text
        renewed = r.json()["data"]
        old = parse_grant(first["grant"], device.hub_keys, now=hub.services.clock.now())
        new = parse_grant(renewed["grant"], device.hub_keys, now=hub.services.clock.now())
        assert new.expires_at > old.expires_at
        same = {k: v for k, v in old.payload.items() if k not in ("notBefore", "expiresAt")}
        assert same == {k: v for k, v in new.payload.items() if k not in ("notBefore", "expiresAt")}
        row = await hub.services.tunnels.store.get(uuid.UUID(sid))
        assert row["expires_at"] == new.expires_at
        url = f"/v1/cli/tunnel/session/{sid}/renew"
        # Altered payload, bad signature, another session's grant, garbage: 400 invalid_grant.
        head, body, sig = first["grant"].split(".")
        altered = json.loads(_unb64(body))
        altered["target"] = "web"
        forged = head + "." + _b64(json.dumps(altered, separators=(",", ":"), sort_keys=True).encode()) + "." + sig
        for bad in (forged, f"{head}.{body}.{sig[:-4]}AAAA", other["grant"], "not-a-grant"):
            tunnel_error(await hub.call("POST", url, headers=bearer(token), json={"grant": bad}), 400, "invalid_grant")
        tunnel_error(await hub.call("POST", f"/v1/cli/tunnel/session/{uuid.uuid4()}/renew", headers=bearer(token),
                                    json={"grant": first["grant"]}), 404, "not_found")
        # All checks run again: an organisation no longer entitled cannot renew.
        await entitle(hub, enabled=False)
        tunnel_error(await hub.call("POST", url, headers=bearer(token), json={"grant": renewed["grant"]}),
                     403, "tunnel_not_entitled")
        await hub.services.audit_log.flush()
        r = await hub.call("GET", "/v1/audit-events", params={"pathPrefix": url, "limit": 50})
        renewals = [e for e in r.json()["data"] if e["status"] == 200]
        assert [e["details"]["operation"] for e in renewals] == ["tunnel.renew"]
        assert renewals[0]["details"]["sessionId"] == sid
        assert first["grant"] not in r.text and renewed["grant"] not in r.text  # grants are never audited


async def test_openapi_documents_the_tunnel_token_scheme(hub):
    with trio.fail_after(30):
        doc = (await hub.client.get(hub.base_url + "/v1/openapi.json")).json()
        assert doc["components"]["securitySchemes"]["TunnelToken"]["scheme"] == "bearer"
        for path, method in (("/v1/cli/tunnel/session", "post"), ("/v1/cli/tunnel/session/{sid}", "delete"),
                             ("/v1/cli/tunnel/session/{sid}/renew", "post")):
            assert doc["paths"][path][method]["security"] == [{"TunnelToken": []}], path
        assert "429" in doc["paths"]["/v1/cli/tunnel/session"]["post"]["responses"]
        assert "security" not in doc["paths"]["/v1/cli/tunnel/entitlements"]["get"] or \
            doc["paths"]["/v1/cli/tunnel/entitlements"]["get"]["security"] != [{"TunnelToken": []}]


async def test_renewal_stops_at_the_session_length_and_unrenewed_sessions_expire(hub, nursery):
    with trio.fail_after(30):
        s = hub.services
        s.settings = dataclasses.replace(s.settings, tunnel_grant_seconds=2.0)
        await entitle(hub)
        dev_id, device = await connect(hub, nursery)
        token = await tunnel_token(hub)
        data = (await open_session(hub, token, dev_id, duration_seconds=3)).json()["data"]
        sid = data["session_id"]
        async with open_websocket_url(signal_url(hub, sid),
                                      extra_headers=[(b"authorization", f"Bearer {data['signalling_token']}".encode())]) as ws:
            await trio.sleep(1.5)
            r = await hub.call("POST", f"/v1/cli/tunnel/session/{sid}/renew", headers=bearer(token),
                               json={"grant": data["grant"]})
            assert r.status_code == 200, r.text
            assert r.json()["data"]["expires_at"] == data["max_expires_at"]  # capped by duration_seconds
            r = await hub.call("POST", f"/v1/cli/tunnel/session/{sid}/renew", headers=bearer(token),
                               json={"grant": r.json()["data"]["grant"]})
            tunnel_error(r, 429, "limit_exceeded")
            # Not renewed further: the hub ends it at expiry and tells the signalling socket.
            assert json.loads(await ws.get_message()) == {"type": "closed", "reason": "expired"}
        row = await s.tunnels.store.get(uuid.UUID(sid))
        assert row["state"] == "closed" and row["close_reason"] == "expired"
        assert row["duration_seconds"] >= Decimal(3)
        await s.audit_log.flush()
        r = await hub.call("GET", "/v1/audit-events", params={"pathPrefix": f"/v1/cli/tunnel/session/{sid}"})
        assert [e["details"]["operation"] for e in r.json()["data"] if e["method"] == "EVENT"] == ["tunnel.expire"]


async def test_signalling_socket(hub, nursery):
    with trio.fail_after(30):
        await entitle(hub)
        dev_id, device = await connect(hub, nursery)
        token = await tunnel_token(hub)
        data = (await open_session(hub, token, dev_id)).json()["data"]
        sid = data["session_id"]
        other = (await open_session(hub, token, dev_id, target="web")).json()["data"]
        # The signalling token opens its own session only; nothing else is a credential there.
        for bad in (other["signalling_token"], token, "garbage"):
            with pytest.raises(ConnectionRejected) as rejected:
                async with open_websocket_url(signal_url(hub, sid), extra_headers=[(b"authorization",
                                                                                    f"Bearer {bad}".encode())]):
                    pass
            assert rejected.value.status_code == 401
        async with open_websocket_url(signal_url(hub, sid) + "?token=" + data["signalling_token"]) as ws:
            await ws.send_message(json.dumps({"type": "ice_restart", "offer": OFFER}))
            answer = json.loads(await ws.get_message())
            assert answer["type"] == "answer" and answer["answer"]["sdp"].endswith("a=ice-restart\r\n")
            assert device.sent("tunnel.ice_restart") == [{"sessionId": sid, "offer": OFFER}]
        # What is not a signalling message closes that socket with the reason; the session lives on.
        for bad, code in (({"type": "dance"}, 4400), ("not json", 4400), ([1, 2], 4400),
                          ({"type": "ice_restart", "offer": {"sdp": 5}}, 4400),
                          ("[" * 5000 + "]" * 5000, 4400)):  # too deep for json: was a crash of the socket
            async with open_websocket_url(signal_url(hub, sid) + "?token=" + data["signalling_token"]) as ws:
                await ws.send_message(bad if isinstance(bad, str) else json.dumps(bad))
                with pytest.raises(ConnectionClosed) as closed:
                    await ws.get_message()
                assert closed.value.reason.code == code and "malformed" in closed.value.reason.reason
        # A second restart while the first is still with the device is out of order.
        device.silent = True
        async with open_websocket_url(signal_url(hub, sid) + "?token=" + data["signalling_token"]) as ws:
            await ws.send_message(json.dumps({"type": "ice_restart", "offer": OFFER}))
            await wait_for(lambda: len(device.sent("tunnel.ice_restart")) == 2)
            await ws.send_message(json.dumps({"type": "ice_restart", "offer": OFFER}))
            with pytest.raises(ConnectionClosed) as closed:
                await ws.get_message()
            assert closed.value.reason.code == 4409
        device.silent = False
        async with open_websocket_url(signal_url(hub, sid) + "?token=" + data["signalling_token"]) as ws:
            r = await hub.call("DELETE", f"/v1/cli/tunnel/session/{sid}", headers=bearer(token))
            assert r.status_code == 200
            assert json.loads(await ws.get_message()) == {"type": "closed", "reason": "closed by the client"}


async def test_usage_is_recorded_and_metered_once(hub, nursery):
    with trio.fail_after(30):
        await entitle(hub)
        dev_id, device = await connect(hub, nursery)
        token = await tunnel_token(hub)
        data = (await open_session(hub, token, dev_id)).json()["data"]
        sid = data["session_id"]
        s = hub.services
        usage = {"sessionId": sid, "bytesIn": 1000, "bytesOut": 500, "relayedBytes": 300, "durationSeconds": 30,
                 "final": False}
        for _ in range(3):  # repeated: counted once
            await device.event("tunnel.usage", usage)
        # Another device cannot report on this session.
        other_id, other = await connect(hub, nursery)
        await other.event("tunnel.usage", {**usage, "bytesIn": 10**9})

        async def recorded() -> bool:
            row = await s.tunnels.store.get(uuid.UUID(sid))
            return row["bytes_in"] == 1000
        await wait_for(recorded)
        async with open_websocket_url(signal_url(hub, sid) + "?token=" + data["signalling_token"]) as ws:
            await device.event("tunnel.usage", {**usage, "bytesIn": 4000, "durationSeconds": 90, "final": True,
                                                "reason": "peer closed"})
            assert json.loads(await ws.get_message()) == {"type": "closed", "reason": "peer closed"}
        await device.event("tunnel.usage", {**usage, "bytesIn": 4000, "durationSeconds": 90, "final": True})
        await trio.sleep(0.3)
        row = await s.tunnels.store.get(uuid.UUID(sid))
        assert (row["state"], row["close_reason"], row["bytes_in"], row["bytes_out"], row["relayed_bytes"]) == \
            ("closed", "peer closed", 4000, 500, 300)
        assert row["duration_seconds"] == Decimal(90)
        await s.meter.flush()
        day = s.clock.now().date()
        rows = await s.db.fetch("SELECT product, quantity FROM usage_daily WHERE org_id = $1 AND day = $2",
                                uuid.UUID(hub.org_id), day)
        got = {r["product"]: r["quantity"] for r in rows}
        assert got["tunnel_minutes"] == Decimal("1.5")
        assert got["tunnel_bytes"] == Decimal(4500 - 300) and got["tunnel_relayed_bytes"] == Decimal(300)
        # The device's end is audited once (no request caused it), the repeated final event not again.
        await s.audit_log.flush()
        r = await hub.call("GET", "/v1/audit-events", params={"pathPrefix": f"/v1/cli/tunnel/session/{sid}"})
        ends = [e for e in r.json()["data"] if (e.get("details") or {}).get("operation") == "tunnel.device_closed"]
        assert len(ends) == 1 and ends[0]["details"]["reason"] == "peer closed", r.json()["data"]
        # The session's changes are events of its device (docs/events.md), each once, with no grant in them
        async def logged() -> list[dict]:
            r = await hub.call("GET", "/v1/events", params={"type": "io.fleethub.tunnel.session", "subject": f"devices/{dev_id}"})
            assert r.status_code == 200, r.text
            return [e["data"] for e in r.json()["data"] if e["data"]["sessionId"] == sid]
        await wait_for(lambda: _closed_in(logged()), timeout=10)
        changes = await logged()
        assert [c["state"] for c in changes] in (["open", "closed"], ["closed"]), changes
        assert changes[-1]["reason"] == "peer closed" and changes[-1]["principalKind"]
        assert data["signalling_token"] not in json.dumps(changes)


async def _closed_in(changes) -> bool:
    return any(c["state"] == "closed" for c in await changes)


def _b64(data: bytes) -> str:
    import base64
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    import base64
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


async def test_open_sessions_expire_after_a_hub_restart(nursery, db_url, tmp_path):
    from tests.hubtools import open_hub, start_stoppable

    # The grant outlasts the restart (a few seconds on a loaded machine), so the session is still
    # open when the new hub resumes it; the expiry is then waited for, not assumed.
    grant = 8.0
    with trio.fail_after(60):
        first = await start_stoppable(nursery, lambda inner: start_hub(
            inner, db_url, tmp_path / "hub", command_timeout=COMMAND_TIMEOUT, tunnel_grant_seconds=grant))
        hub = first.value
        await entitle(hub)
        dev_id, device = await connect(hub, nursery)
        token = await tunnel_token(hub)
        data = (await open_session(hub, token, dev_id)).json()["data"]
        sid = uuid.UUID(data["session_id"])
        untouched = uuid.UUID((await open_session(hub, token, dev_id, target="web")).json()["data"]["session_id"])
        await first.stop()
        device.scope.cancel()
        # The same data dir: the same signing key, so the session's grant and token stay valid.
        services, base_url = await open_hub(nursery, db_url, tmp_path / "hub", tunnel_grant_seconds=grant)
        assert (await services.tunnels.store.get(sid))["state"] == "open"
        r = await hub.client.post(base_url + f"/v1/cli/tunnel/session/{sid}/renew", headers=bearer(token),
                                  json={"grant": data["grant"]})
        assert r.status_code == 200, r.text  # resumed: the session is known and renewable

        async def expired() -> bool:
            rows = [await services.tunnels.store.get(x) for x in (sid, untouched)]
            return all(row["state"] == "closed" and row["close_reason"] == "expired" for row in rows)
        await wait_for(expired, timeout=grant + 10)  # the untouched one too: resumed at start, not by a request
