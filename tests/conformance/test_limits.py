"""Spec, Limits → the request-rate rows, Rate headers and Over the limit (the secret-file and
memory-test rows are in their sections' modules)."""

from __future__ import annotations

from tests.conformance.helpers import error_code
from tests.conformance.spec import RATE_HEADERS, RETRY_AFTER


def _limit(spec, headers) -> int:
    r = spec.call("GET", "/v1/devices", headers=headers)
    assert r.status_code == 200, r.text
    return int(r.headers["X-RateLimit-Limit"])


def test_limit_request_rate_standard_tier_1000_per_hour(spec):
    assert _limit(spec, spec.new_org("standard")) == 1000


def test_limit_request_rate_professional_tier_10000_per_hour(spec):
    assert _limit(spec, spec.new_org("professional")) == 10000


def test_limit_request_rate_enterprise_tier_custom(spec):
    assert _limit(spec, spec.new_org("enterprise", rate_limit=4321)) == 4321


def test_limit_rate_headers_on_api_responses(spec):
    answers = [spec.call("GET", "/v1/devices"), spec.call("GET", "/v1/devices/not-a-uuid"),
               spec.call("GET", "/v1/no-such-route"), spec.call("GET", "/v1/no-such-route", headers={}),
               spec.call("DELETE", "/v1/configurations"), spec.call("GET", "/v1/devices", headers={})]
    for r in answers:
        missing = [h for h in RATE_HEADERS if h not in r.headers]
        assert not missing, (r.request.method, str(r.request.url), r.status_code, missing)


def test_limit_over_the_limit_429(spec):
    headers = spec.new_org("enterprise", rate_limit=3)
    statuses = [spec.call("GET", "/v1/devices", headers=headers).status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    r = spec.call("GET", "/v1/devices", headers=headers)
    assert error_code(r, 429) and r.headers["X-RateLimit-Remaining"] == "0"
    assert int(r.headers[RETRY_AFTER]) >= 0  # as the OpenAPI document declares it on every 429
