"""Spec, Endpoints → Tunnel sessions; Errors → Tunnel session errors (field error_code). Opening a
session to a real device needs WebRTC peers: tests/api/test_tunnels_agent.py does that; here the
rows' authentication and the errors decided before the device is asked."""

from __future__ import annotations

import uuid

from tests.api.tunnel_device import OFFER
from tests.conformance.helpers import error_code


def _tunnel(spec, headers=None) -> dict:
    r = spec.call("POST", "/v1/cli/tunnel/token", headers=headers)
    assert r.status_code == 200, r.text
    return {"Authorization": f"Bearer {r.json()['data']['token']}"}


def _entitle(spec, org_id: str) -> None:
    async def entitle() -> None:
        s = spec.hub.services
        await s.tunnels.store.set_entitlement(uuid.UUID(org_id), {"enabled": True}, s.clock.now())

    spec.run(entitle)


def _open(spec, headers, device_id: str):
    return spec.call("POST", "/v1/cli/tunnel/session", headers=headers,
                     json={"device_id": device_id, "target": "ssh", "offer": OFFER})


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
