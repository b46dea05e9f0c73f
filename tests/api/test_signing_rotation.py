"""Signing-key rotation with key ids (hub/auth/signing_keys.py): the ring on its own, then
`fleethub admin rotate-signing-key` beside a running hub. Tokens and grants signed before a rotation
stay good until they expire, new ones name the new key, a key the hub does not hold is refused, and a
connected real agent takes grants of the new key without reconnecting (the hub pushes link.keys)."""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import re
import uuid

import jwt
import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from device_client.tunnel import TunnelConfig
from hub.admin import run_admin
from hub.auth.oauth import InvalidToken, TokenSigner
from hub.auth.signing_keys import (KEY_FILE, PREVIOUS_FILES, SigningKeyError, SigningKeys, kid_of, load_ring,
                                   rotate)
from hub.errors import DeviceError
from hub.tunnels.grants import GrantRejected, GrantSigner, InvalidGrant
from hub.tunnels.tokens import BadTunnelToken, TunnelTokens
from tests.api.test_identity import make_service_account
from tests.api.test_tunnels import bearer, entitle, tunnel_token
from tests.api.test_tunnels_agent import loopback_ice, real_offer  # noqa: F401 — loopback_ice is a fixture
from tests.hubtools import start_agent, start_hub, wait_for
from webrtc.grant import GRANT_VERSION, parse_grant, sign_grant

NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.timezone.utc)
SA, ORG = uuid.uuid4(), uuid.uuid4()
ROTATE = argparse.Namespace(admin_command="rotate-signing-key")


def header_kid(token: str) -> str | None:
    return jwt.get_unverified_header(token).get("kid")


def resign(token: str, key: Ed25519PrivateKey, kid: str | None) -> str:
    """The same claims signed by ``key``, with ``kid`` in the header (none when None)."""
    claims = jwt.decode(token, options={"verify_signature": False})
    return jwt.encode(claims, key, algorithm="EdDSA", headers={"kid": kid} if kid else None)


def grant_body(kid: str) -> dict:
    return {"v": GRANT_VERSION, "kid": kid, "sid": str(uuid.uuid4()), "target": "ssh",
            "notBefore": "2026-03-01T12:00:00.000Z", "expiresAt": "2026-03-01T12:05:00.000Z"}


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


# ---- the ring on its own -----------------------------------------------------------------------

def test_ring_files_rotation_and_the_two_previous_keys(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEETHUB_JWT_KEY", raising=False)
    ring = SigningKeys.from_data_dir(tmp_path)
    first = ring.kid
    assert re.fullmatch(r"hub-[0-9a-f]{16}", first) and ring.kids == [first]
    assert GrantSigner(ring).kid == first == kid_of(ring.current.public_key())
    assert oct((tmp_path / KEY_FILE).stat().st_mode & 0o777) == "0o600"
    first_pem = (tmp_path / KEY_FILE).read_bytes()

    result = rotate(tmp_path)
    assert ring.kids == [first]  # a ring follows only when told (reload, on NOTIFY)
    ring.reload()
    second = ring.kid
    assert result == {"rotated": True, "kids": [second, first]} and second != first
    assert (tmp_path / PREVIOUS_FILES[0]).read_bytes() == first_pem
    assert set(ring.hub_keys) == {second, first} and next(iter(ring.hub_keys)) == second

    rotate(tmp_path)
    rotate(tmp_path)
    ring.reload()
    assert len(ring.kids) == 3 and first not in ring.kids and ring.kids[2] == second  # two previous at most
    for name in (KEY_FILE, *PREVIOUS_FILES):
        assert oct((tmp_path / name).stat().st_mode & 0o777) == "0o600"
    assert not list(tmp_path.glob("*.tmp"))


def test_a_crash_half_way_leaves_a_ring_that_holds_every_key(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEETHUB_JWT_KEY", raising=False)
    ring = SigningKeys.from_data_dir(tmp_path)
    # Crashed after "previous := current", before the new key was written: the key is there twice.
    (tmp_path / PREVIOUS_FILES[0]).write_bytes((tmp_path / KEY_FILE).read_bytes())
    ring.reload()
    assert ring.kids == [kid_of(load_ring(tmp_path)[0].public_key())]
    rotate(tmp_path)  # the next rotation completes the job
    ring.reload()
    assert len(ring.kids) == 2
    # a ring file that cannot be read (a NOTIFY must not stop the hub): the keys held so far stay
    kids = ring.kids
    (tmp_path / KEY_FILE).write_bytes(b"not a key")
    ring.reload()
    assert ring.kids == kids


def test_a_key_from_the_environment_is_rotated_where_it_is_kept(tmp_path, monkeypatch):
    from cryptography.hazmat.primitives import serialization

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    monkeypatch.setenv("FLEETHUB_JWT_KEY", pem)
    ring = SigningKeys.from_data_dir(tmp_path)
    assert ring.kids == [kid_of(key.public_key())]
    with pytest.raises(SigningKeyError, match="FLEETHUB_JWT_KEY"):
        rotate(tmp_path)
    assert not (tmp_path / KEY_FILE).exists()


def test_jwts_carry_the_kid_and_verify_by_it(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEETHUB_JWT_KEY", raising=False)
    ring = SigningKeys.from_data_dir(tmp_path)
    signer, tunnels = TokenSigner(ring), TunnelTokens(ring)
    old_kid, old_key = ring.kid, ring.current
    old = signer.issue(SA, ORG, NOW)
    old_tunnel, _ = tunnels.issue("user", SA, ORG, "pat-1", NOW)
    assert header_kid(old) == header_kid(old_tunnel) == old_kid
    legacy = resign(old, old_key, None)  # issued before key ids existed: no kid, the current key

    assert signer.verify(legacy, NOW).service_id == SA
    rotate(tmp_path)
    ring.reload()
    new = signer.issue(SA, ORG, NOW)
    assert header_kid(new) == ring.kid != old_kid
    assert header_kid(tunnels.issue("user", SA, ORG, "pat-1", NOW)[0]) == ring.kid
    # signed before the rotation: still good until it expires; after that, not
    assert signer.verify(old, NOW).service_id == SA and signer.verify(new, NOW).org_id == ORG
    assert tunnels.verify(old_tunnel, NOW).subject_id == SA
    with pytest.raises(InvalidToken):
        signer.verify(old, NOW + dt.timedelta(hours=2))
    # no kid now means the new current key, so the old key's legacy token no longer verifies
    with pytest.raises(InvalidToken):
        signer.verify(legacy, NOW)
    assert signer.verify(resign(old, ring.current, None), NOW).service_id == SA
    stranger = Ed25519PrivateKey.generate()
    for forged in (resign(old, stranger, kid_of(stranger.public_key())),  # a key the hub does not hold
                   resign(old, stranger, ring.kid), resign(old, stranger, old_kid),  # claiming a key it holds
                   resign(old, stranger, None)):
        with pytest.raises(InvalidToken):
            signer.verify(forged, NOW)
    with pytest.raises(BadTunnelToken):
        tunnels.verify(resign(old_tunnel, stranger, kid_of(stranger.public_key())), NOW)
    # a kid that is not a string (pyjwt will not write one, so the header is made by hand)
    head = b64url(json.dumps({"alg": "EdDSA", "typ": "JWT", "kid": ["hub-x"]}).encode())
    body = new.split(".")[1]
    weird = f"{head}.{body}." + b64url(ring.current.sign(f"{head}.{body}".encode()))
    with pytest.raises(InvalidToken):
        signer.verify(weird, NOW)


def test_grants_of_the_previous_key_verify_and_new_ones_name_the_current_key(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEETHUB_JWT_KEY", raising=False)
    ring = SigningKeys.from_data_dir(tmp_path)
    grants = GrantSigner(ring)
    old_kid = grants.kid
    old = grants.sign(grant_body(old_kid))
    rotate(tmp_path)
    ring.reload()
    assert grants.kid != old_kid and set(grants.hub_keys) == {grants.kid, old_kid}
    assert grants.verify(old)["kid"] == old_kid
    assert grants.verify(grants.sign(grant_body(grants.kid)))["kid"] == grants.kid
    with pytest.raises(GrantRejected):
        grants.sign(grant_body(old_kid))  # devices would look the old key up for a new-key signature
    stranger = GrantSigner(Ed25519PrivateKey.generate())
    with pytest.raises(InvalidGrant):
        grants.verify(stranger.sign(grant_body(stranger.kid)))
    # a stranger's signature over a payload that names our current key
    with pytest.raises(InvalidGrant, match="signature"):
        grants.verify(sign_grant(grant_body(grants.kid), stranger.keys.current))


# ---- beside a running hub ----------------------------------------------------------------------

async def _access_token(hub, sa) -> str:
    r = await hub.client.post(hub.base_url + "/v1/oauth/token", data={
        "grant_type": "client_credentials", "client_id": sa["client_id"], "client_secret": sa["client_secret"]})
    assert r.status_code == 200, r.text
    return r.json()["access_token"]


async def test_tokens_issued_before_a_rotation_by_run_admin_stay_valid(nursery, db_url, tmp_path, monkeypatch):
    monkeypatch.delenv("FLEETHUB_JWT_KEY", raising=False)
    with trio.fail_after(60):
        data = tmp_path / "hub"
        hub = await start_hub(nursery, db_url, data)
        s = hub.services
        await entitle(hub)
        sa = await make_service_account(hub, [{"relation": "viewer"}])
        old_access = await _access_token(hub, sa)
        old_tunnel = await tunnel_token(hub)
        old_kid = s.access.signing_keys.kid
        assert header_kid(old_access) == header_kid(old_tunnel) == old_kid
        old_pem = (data / KEY_FILE).read_bytes()

        async def devices(token):
            return await hub.client.get(hub.base_url + "/v1/devices",
                                        headers={"X-Organization-ID": hub.org_id, "Authorization": f"Bearer {token}"})

        async def tunnel_call(token):
            # a session that does not exist: 404 once the token is accepted, 401 when it is not
            return await hub.call("DELETE", f"/v1/cli/tunnel/session/{uuid.uuid4()}", headers=bearer(token))

        result = await run_admin(s.settings, ROTATE)
        new_kid = result["kids"][0]
        assert result == {"rotated": True, "kids": [new_kid, old_kid]}
        assert (data / PREVIOUS_FILES[0]).read_bytes() == old_pem
        assert oct((data / KEY_FILE).stat().st_mode & 0o777) == "0o600"
        await wait_for(lambda: s.access.signing_keys.kid == new_kid, timeout=5)  # NOTIFY reached the hub

        assert (await devices(old_access)).status_code == 200
        assert (await tunnel_call(old_tunnel)).status_code == 404
        new_access, new_tunnel = await _access_token(hub, sa), await tunnel_token(hub)
        assert header_kid(new_access) == header_kid(new_tunnel) == new_kid
        assert (await devices(new_access)).status_code == 200
        assert (await tunnel_call(new_tunnel)).status_code == 404
        stranger = Ed25519PrivateKey.generate()
        for kid in (kid_of(stranger.public_key()), new_kid):
            assert (await devices(resign(old_access, stranger, kid))).status_code == 401
            assert (await tunnel_call(resign(old_tunnel, stranger, kid))).status_code == 401

        # two more rotations: the first key leaves the ring, and what it signed with it
        await run_admin(s.settings, ROTATE)
        result = await run_admin(s.settings, ROTATE)
        await wait_for(lambda: s.access.signing_keys.kids == result["kids"], timeout=5)
        assert old_kid not in result["kids"] and new_kid in result["kids"]
        assert (await devices(old_access)).status_code == 401
        assert (await tunnel_call(old_tunnel)).status_code == 401
        assert (await devices(new_access)).status_code == 200


async def test_a_connected_agent_takes_grants_of_the_new_key_without_reconnecting(nursery, db_url, tmp_path,
                                                                                    monkeypatch, loopback_ice):  # noqa: F811
    monkeypatch.delenv("FLEETHUB_JWT_KEY", raising=False)
    with trio.fail_after(90):
        hub = await start_hub(nursery, db_url, tmp_path / "hub", command_timeout=10.0)
        s = hub.services
        await entitle(hub)
        dev_id, token = await hub.provision("agent")
        config = TunnelConfig(targets={"echo": ("127.0.0.1", 9)}, allowed_ports=frozenset(), ssh=False)
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent", tunnel=config)
        agent = running.agent
        old_kid = s.access.signing_keys.kid
        assert list(agent.hub_keys) == [old_kid]
        ttoken = await tunnel_token(hub)
        peers = []

        async def open_echo():
            peer, offer = await real_offer()
            peers.append(peer)
            r = await hub.call("POST", "/v1/cli/tunnel/session", headers=bearer(ttoken),
                               json={"device_id": dev_id, "target": "echo", "offer": offer})
            assert r.status_code == 200, r.text
            return r.json()["data"]

        try:
            before = await open_echo()
            result = await run_admin(s.settings, ROTATE)
            new_kid = result["kids"][0]
            await wait_for(lambda: new_kid in agent.hub_keys, timeout=10)  # link.keys, pushed after the NOTIFY
            assert agent.hub_keys == s.tunnels.grants.hub_keys and set(agent.hub_keys) == {new_kid, old_kid}
            assert agent.statistics().links == 1  # the same link: no reconnect

            # the agent verifies a grant of the new key (it answers with its SDP) ...
            after = await open_echo()
            assert after["answer"]["type"] == "answer"
            assert parse_grant(after["grant"], agent.hub_keys, now=s.clock.now()).kid == new_kid
            # ... the grant of before still verifies, and its renewal is signed by the new key
            assert parse_grant(before["grant"], agent.hub_keys, now=s.clock.now()).kid == old_kid
            await trio.sleep(1.1)  # wall time moves: the renewed window must end later
            r = await hub.call("POST", f"/v1/cli/tunnel/session/{before['session_id']}/renew",
                               headers=bearer(ttoken), json={"grant": before["grant"]})
            assert r.status_code == 200, r.text
            renewed = parse_grant(r.json()["data"]["grant"], agent.hub_keys, now=s.clock.now())
            assert renewed.kid == new_kid and renewed.sid == before["session_id"]
            assert agent.statistics().links == 1
        finally:
            for peer in peers:
                await peer.close()

        # the device refuses a key set that is not one, and keeps the keys it has
        with pytest.raises(DeviceError) as refused:
            await s.bus.request(f"cmd.{dev_id}.link.keys", {"hubKeys": {"hub-x": "not base64!"}}, timeout=5)
        assert refused.value.code == "invalid_payload"
        assert agent.hub_keys == s.tunnels.grants.hub_keys
