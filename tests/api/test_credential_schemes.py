"""Route declarations (hub/auth/routes.py), the credential schemes' registry (hub/auth/schemes.py)
and the public limiter, as components: no hub, no database. The behaviour of whole requests is in
test_auth.py, test_access_control.py, tests/conformance/test_authentication.py and the tunnel tests."""

from __future__ import annotations

import datetime as dt
import functools
from types import SimpleNamespace
from unittest.mock import MagicMock

import jwt
import pytest

import hub.tunnels.auth as tunnel_auth  # registers the tunnel token's scheme, as the app's routes do
from hub.api.validation import DOCUMENTED
from hub.auth.ratelimit import RateLimiter, spend
from hub.auth.routes import DEFAULT, RouteAuth, declare, no_org, route_auth, session_only
from hub.auth.schemes import SCHEMES, header_credential
from hub.errors import RateLimited

NOW = dt.datetime(2026, 11, 27, 22, 30, tzinfo=dt.UTC)
GENERAL = ("pat", "jwt", "bearer", "session")


def _jwt(audience: str) -> str:
    return jwt.encode({"aud": audience, "sub": "user:x"}, "k" * 32, algorithm="HS256")


def test_a_declaration_is_found_through_wrappers_and_merged_with_the_one_inside():
    async def view():
        return None

    inner = no_org(view)

    @functools.wraps(inner)
    async def wrapper():
        return await inner()

    outer = session_only(wrapper)
    assert route_auth(outer) == RouteAuth(needs_org=False, only="session")
    assert route_auth(inner) == RouteAuth(needs_org=False)  # the inner declaration is not changed
    both = declare(tunnel_auth.also_tunnel_token(outer), also=frozenset({"other"}))
    assert route_auth(both).also == {"tunnel", "other"}
    assert not [name for name in vars(outer) if name.startswith("_fleethub")]


def test_every_route_of_the_app_is_read_from_the_declarations_and_no_view_carries_a_flag():
    from hub.app import create_app

    services = MagicMock()
    services.settings.trusted_proxy_hops = 0
    services.extras = {}
    app = create_app(services)
    by_rule = {(rule.rule, method): route_auth(app.view_functions[rule.endpoint])
               for rule in app.url_map.iter_rules() for method in rule.methods}
    assert by_rule[("/healthz", "GET")].public
    assert by_rule[("/v1/me", "GET")] == RouteAuth(needs_org=False)
    assert by_rule[("/v1/devices", "GET")] == DEFAULT
    assert by_rule[("/v1/rollouts/<rollout_id>", "GET")].org_of is not None
    assert by_rule[("/v1/assistant/chat/completions", "POST")].only == "session"
    session = by_rule[("/v1/cli/tunnel/session", "POST")]
    assert session.only == "tunnel" and session.org_in_credential
    assert by_rule[("/v1/billing/tunnel/usage", "GET")].also == {"tunnel"}
    documented = {(rule.rule, method): DOCUMENTED.of(app.view_functions[rule.endpoint])
                  for rule in app.url_map.iter_rules() for method in rule.methods}
    assert documented[("/v1/billing/features/<feature>", "PUT")].path_values
    assert documented[("/v1/devices/<id>/memory-test", "POST")].body_optional
    assert not documented[("/v1/devices", "POST")].body_optional
    for view in app.view_functions.values():
        assert not [name for name in vars(view) if name.startswith("_fleethub")], view


@pytest.mark.parametrize("route, kinds", [
    (DEFAULT, GENERAL),
    (RouteAuth(only="session"), GENERAL),  # the others are looked for to be refused (403)
    (RouteAuth(also=frozenset({"tunnel"})), ("pat", "tunnel", "jwt", "bearer", "session")),
    (RouteAuth(only="tunnel", needs_org=False, org_in_credential=True), ("pat", "tunnel", "jwt", "bearer", "session")),
])
def test_the_schemes_asked_on_each_kind_of_route(route, kinds):
    assert tuple(s.kind for s in SCHEMES.asked(route)) == kinds


def _found(headers: dict[str, str], route: RouteAuth = DEFAULT, cookie: str | None = None) -> str | None:
    req = SimpleNamespace(cookies={"fleethub_session": cookie} if cookie else {})
    found = SCHEMES.find(req, headers, route)
    return None if found is None else found[0].kind


def test_the_first_scheme_that_finds_its_credential_decides():
    also = RouteAuth(also=frozenset({"tunnel"}))
    only = RouteAuth(only="tunnel", needs_org=False, org_in_credential=True)
    tunnel_token, service_token = _jwt("fleethub-tunnel"), _jwt("fleethub-api")
    pat = {"x-api-token-id": "pat_1", "x-api-secret-key": "s"}
    assert _found(pat | {"authorization": "Bearer x"}, cookie="c") == "pat"
    assert _found({"authorization": "Bearer plain-secret"}, cookie="c") == "bearer"
    assert _found({"authorization": f"bearer {service_token}"}) == "jwt"
    assert _found({"authorization": f"Bearer {tunnel_token}"}) == "jwt"  # not looked for on this route
    assert _found({"authorization": f"Bearer {tunnel_token}"}, also) == "tunnel"
    assert _found({"authorization": f"Bearer {service_token}"}, also) == "jwt"
    assert _found({"authorization": "Bearer plain-secret"}, only) == "tunnel"  # refused when verified
    assert _found(pat, only) == "pat"  # found to be refused: the route takes only tunnel tokens
    assert _found({"authorization": "Basic x"}, cookie="c") == "session"
    assert _found({"authorization": "Bearer "}) is None
    scheme, found = header_credential(pat)
    assert (scheme.kind, found.token_id, found.secret) == ("pat", "pat_1", "s")
    assert header_credential({"authorization": "Basic x"}) is None


def test_a_route_that_takes_one_scheme_refuses_the_others_in_its_words():
    session, tunnel = SCHEMES.named("session"), SCHEMES.named("tunnel")
    assert (session.missing().status, session.other().status, session.other().code) == (401, 403, "session_required")
    assert (tunnel.missing().status, tunnel.other().status) == (401, 401)
    assert "tunnel token" in tunnel.other().message


def test_the_public_limiter_counts_then_refuses_with_its_headers():
    limiter = RateLimiter()
    for left in (1, 0):
        decision = spend(limiter, ("org", "o"), "enterprise", 2, NOW)
        decision.raise_if_refused()
        assert decision.remaining == left
    refused = spend(limiter, ("org", "o"), "enterprise", 2, NOW)
    with pytest.raises(RateLimited) as caught:
        refused.raise_if_refused()
    assert caught.value.headers["X-RateLimit-Remaining"] == "0"
    assert caught.value.headers["Retry-After"] == str(refused.retry_after)
