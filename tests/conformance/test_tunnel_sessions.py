"""Spec, Endpoints → Tunnel sessions; Errors → Tunnel session errors (field error_code). Opening a
session to a real device needs WebRTC peers: tests/api/test_tunnels_agent.py does that; here the
rows' authentication, the errors decided before the device is asked (the limits, with open sessions
put in storage as the hub counts them) and the device that is gone. The device's own refusals and a
signing fault are pointed to in README.md."""

from __future__ import annotations

import datetime as dt
import uuid

from tests.api.tunnel_device import OFFER
from tests.conformance.helpers import error_code


def _tunnel(spec, headers=None) -> dict:
    r = spec.call("POST", "/v1/cli/tunnel/token", headers=headers)
    assert r.status_code == 200, r.text
    return {"Authorization": f"Bearer {r.json()['data']['token']}"}


def _entitle(spec, org_id: str, **limits) -> None:
    async def entitle() -> None:
        s = spec.hub.services
        await s.tunnels.store.set_entitlement(uuid.UUID(org_id), {"enabled": True, **limits}, s.clock.now())

    spec.run(entitle)


def _open(spec, headers, device_id: str, target: str = "ssh", **asked):
    return spec.call("POST", "/v1/cli/tunnel/session", headers=headers,
                     json={"device_id": device_id, "target": target, "offer": OFFER, **asked})


def _occupy(spec, device_id: str, count: int) -> list[uuid.UUID]:
    """``count`` open sessions on the device, as storage counts them against the limits."""
    async def occupy() -> list[uuid.UUID]:
        s = spec.hub.services
        now = s.clock.now()
        later = now + dt.timedelta(minutes=10)
        sids = []
        for _ in range(count):
            sid = uuid.uuid4()
            refused = await s.tunnels.store.open_session(
                {"id": sid, "org_id": uuid.UUID(spec.org_id), "device_id": uuid.UUID(device_id),
                 "principal_kind": "user", "principal_id": spec.hub.user_id, "target": "ssh",
                 "relay_allowed": False, "opened_at": now, "expires_at": later, "grant_payload": {},
                 "max_expires_at": later}, max_sessions=100, max_per_device=100)
            assert refused is None
            sids.append(sid)
        return sids

    return spec.run(occupy)


def _close(spec, sids: list[uuid.UUID]) -> None:
    async def close() -> None:
        s = spec.hub.services
        for sid in sids:
            await s.tunnels.store.finish(sid, "closed", "test", s.clock.now())

    spec.run(close)


def test_get_cli_tunnel_entitlements(spec):
    r = spec.call("GET", "/v1/cli/tunnel/entitlements", headers=spec.new_org())
    assert r.status_code == 200, r.text
    assert r.json()["data"]["sessions_enabled"] is False  # never entitled
    no_org = {k: v for k, v in spec.headers.items() if k != "X-Organization-ID"}
    assert error_code(spec.call("GET", "/v1/cli/tunnel/entitlements", headers=no_org), 400, "error_code")
    assert error_code(spec.call("GET", "/v1/cli/tunnel/entitlements", headers={"X-Organization-ID": spec.org_id}),
                      401, "error_code")


def test_post_cli_tunnel_session(spec):
    assert error_code(_open(spec, spec.headers, spec.device_id), 401, "error_code")  # a PAT is not a tunnel token
    org = spec.new_org()
    assert error_code(_open(spec, _tunnel(spec, org), str(uuid.uuid4())), 403, "error_code") == "tunnel_not_entitled"
    _entitle(spec, org["X-Organization-ID"])
    assert error_code(_open(spec, _tunnel(spec, org), str(uuid.uuid4())), 404, "error_code") == "no_device_identity"
    r = spec.call("POST", "/v1/cli/tunnel/session", headers=_tunnel(spec, org), json={"device_id": "x"})
    assert error_code(r, 400, "error_code")


def test_delete_cli_tunnel_session_by_sid(spec):
    assert error_code(spec.call("DELETE", f"/v1/cli/tunnel/session/{uuid.uuid4()}", headers=_tunnel(spec)), 404,
                      "error_code")
    assert error_code(spec.call("DELETE", f"/v1/cli/tunnel/session/{uuid.uuid4()}"), 401, "error_code")


def test_post_cli_tunnel_session_renew(spec):
    sid = uuid.uuid4()
    assert error_code(spec.call("POST", f"/v1/cli/tunnel/session/{sid}/renew", headers=_tunnel(spec),
                                json={"grant": "not-a-grant"}), 404, "error_code")  # no such session
    assert error_code(spec.call("POST", f"/v1/cli/tunnel/session/{sid}/renew", headers=_tunnel(spec),
                                json={"grunt": "x"}), 400, "error_code")
    assert error_code(spec.call("POST", f"/v1/cli/tunnel/session/{sid}/renew", json={"grant": "g"}), 401,
                      "error_code")


def test_error_code_target_not_configured_404_before_the_device_is_asked(spec):
    _entitle(spec, spec.org_id)
    for target in ("no-such-target", "9999"):  # a name and a port the device's hello did not list
        r = _open(spec, _tunnel(spec), spec.device_id, target=target)
        assert error_code(r, 404, "error_code") == "target_not_configured", target


def test_error_code_limit_exceeded_429(spec):
    _entitle(spec, spec.org_id)
    view = spec.call("GET", "/v1/cli/tunnel/entitlements").json()["data"]["limits"]
    for asked in ({"bandwidth_bps": view["bandwidth_bps"] + 1}, {"duration_seconds": view["max_session_seconds"] + 1}):
        r = _open(spec, _tunnel(spec), spec.device_id, **asked)
        assert error_code(r, 429, "error_code") == "limit_exceeded", asked


def test_error_code_device_busy_and_too_many_sessions_429(spec):
    other = spec.linked_device("tunnel")
    _entitle(spec, spec.org_id, max_sessions_per_device=1, max_sessions=2)
    sids = _occupy(spec, other, 1)
    try:
        assert error_code(_open(spec, _tunnel(spec), other), 429, "error_code") == "device_busy"
        sids += _occupy(spec, spec.offline_device_id, 1)  # two open in the organisation, its limit
        assert error_code(_open(spec, _tunnel(spec), spec.device_id), 429, "error_code") == "too_many_sessions"
    finally:
        _close(spec, sids)
        _entitle(spec, spec.org_id, max_sessions_per_device=None, max_sessions=None)


def test_error_code_device_unreachable_504(spec):
    gone = spec.linked_device("tunnel-gone")
    spec.unplug(gone)  # its identity and targets are known from its last hello; it is offline
    _entitle(spec, spec.org_id)
    assert error_code(_open(spec, _tunnel(spec), gone), 504, "error_code") == "device_unreachable"
