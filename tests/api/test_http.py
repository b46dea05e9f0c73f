"""HTTP hygiene of a real hub: JSON error bodies everywhere, request ids, health, metrics, OpenAPI."""

from __future__ import annotations

import json
import re
import uuid

import httpx
import pytest
import trio

from hub.app import create_app
from tests.hubtools import assert_error, metric_value, metrics, start_hub

KNOWN_PATHS = {
    "/v1/devices", "/v1/devices/{device_id}", "/v1/devices/{device_id}/reboot", "/v1/devices/{device_id}/ping",
    "/v1/fleets", "/v1/fleets/{fleet_id}", "/v1/pats", "/v1/pats/{pat_id}",
}


@pytest.fixture
async def hub(nursery, db_url, tmp_path):
    return await start_hub(nursery, db_url, tmp_path)


async def test_unknown_route_is_json_404(hub):
    with trio.fail_after(20):
        for headers in (hub.headers, {}):
            r = await hub.call("GET", "/v1/no-such-thing", headers=headers)
            assert_error(r, 404, "not_found")
        r = await hub.call("GET", "/definitely/not/here.html", headers={"Accept": "text/html"})
        assert_error(r, 404, "not_found")


async def test_wrong_method_is_json_405_with_allow(hub):
    with trio.fail_after(20):
        r = await hub.call("PUT", "/v1/devices")
        assert_error(r, 405, "method_not_allowed")
        allowed = {m.strip() for m in r.headers["allow"].split(",")}
        assert {"GET", "POST"} <= allowed
        r = await hub.call("DELETE", "/healthz", headers={})
        assert_error(r, 405, "method_not_allowed")
        r = await hub.call("POST", f"/v1/fleets/{uuid.uuid4()}")
        assert_error(r, 405, "method_not_allowed")


@pytest.mark.parametrize("raw", [b"{", b"not json", b"\xff\xfe", b"[1, 2]", b""])
async def test_malformed_json_is_400(hub, raw):
    with trio.fail_after(20):
        for path in ("/v1/devices", "/v1/fleets", "/v1/pats"):
            r = await hub.call("POST", path, content=raw,
                               headers={**hub.headers, "Content-Type": "application/json"})
            assert_error(r, 400, "malformed_json")


async def test_unknown_and_missing_fields_are_400_naming_the_field(hub):
    with trio.fail_after(20):
        r = await hub.call("POST", "/v1/devices", json={"name": "a", "colour": "red"})
        body = assert_error(r, 400, "unknown_field")
        assert "colour" in body["message"]
        r = await hub.call("POST", "/v1/devices", json={"tags": []})
        body = assert_error(r, 400, "missing_field")
        assert "name" in body["message"]
        r = await hub.call("POST", "/v1/fleets", json={"description": "no name"})
        body = assert_error(r, 400, "missing_field")
        assert "name" in body["message"]
        r = await hub.call("POST", "/v1/fleets", json={"name": "f", "owner": "me"})
        assert_error(r, 400, "unknown_field")
        r = await hub.call("POST", "/v1/devices", json={"name": ""})
        assert_error(r, 400)
        # nothing was created by the rejected requests
        r = await hub.call("GET", "/v1/devices")
        assert r.json()["pagination"]["total"] == 0


BIG_BODY = b'{"name": "' + b"x" * (2 * 1024 * 1024) + b'"}'


async def test_oversized_body_is_json_413(hub):
    with trio.fail_after(20):
        # its own connection: see the keep-alive test below for what happens to the connection
        async with httpx.AsyncClient(timeout=10) as client:
            r = await client.post(hub.base_url + "/v1/devices", content=BIG_BODY,
                                  headers={**hub.headers, "Content-Type": "application/json"})
        assert_error(r, 413, "payload_too_large")
        r = await hub.call("GET", "/v1/devices")
        assert r.json()["pagination"]["total"] == 0


async def test_connection_after_413_is_closed_or_usable(hub):
    with trio.fail_after(60):
        for _ in range(5):
            async with httpx.AsyncClient(timeout=10) as client:
                r = await client.post(hub.base_url + "/v1/devices", content=BIG_BODY,
                                      headers={**hub.headers, "Content-Type": "application/json"})
                assert r.status_code == 413
                assert r.headers.get("connection", "").lower() == "close", \
                    "the unread body makes the connection unusable; the server must say so"
                with trio.fail_after(5):
                    r = await client.get(hub.base_url + "/v1/devices", headers=hub.headers)
                assert r.status_code == 200


async def test_request_id_on_every_response_and_echoed(hub):
    with trio.fail_after(20):
        seen = set()
        for method, path, headers in [("GET", "/healthz", {}), ("GET", "/readyz", {}), ("GET", "/metrics", {}),
                                      ("GET", "/v1/openapi.json", {}), ("GET", "/v1/devices", hub.headers),
                                      ("GET", "/v1/devices", {}), ("GET", "/nope", {}),
                                      ("PUT", "/v1/devices", hub.headers)]:
            r = await hub.call(method, path, headers=headers)
            rid = r.headers.get("x-request-id")
            assert rid, (method, path, r.status_code)
            seen.add(rid)
        assert len(seen) == 8, "each response gets its own id"
        for method, path, headers in [("GET", "/healthz", {}), ("GET", "/v1/devices", hub.headers),
                                      ("GET", "/v1/devices", {}), ("GET", "/nope", {})]:
            r = await hub.call(method, path, headers={**headers, "X-Request-ID": "trace-abc-123"})
            assert r.headers["x-request-id"] == "trace-abc-123", (method, path, r.status_code)


async def test_health_and_readiness(hub):
    with trio.fail_after(20):
        r = await hub.call("GET", "/healthz", headers={})
        assert r.status_code == 200 and r.json()["data"]["status"] == "ok"
        r = await hub.call("GET", "/readyz", headers={})
        assert r.status_code == 200
        assert r.json()["data"] == {"status": "ready", "database": "ok"}


async def test_metrics_prometheus_text(hub):
    with trio.fail_after(20):
        await hub.call("GET", "/v1/devices")
        await hub.call("GET", "/v1/no-such")
        r = await hub.client.get(hub.base_url + "/metrics")
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain")
        text = r.text
        for name, kind in [("fleethub_connected_devices", "gauge"), ("fleethub_http_requests_total", "counter"),
                           ("fleethub_actor_restarts_total", "counter"),
                           ("fleethub_storage_crossing_seconds", "histogram")]:
            assert f"# TYPE {name} {kind}" in text, name
        assert metric_value(text, "fleethub_connected_devices") == 0
        assert metric_value(text, "fleethub_actor_restarts_total") == 0
        assert metric_value(text, "fleethub_http_requests_total", {"method": "GET", "status": "200"}) >= 1
        assert metric_value(text, "fleethub_http_requests_total", {"method": "GET", "status": "404"}) == 1
        count = metric_value(text, "fleethub_storage_crossing_seconds_count")
        assert count and count > 0, "the GET /v1/devices crossed into storage"
        assert metric_value(text, "fleethub_storage_crossing_seconds_bucket", {"le": "+Inf"}) == count
        # every sample line is `name{labels} number`
        sample = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_]+="[^"]*"(,[a-zA-Z_]+="[^"]*")*\})? '
                            r'[-+]?(\d+(\.\d*)?([eE][-+]?\d+)?|\+Inf|NaN)$')
        for line in text.splitlines():
            if line and not line.startswith("#"):
                assert sample.match(line), line
        before = metric_value(await metrics(hub), "fleethub_http_requests_total", {"method": "GET", "status": "404"})
        await hub.call("GET", "/v1/no-such")
        after = metric_value(await metrics(hub), "fleethub_http_requests_total", {"method": "GET", "status": "404"})
        assert after == before + 1


async def test_openapi_document_is_public(hub):
    with trio.fail_after(20):
        for headers in ({}, {"X-API-Token-ID": hub.pat[0], "X-API-Secret-Key": hub.pat[1]}, hub.headers):
            r = await hub.call("GET", "/v1/openapi.json", headers=headers)
            assert r.status_code == 200, r.text
            assert r.json()["openapi"].startswith("3.")
        r = await hub.call("GET", "/v1/docs", headers={})
        assert r.status_code == 200, r.text
        assert "text/html" in r.headers["content-type"]
        # Issue 31 item 6: Swagger UI came from a CDN with no integrity hash and no CSP. Now every
        # script the page loads is the hub's own, under a CSP that allows no other origin.
        csp = r.headers["Content-Security-Policy"]
        assert "script-src 'self';" in csp and "frame-ancestors 'none'" in csp
        sources = re.findall(r'(?:src|href)="([^"]+)"', r.text)
        assert sources and all(src.startswith("/v1/docs/") for src in sources), sources
        assert "<script>" not in r.text  # no inline script: the CSP would refuse it
        for src in sources:
            f = await hub.call("GET", src, headers={})
            assert f.status_code == 200 and len(f.content) > 100, src
        assert (await hub.call("GET", "/v1/docs/index.html", headers={})).status_code == 404  # allow-list
        assert (await hub.call("GET", "/v1/docs/..%2fapp.py", headers={})).status_code == 404


async def test_openapi_covers_every_route_and_security_schemes(hub):
    with trio.fail_after(20):
        r = await hub.call("GET", "/v1/openapi.json", headers={})
        assert r.status_code == 200
        doc = json.loads(r.text)
        assert re.match(r"^3\.\d+\.\d+$", doc["openapi"]), doc["openapi"]
        assert doc["info"]["title"]
        paths = doc["paths"]
        assert KNOWN_PATHS <= set(paths), KNOWN_PATHS - set(paths)

        # Every HTTP route the app registers (not the docs themselves, static files or the WebSocket).
        app = create_app(hub.services)
        registered: dict[str, set[str]] = {}
        for rule in app.url_map.iter_rules():
            if rule.websocket or rule.endpoint in ("static", "openapi") or rule.endpoint.startswith("docs_ui."):
                continue
            if rule.endpoint.startswith(("console.", "console_stream.", "console_usage.", "console_deliveries.")):
                continue  # the web console's pages, files and stream: not the /v1 API (docs/console.md)
            if rule.endpoint == "link.device_link_without_upgrade":
                continue  # a plain GET of the device link's WebSocket path (426): docs/device-protocol.md
            if rule.endpoint.startswith("registry."):
                continue  # the registry proxy: the distribution API for podman, not the /v1 API (docs/containers.md)
            path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", r"{\1}", rule.rule)
            registered.setdefault(path, set()).update(m.lower() for m in rule.methods - {"HEAD", "OPTIONS"})
        assert KNOWN_PATHS <= set(registered)
        for path, methods in registered.items():
            assert path in paths, f"{path} is not in the OpenAPI document"
            assert methods <= set(paths[path]), (path, methods, set(paths[path]))

        schemes = doc["components"]["securitySchemes"]
        assert schemes["ApiTokenAuth"] == {"type": "apiKey", "in": "header", "name": "X-API-Token-ID"}
        assert schemes["ApiSecretAuth"] == {"type": "apiKey", "in": "header", "name": "X-API-Secret-Key"}
        assert schemes["BearerAuth"]["type"] == "http" and schemes["BearerAuth"]["scheme"] == "bearer"
        # request models are documented: the device create body names its required field
        post = paths["/v1/devices"]["post"]
        assert "requestBody" in post
        ref = post["requestBody"]["content"]["application/json"]["schema"]
        if "$ref" in ref:
            ref = doc["components"]["schemas"][ref["$ref"].rsplit("/", 1)[1]]
        assert "name" in ref.get("required", [])


async def test_nul_characters_are_400_not_500(hub):
    with trio.fail_after(30):
        dev_id, _ = await hub.provision("ok")
        r = await hub.call("POST", "/v1/fleets", json={"name": "okf"})
        fleet_id = r.json()["data"]["id"]
        no_org = {k: v for k, v in hub.headers.items() if k != "X-Organization-ID"}
        cases = [
            ("POST", "/v1/devices", {"json": {"name": "bad\x00name"}}),
            ("POST", "/v1/devices", {"json": {"name": "n", "tags": ["t\x00"]}}),
            ("PATCH", f"/v1/devices/{dev_id}", {"json": {"name": "bad\x00"}}),
            ("GET", "/v1/devices?tag=a%00b", {}),
            ("POST", "/v1/fleets", {"json": {"name": "bad\x00fleet"}}),
            ("PATCH", f"/v1/fleets/{fleet_id}", {"json": {"description": "d\x00"}}),
            ("POST", "/v1/pats", {"json": {"description": "p\x00"}, "headers": no_org}),
        ]
        statuses = []
        for method, path, kw in cases:
            r = await hub.call(method, path, **kw)
            statuses.append((method, path, r.status_code))
        assert all(s == 400 for *_, s in statuses), statuses


async def test_oversized_headers_are_431_and_the_hub_stays_up(hub):
    """Request headers are capped (16 KiB in all, by hypercorn's HTTP/1.1 parser): 431."""
    with trio.fail_after(30):
        r = await hub.client.get(hub.base_url + "/v1/devices", headers={**hub.headers, "X-Padding": "a" * 64 * 1024})
        assert r.status_code == 431
        r = await hub.call("GET", "/v1/devices")
        assert r.status_code == 200


async def test_every_operation_documents_its_success(hub):
    """The OpenAPI document is the contract a fuzzer and a client read: every operation names the
    2xx it answers with (found missing by schemathesis's stateful phase)."""
    doc = (await hub.client.get(hub.base_url + "/v1/openapi.json")).json()
    missing = [f"{method.upper()} {path}" for path, ops in doc["paths"].items() for method, op in ops.items()
               if not any(str(status).startswith("2") for status in op.get("responses", {}))]
    assert missing == []


async def test_a_page_beyond_the_deepest_is_400_not_an_overflow(hub):
    for path in ("/v1/devices", "/v1/fleets", "/v1/rollouts", "/v1/audit-events"):
        r = await hub.call("GET", path, params={"page": 2**61, "limit": 50})
        assert r.status_code == 400, (path, r.status_code, r.text)


async def test_every_v1_answer_carries_the_rate_limit_headers(hub):
    """Spec, Limits: X-RateLimit-* on API responses — unknown routes, wrong methods, public routes
    and the OpenAPI document too (they count against the client's address)."""
    with trio.fail_after(20):
        answers = [await hub.call("GET", "/v1/no-such-thing", headers={}),
                   await hub.call("GET", "/v1/no-such-thing"),
                   await hub.call("PUT", "/v1/devices"),
                   await hub.call("GET", "/v1/openapi.json", headers={}),
                   await hub.call("POST", "/v1/auth/login", headers={}, json={"email": "a@b.c", "password": "x"}),
                   await hub.call("GET", "/v1/devices", headers={})]
        for r in answers:
            assert {"x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"} <= set(r.headers), \
                (r.request.method, r.request.url, r.status_code, dict(r.headers))
        # an unknown route spends one from the client address's budget; a public route (with limits
        # of its own) shows that budget without spending it
        # (the two unknown routes, the 405 and the unauthenticated call spent one each)
        spent = int(answers[0].headers["x-ratelimit-remaining"]) - 3
        assert int(answers[-1].headers["x-ratelimit-remaining"]) == spent
        again = await hub.call("GET", "/v1/no-such-thing", headers={})
        assert int(again.headers["x-ratelimit-remaining"]) == spent - 1
        doc = await hub.call("GET", "/v1/openapi.json", headers={})
        assert int(doc.headers["x-ratelimit-remaining"]) == spent - 1
        # outside /v1 (health, metrics) nothing is limited
        r = await hub.client.get(hub.base_url + "/healthz")
        assert "x-ratelimit-limit" not in r.headers
