"""Grant verification (webrtc/grant.py): pure, time is an argument."""

from __future__ import annotations

import base64
import datetime as dt
import json

import pytest
from nacl.signing import SigningKey

import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from webrtc.grant import (GRANT_VERSION, GrantError, check_for_device, parse_grant, same_session,
                          sign_grant, to_claims)
from webrtc.sdp import fingerprint, fingerprints, normalise_fingerprint

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
HUB = SigningKey(b"h" * 32)
KEYS = {"hub-1": base64.b64encode(bytes(HUB.verify_key)).decode()}
DEVICE_KEY = base64.b64encode(bytes(SigningKey(b"d" * 32).verify_key)).decode()
SDP = ("v=0\r\na=fingerprint:sha-256 ab:cd:EF:01\r\na=fingerprint:sha-384 11:22\r\na=setup:actpass\r\n")


def payload(**overrides):
    body = {"v": GRANT_VERSION, "kid": "hub-1", "sid": "s-1", "orgId": "o-1", "deviceId": "dev-1", "principal": "user:u-1",
            "target": "ssh", "notBefore": "2026-03-01T11:59:00.000Z", "expiresAt": "2026-03-01T12:05:00.000Z",
            "relay": False, "bandwidthBps": 1_000_000, "clientFingerprint": "sha-256 AB:CD:EF:01",
            "deviceKey": DEVICE_KEY}
    body.update(overrides)
    return body


def test_a_valid_grant_parses_with_its_fields():
    grant = parse_grant(sign_grant(payload(), HUB), KEYS, now=NOW)
    assert (grant.sid, grant.device_id, grant.target, grant.bandwidth_bps) == ("s-1", "dev-1", "ssh", 1_000_000)
    assert grant.expires_at == dt.datetime(2026, 3, 1, 12, 5, tzinfo=dt.timezone.utc)
    check_for_device(grant, device_id="dev-1", device_key=DEVICE_KEY, offer_fingerprints=fingerprints(SDP))


def test_a_forged_signature_is_refused():
    forged = sign_grant(payload(), SigningKey(b"x" * 32))  # right kid, wrong key
    with pytest.raises(GrantError, match="signature"):
        parse_grant(forged, KEYS, now=NOW)


def b64json(part: str) -> dict:
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


def test_a_grant_is_a_standard_eddsa_jwt_any_verifier_can_check():
    """Issue 16 section 5: the wire format is a JWT; checked here with PyNaCl alone, not the JWT library."""
    token = sign_grant(payload(), HUB)
    head, body, sig = token.split(".")
    assert b64json(head) == {"alg": "EdDSA", "kid": "hub-1", "typ": "JWT"}
    claims = b64json(body)
    assert claims["iss"] == "fleethub" and claims["aud"] == "fleethub:tunnel-grant" and "kid" not in claims
    assert claims["nbf"] == NOW.timestamp() - 60 and claims["exp"] == NOW.timestamp() + 300
    assert "notBefore" not in claims and "expiresAt" not in claims  # the window is the registered claims
    HUB.verify_key.verify(f"{head}.{body}".encode(), base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4)))
    assert parse_grant(token, KEYS, now=NOW).payload == payload()  # the payload round-trips whole


def test_an_altered_payload_is_refused():
    head, body, sig = sign_grant(payload(), HUB).split(".")
    altered = b64json(body)
    altered["target"] = "database"
    new_body = base64.urlsafe_b64encode(json.dumps(altered).encode()).rstrip(b"=").decode()
    with pytest.raises(GrantError, match="signature"):
        parse_grant(f"{head}.{new_body}.{sig}", KEYS, now=NOW)


def test_another_token_of_the_same_key_is_not_a_grant():
    """The hub's ring also signs access and signalling tokens: their audience keeps them apart."""
    key = Ed25519PrivateKey.from_private_bytes(bytes(HUB))
    kid, claims = to_claims(payload())
    for aud in ("fleethub:api", None):
        other = {**claims, "aud": aud} if aud else {k: v for k, v in claims.items() if k != "aud"}
        token = jwt.encode(other, key, algorithm="EdDSA", headers={"kid": kid})
        with pytest.raises(GrantError, match="audience|lacks aud"):
            parse_grant(token, KEYS, now=NOW)
    none_alg = jwt.encode(claims, None, algorithm="none", headers={"kid": kid})
    with pytest.raises(GrantError):
        parse_grant(none_alg, KEYS, now=NOW)


def test_wrong_device_or_device_key_is_refused():
    grant = parse_grant(sign_grant(payload(deviceId="dev-2"), HUB), KEYS, now=NOW)
    with pytest.raises(GrantError, match="another device"):
        check_for_device(grant, device_id="dev-1", device_key=DEVICE_KEY)
    grant = parse_grant(sign_grant(payload(deviceKey="AAAA"), HUB), KEYS, now=NOW)
    with pytest.raises(GrantError, match="tunnel identity"):
        check_for_device(grant, device_id="dev-1", device_key=DEVICE_KEY)


def test_expiry_and_not_before_follow_the_given_now():
    token = sign_grant(payload(), HUB)
    assert parse_grant(token, KEYS, now=NOW + dt.timedelta(minutes=4, seconds=59))
    with pytest.raises(GrantError, match="expired"):
        parse_grant(token, KEYS, now=NOW + dt.timedelta(minutes=5))
    early = sign_grant(payload(notBefore="2026-03-01T12:10:00Z", expiresAt="2026-03-01T12:20:00Z"), HUB)
    with pytest.raises(GrantError, match="not valid yet"):
        parse_grant(early, KEYS, now=NOW)


def test_an_unknown_kid_is_refused():
    with pytest.raises(GrantError, match="unknown key"):
        parse_grant(sign_grant(payload(kid="hub-2"), HUB), KEYS, now=NOW)


@pytest.mark.parametrize("token", ["", "abc", "a.b.c", "!!!.???", None])
def test_garbage_is_refused_with_invalid_grant(token):
    with pytest.raises(GrantError) as caught:
        parse_grant(token, KEYS, now=NOW)
    assert caught.value.code == "invalid_grant"


def test_missing_fields_and_wrong_version_are_refused():
    body = payload()
    del body["deviceKey"]
    with pytest.raises(GrantError, match="lacks deviceKey"):
        parse_grant(sign_grant(body, HUB), KEYS, now=NOW)
    with pytest.raises(GrantError, match="version"):
        parse_grant(sign_grant(payload(v=1), HUB), KEYS, now=NOW)


def test_the_offer_must_carry_the_granted_fingerprint():
    grant = parse_grant(sign_grant(payload(clientFingerprint="sha-256 00:11"), HUB), KEYS, now=NOW)
    with pytest.raises(GrantError, match="fingerprint"):
        check_for_device(grant, device_id="dev-1", device_key=DEVICE_KEY, offer_fingerprints=fingerprints(SDP))


def test_fingerprints_are_read_and_normalised():
    assert fingerprint(SDP) == "sha-256 AB:CD:EF:01"
    assert normalise_fingerprint("AB:cd") == "sha-256 AB:CD"
    with pytest.raises(ValueError):
        fingerprint("v=0\r\n")


def test_a_renewal_must_keep_the_session_and_extend_it():
    current = parse_grant(sign_grant(payload(), HUB), KEYS, now=NOW)
    renewed = parse_grant(sign_grant(payload(expiresAt="2026-03-01T12:10:00Z"), HUB), KEYS, now=NOW)
    same_session(current, renewed)
    other = parse_grant(sign_grant(payload(sid="s-2", expiresAt="2026-03-01T12:10:00Z"), HUB), KEYS, now=NOW)
    with pytest.raises(GrantError, match="sid"):
        same_session(current, other)
    with pytest.raises(GrantError, match="extend"):
        same_session(current, current)
