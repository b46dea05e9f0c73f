"""What the console's terminal needs from the tunnel API: GET /v1/cli/tunnel/ice-servers (the ICE servers a
client gathers its offer with before a session exists: docs/console.md, Terminal) and the shell target."""

from __future__ import annotations

import trio

from hub.tunnels.turn import credential
from tests.api.test_tunnels import bearer, entitle, hub, tunnel_error, tunnel_token  # noqa: F401


async def test_turn_credentials_only_when_the_organisation_may_relay(hub):  # noqa: F811
    with trio.fail_after(30):
        await entitle(hub, relay_allowed=True)
        token = await tunnel_token(hub)
        r = await hub.call("GET", "/v1/cli/tunnel/ice-servers", headers=bearer(token))
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        assert data["relay_allowed"] is True
        stun, turn = data["ice_servers"]
        assert stun == {"urls": ["stun:127.0.0.1:3478"]}
        assert turn["urls"] == ["turn:127.0.0.1:3478?transport=udp"]
        # coturn's TURN REST check: the password is the HMAC of the username under the hub's secret
        expiry, _, who = turn["username"].partition(":")
        assert who == f"user:{hub.user_id}" and int(expiry) > 0
        assert turn["credential"] == credential("s3cret-turn", who, _at(int(expiry)))[1]
        assert "s3cret-turn" not in r.text

        await entitle(hub, relay_allowed=False)
        r = await hub.call("GET", "/v1/cli/tunnel/ice-servers", headers=bearer(token))
        assert r.json()["data"] == {**r.json()["data"], "relay_allowed": False}
        assert r.json()["data"]["ice_servers"] == [{"urls": ["stun:127.0.0.1:3478"]}]


async def test_the_same_gate_as_opening_a_session(hub):  # noqa: F811
    with trio.fail_after(30):
        await entitle(hub)
        token = await tunnel_token(hub)
        await entitle(hub, enabled=False)
        tunnel_error(await hub.call("GET", "/v1/cli/tunnel/ice-servers", headers=bearer(token)), 403,
                     "tunnel_not_entitled")
        # a PAT is not a tunnel token: these routes take only the latter
        r = await hub.call("GET", "/v1/cli/tunnel/ice-servers")
        assert r.status_code == 401, r.text


def _at(seconds: int):
    import datetime as dt

    return dt.datetime.fromtimestamp(seconds, dt.UTC)


async def test_the_shell_target_reaches_the_device_and_its_refusal_is_a_conflict(hub, nursery):  # noqa: F811
    from tests.api.test_tunnels import connect, open_session
    from tests.api.tunnel_device import Refuse

    with trio.fail_after(30):
        await entitle(hub)
        # like ssh, shell is passed on to any device that advertises tunnel targets: it decides
        dev_id, device = await connect(hub, nursery, names=(), ports=(), ssh=False)
        device.refuse = Refuse("shell_disabled", "the shell target is disabled on this device")
        r = await open_session(hub, await tunnel_token(hub), dev_id, target="shell")
        body = tunnel_error(r, 409, "shell_disabled")
        assert body["message"] == "the shell target is disabled on this device"
        assert [verb for verb, _ in device.commands] == ["tunnel.open"]
