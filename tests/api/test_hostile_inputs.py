"""Inputs that are not valid are 4xx with a clear code, never a 500 (issue 14, section 3): each class
at its shared mechanism — the JSON body reader, the query/path/form text check, the date range
(hub/instants.py), the token decoders — and on a real hub the samples that were 500s.
tests/api/test_fuzz_inputs.py sends the same classes to every operation."""

from __future__ import annotations

import base64
import datetime as dt
import json
import uuid

import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hub import instants
from hub.api.validation import MAX_JSON_DEPTH, MalformedJSON, json_depth, strict_loads
from hub.auth.oauth import ISSUER, InvalidToken, TokenSigner
from hub.billing import periods
from hub.tunnels.grants import GrantSigner, InvalidGrant
from hub.tunnels.tokens import SIGNAL_AUDIENCE, TUNNEL_AUDIENCE, BadTunnelToken, TunnelTokens
from tests.api.assistant_helpers import sign_in
from tests.api.billing_helpers import admin, bearer
from tests.hubtools import assert_error, start_hub

NOW = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)


# ---- the JSON reader -----------------------------------------------------------------------------

@pytest.mark.parametrize("raw", [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
                                 b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1),
                                 b'{"spec": NaN}', b'{"spec": {"x": Infinity}}', b"[-Infinity]", b"[1e400]"])
def test_deep_json_and_non_numbers_are_malformed(raw):
    with pytest.raises(MalformedJSON):
        strict_loads(raw)


def test_json_at_the_depth_limit_and_ordinary_numbers_are_read():
    deepest = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert json_depth(strict_loads(deepest)) == MAX_JSON_DEPTH
    assert strict_loads(b'{"a": [1.5, -2, 1e300, "[[[[", {"b": null}]}') == {"a": [1.5, -2, 1e300, "[[[[", {"b": None}]}
    assert json_depth(1) == 0 and json_depth({}) == 1 and json_depth({"a": [{"b": []}]}) == 4


# ---- dates and instants --------------------------------------------------------------------------

@pytest.mark.parametrize("value", [dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1))),
                                   dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.timezone(-dt.timedelta(hours=1))),
                                   dt.datetime(9999, 12, 31, tzinfo=dt.UTC), dt.datetime(2026, 1, 1)])
def test_instants_at_the_calendar_ends_or_naive_are_refused(value):
    with pytest.raises(instants.OutOfRange):
        instants.check_instant(value)


def test_instants_in_range_come_back_in_utc():
    plus2 = dt.datetime(2026, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert instants.check_instant(plus2) == dt.datetime(2025, 12, 31, 23, tzinfo=dt.UTC)
    assert instants.check_date(dt.date(instants.MAX_YEAR, 12, 31)) == dt.date(9998, 12, 31)


@pytest.mark.parametrize("call", [
    lambda: periods.usage_days(None, "9999-12-31", NOW),            # + 1 day
    lambda: periods.usage_days("9999-12-31", None, NOW),
    lambda: periods.usage_days("0001-01-01T00:00:00+01:00", "2026-01-01", NOW),  # to UTC
    lambda: periods.registry_days("9999-12-31", None, NOW),
    lambda: periods.registry_days(None, "9999-12-31T23:59:59-01:00", NOW),
    lambda: periods.tunnel_window(None, "9999-12-31", NOW),
    lambda: periods.tunnel_window(None, "0001-01-01", NOW),           # - 30 days
])
def test_billing_ranges_at_the_calendar_ends_are_invalid_periods(call):
    with pytest.raises(periods.InvalidPeriod):
        call()


# ---- token decoders ------------------------------------------------------------------------------

KEY = Ed25519PrivateKey.generate()
SA, ORG = uuid.uuid4(), uuid.uuid4()
HOSTILE_CLAIMS = [{"exp": 1e30}, {"exp": "soon"}, {"exp": [1]}, {"exp": float("nan")}, {"nbf": 1e30},
                  {"sub": 123}, {"org": {"a": 1}}, {"sub": ["x"]}]


def _signed(claims: dict) -> str:
    return TokenSigner(KEY).keys.sign_jwt(claims)


def _deep_header_token() -> str:
    """A JWT whose header nests past Python's recursion limit: decoding it raised RecursionError."""
    head = base64.urlsafe_b64encode(b'{"a":' + b"[" * 3000 + b"]" * 3000 + b"}").rstrip(b"=").decode()
    return f"{head}.eyJhIjoxfQ.c2ln"


@pytest.mark.parametrize("patch", HOSTILE_CLAIMS)
def test_access_token_with_any_bad_claim_is_invalid(patch):
    claims = {"iss": ISSUER, "aud": "fleethub-api", "sub": str(SA), "org": str(ORG), "scope": "api",
              "iat": int(NOW.timestamp()), "exp": int(NOW.timestamp()) + 60, **patch}
    with pytest.raises(InvalidToken):
        TokenSigner(KEY).verify(_signed(claims), NOW)


@pytest.mark.parametrize("patch", HOSTILE_CLAIMS)
def test_tunnel_and_signalling_tokens_with_any_bad_claim_are_invalid(patch):
    sid = uuid.uuid4()
    base = {"iss": ISSUER, "iat": int(NOW.timestamp()), "exp": int(NOW.timestamp()) + 60, "org": str(ORG)}
    tunnel = {**base, "aud": TUNNEL_AUDIENCE, "sub": f"user:{SA}", "scope": "tunnel", **patch}
    signal = {**base, "aud": SIGNAL_AUDIENCE, "sub": str(sid), "scope": "tunnel.signal", **patch}
    tokens = TunnelTokens(KEY)
    with pytest.raises(BadTunnelToken):
        tokens.verify(_signed(tunnel), NOW)
    if "sub" not in patch:  # another subject is another session's token, refused before the org
        with pytest.raises(BadTunnelToken):
            tokens.verify_signal(_signed(signal), sid, NOW)


def test_a_grant_presented_for_renewal_nested_too_deep_is_invalid():
    deep = base64.urlsafe_b64encode(b"[" * 5000 + b"]" * 5000).rstrip(b"=").decode()
    with pytest.raises(InvalidGrant):
        GrantSigner(KEY).verify(f"{deep}.c2ln")


def test_a_token_nested_too_deep_is_invalid_everywhere():
    with pytest.raises(InvalidToken):
        TokenSigner(KEY).verify(_deep_header_token(), NOW)
    with pytest.raises(BadTunnelToken):
        TunnelTokens(KEY).verify(_deep_header_token(), NOW)
    with pytest.raises(BadTunnelToken):
        TunnelTokens(KEY).verify_signal(_deep_header_token(), uuid.uuid4(), NOW)


# ---- on a real hub: the reproduced 500s, each a clear 4xx and no traceback in the log -------------

async def test_the_reproduced_500s_are_4xx_with_their_codes(nursery, db_url, tmp_path, caplog):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        s = hub.services
        await admin(hub, tmp_path, "billing-profile", hub.org_id, "--plan", "pro")
        client = hub.client
        json_type = {"Content-Type": "application/json"}

        # JSON nested 100,000 deep, unauthenticated
        r = await client.post(hub.base_url + "/v1/auth/login", headers=json_type,
                              content=b'{"email":' + b"[" * 100_000 + b"]" * 100_000 + b"}")
        assert_error(r, 400, "malformed_json")
        # NaN / Infinity / a float beyond double in a configuration spec (jsonb refuses them)
        for spec in (b'{"a": NaN}', b'{"a": [Infinity]}', b'{"a": 1e400}'):
            r = await hub.call("POST", "/v1/configurations", headers={**hub.headers, **json_type},
                               content=b'{"name": "c", "spec": ' + spec + b"}")
            assert_error(r, 400, "malformed_json")
        # a lone surrogate ("\ud800" in JSON) or NUL cannot be stored in jsonb either
        for spec in (b'{"k": "\\ud800"}', b'{"\\udc00": 1}', b'{"k": "\\u0000"}'):
            r = await hub.call("POST", "/v1/configurations", headers={**hub.headers, **json_type},
                               content=b'{"name": "c", "spec": ' + spec + b"}")
            assert_error(r, 400, "invalid_field")

        # NUL in the OAuth form and in HTTP Basic: RFC 6749 error bodies
        r = await client.post(hub.base_url + "/v1/oauth/token", content=b"grant_type=client_credentials&client_id=%00"
                              b"&client_secret=x", headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert r.status_code == 400 and r.json()["error"] == "invalid_request", r.text
        basic = base64.b64encode(b"sa_%00:secret").decode()
        r = await client.post(hub.base_url + "/v1/oauth/token", data={"grant_type": "client_credentials"},
                              headers={"Authorization": f"Basic {basic}"})
        assert r.status_code == 401 and r.json()["error"] == "invalid_client", r.text

        # NUL or a lone surrogate in any query string or path parameter
        for path in ("/v1/configurations?search=%00", "/v1/configurations/summary?search=a%00",
                     "/v1/devices?tag=%00", "/v1/audit-events?pathPrefix=%00"):
            assert_error(await hub.call("GET", path), 400, "invalid_query")
        assert_error(await hub.call("GET", "/v1/fleets/%00"), 400, "invalid_path")

        # dates at the calendar's ends
        for path in ("/v1/billing/usage?to=9999-12-31", "/v1/billing/usage?from=0001-01-01T00:00:00%2B01:00",
                     "/v1/billing/registry-fallback?start=9999-12-31"):
            assert_error(await hub.call("GET", path), 400, "invalid_period")
        service = await bearer(hub, "billing_viewer")
        r = await client.get(hub.base_url + "/v1/billing/tunnel/usage?to=9999-12-31", headers=service)
        assert_error(r, 400, "invalid_period")
        cursor = base64.urlsafe_b64encode(json.dumps({"o": "0001-01-01T00:00:00+01:00", "i": str(uuid.uuid4())})
                                          .encode()).decode().rstrip("=")
        r = await client.get(hub.base_url + f"/v1/billing/tunnel/usage/records?cursor={cursor}", headers=service)
        assert_error(r, 400, "invalid_cursor")
        assert_error(await hub.call("GET", "/v1/audit-events?from=0001-01-01T00:00:00%2B01:00"), 400, "invalid_field")
        r = await hub.call("POST", "/v1/pats", json={"expires_at": "9999-12-31T23:59:59-01:00"})
        assert_error(r, 400, "invalid_field")
        assert (await hub.call("GET", "/v1/pats")).status_code == 200

        # credentials: a token signed with the hub's own key but an exp of 1e30; a header nested
        # too deep; a non-ASCII token id or CSRF token (hmac.compare_digest refuses such str)
        now = int(s.clock.now().timestamp())
        forged = s.access.token_signer.keys.sign_jwt({"iss": ISSUER, "aud": "fleethub-api", "sub": str(uuid.uuid4()),
                                               "org": hub.org_id, "scope": "api", "iat": now, "exp": 1e30})
        for token in (forged, _deep_header_token()):
            r = await hub.call("GET", "/v1/fleets", headers={"Authorization": f"Bearer {token}",
                                                             "X-Organization-ID": hub.org_id})
            assert_error(r, 401)
        tunnel = s.tunnels.tokens.keys.sign_jwt({"iss": ISSUER, "aud": TUNNEL_AUDIENCE, "sub": f"user:{hub.user_id}",
                                                 "org": hub.org_id, "scope": "tunnel", "iat": now, "exp": 1e30})
        r = await hub.call("POST", "/v1/cli/tunnel/session", json={"device_id": str(uuid.uuid4())},
                           headers={"Authorization": f"Bearer {tunnel}"})
        assert r.status_code == 401, r.text
        r = await hub.call("GET", "/v1/fleets", headers={**hub.headers, "X-API-Token-ID": "pat_\u00e9".encode()})
        assert_error(r, 401)
        browser = await sign_in(hub)
        r = await browser.client.post("/v1/fleets", json={"name": "f"},
                                      headers={**browser.headers, "X-CSRF-Token": "\u00e9t\u00e9".encode()})
        assert_error(r, 403, "csrf_required")

        unhandled = [r.getMessage() for r in caplog.records if r.name == "fleethub.http" and r.levelno >= 40]
        assert not unhandled, unhandled

