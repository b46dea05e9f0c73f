"""Hostile values sent to every operation of /v1/openapi.json of a real hub: none may answer 5xx
(issue 14, section 3: every input that is not valid gets a 4xx).

The classes of value, not samples: NUL, lone surrogates (``%ED%A0%80`` in a URL, ``"\\ud800"`` in
JSON), JSON nested 10,000 deep, dates at the calendar's ends with and without offsets, huge and
negative numbers, NaN and Infinity, overlong strings. Each goes to

- every query parameter the operation documents, one at a time, and once to every parameter name a
  view commonly reads without documenting it (``EXTRA_QUERY``);
- every path parameter (the others get real ids, so the request reaches the view's storage reads);
- every property of a JSON request body (the rest of the body is plausible), plus whole bodies that
  are deeply nested or carry NaN; every field of a form body;
- the headers every request may carry (request id, organisation, token id, CSRF token), not ASCII
  or overlong.

Operations are read from the document at run time, and the routes it leaves out (``@hide``: the
console's pages and its JSON API) from the app's URL map, so a new operation is covered without
touching this file; each gets the first credential (PAT, dashboard session, service-account token, tunnel
token) that its plain request does not refuse with 401/403. Server-sent event streams and WebSockets
are left out, as tests/api/test_fuzz_openapi.py does.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import trio

from tests.api.assistant_helpers import sign_in
from tests.api.billing_helpers import admin, bearer
from tests.api.test_fuzz_openapi import EXCLUDE
from tests.hubtools import start_agent, start_hub

# a net, not the budget: the run takes about 60 s on two cores, twice that when they are shared, and went
# past 240 s with the suite at -n 5 beside three busy processes
DEADLINE = 420
METHODS = ("get", "post", "put", "patch", "delete")
DEEP = 10_000


def _cursor(instant: str) -> str:
    """What an opaque cursor of an instant looks like (base64 of a JSON object) — a cursor that
    decodes to a date at the calendar's end."""
    import base64

    raw = json.dumps({"o": instant, "i": str(uuid.uuid4())}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


# (label, value already percent-encoded for a URL)
URL_VALUES: list[tuple[str, str]] = [
    ("nul", "%00"),
    ("nul-inside", "a%00b"),
    ("lone-surrogate", "%ED%A0%80"),
    ("deep-json", "[" * DEEP + "]" * DEEP),  # brackets may stay unencoded: 20 KB, not 60 KB
    ("date-min", "0001-01-01"),
    ("date-max", "9999-12-31"),
    ("instant-min-offset", quote("0001-01-01T00:00:00+01:00")),
    ("instant-max-offset", quote("9999-12-31T23:59:59-01:00")),
    ("instant-max-z", "9999-12-31T23:59:59.999999Z"),
    ("cursor-min", _cursor("0001-01-01T00:00:00+01:00")),
    ("huge", "1e30"),
    ("negative", "-1"),
    ("int64-overflow", str(2**63)),
    ("nan", "NaN"),
    ("infinity", "Infinity"),
    ("overlong", "x" * 10_000),
]

# (label, a JSON value as raw text)
JSON_VALUES: list[tuple[str, str]] = [
    ("nul", json.dumps("a\x00b")),
    ("lone-surrogate", '"\\ud800"'),
    ("deep-array", "[" * DEEP + "]" * DEEP),
    ("deep-object", '{"a":' * DEEP + "1" + "}" * DEEP),
    ("date-min", '"0001-01-01"'),
    ("date-max", '"9999-12-31"'),
    ("instant-min-offset", '"0001-01-01T00:00:00+01:00"'),
    ("instant-max-offset", '"9999-12-31T23:59:59-01:00"'),
    ("huge", "1e30"),
    ("overflowing-float", "1e400"),
    ("negative", "-1"),
    ("int64-overflow", str(2**63)),
    ("nan", "NaN"),
    ("infinity", "-Infinity"),
    ("overlong", json.dumps("x" * 100_000)),
]

# Whole bodies, for every operation that may take one (documented or not).
WHOLE_BODIES: list[tuple[str, bytes]] = [
    ("deep-array", b"[" * 100_000 + b"]" * 100_000),
    ("deep-object", b'{"a":' * 100_000 + b"1" + b"}" * 100_000),
    ("nan-member", b'{"name": NaN, "spec": {"x": Infinity}}'),
    ("bare-nan", b"NaN"),
    ("lone-surrogate-key", b'{"\\udc00": 1}'),
]

# Headers every request may carry, with bytes that are not ASCII (compare_digest refused such str)
# or a value far longer than any id; sent with the operation's credential.
HEADER_NAMES = ("X-Request-ID", "X-Organization-ID", "X-API-Token-ID", "X-CSRF-Token")
HEADER_VALUES: list[tuple[str, bytes]] = [("not-ascii", "pat_\u00e9\u00ff".encode()), ("overlong", b"x" * 8000)]

# Parameter names views read from the query string; the document may not list them all.
EXTRA_QUERY = ("page", "limit", "search", "status", "sortBy", "sortOrder", "state", "cursor", "from", "to",
               "start", "end", "tag", "fleet_id", "online", "method", "pathPrefix", "token")


@dataclass
class Operation:
    method: str
    path: str
    query: list[str]
    path_params: list[str]
    json_body: dict | None        # a plausible body, when the operation documents a JSON one
    form_body: dict | None        # a plausible form, when it documents a form
    auth: dict[str, str] = field(default_factory=dict)


@dataclass
class Fixture:
    ids: dict[str, str]           # the resource segment before a path parameter -> a real id
    credentials: list[dict[str, str]]


def _resolve(doc: dict, schema: dict) -> dict:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = doc["components"]["schemas"][name]
    return schema


def _plausible(doc: dict, schema: dict, name: str, ids: dict[str, str], depth: int = 0) -> Any:
    """A value a view would likely accept, so the hostile member is the one that matters."""
    schema = _resolve(doc, schema)
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            options = [s for s in schema[key] if _resolve(doc, s).get("type") != "null"]
            return _plausible(doc, options[0], name, ids, depth) if options else None
    if "enum" in schema:
        return schema["enum"][0]
    if "examples" in schema and schema["examples"]:
        return schema["examples"][0]
    kind = schema.get("type")
    if kind == "object":
        if depth > 3:
            return {}
        props = schema.get("properties", {})
        return {k: _plausible(doc, v, k, ids, depth + 1) for k, v in props.items() if k in schema.get("required", [])}
    if kind == "array":
        return []
    if kind == "boolean":
        return False
    if kind in ("integer", "number"):
        return schema.get("minimum", 1)
    if kind == "string":
        if schema.get("format") == "uuid" or name.endswith("_id") or name.endswith("Id"):
            return ids.get(name.removesuffix("_id").removesuffix("Id") + "s", str(uuid.uuid4()))
        if schema.get("format") == "date-time":
            return "2026-01-01T00:00:00Z"
        return "fuzz-" + name
    return "fuzz"


def operations(doc: dict, ids: dict[str, str]) -> list[Operation]:
    exclude = re.compile(EXCLUDE)
    out = []
    for path, item in doc["paths"].items():
        if exclude.search(path):
            continue
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            params = op.get("parameters", [])
            content = op.get("requestBody", {}).get("content", {})
            json_body = form_body = None
            if "application/json" in content:
                json_body = _plausible(doc, content["application/json"]["schema"], "", ids)
                json_body = json_body if isinstance(json_body, dict) else {}
                # every documented property, not only the required ones, gets the hostile values
                schema = _resolve(doc, content["application/json"]["schema"])
                for k in schema.get("properties", {}):
                    json_body.setdefault(k, None)
            if "application/x-www-form-urlencoded" in content:
                schema = _resolve(doc, content["application/x-www-form-urlencoded"]["schema"])
                form_body = {k: "fuzz" for k in schema.get("properties", {})}
            out.append(Operation(method.upper(), path, [p["name"] for p in params if p["in"] == "query"],
                                 [p["name"] for p in params if p["in"] == "path"], json_body, form_body))
    return out


def hidden_operations(services) -> list[Operation]:
    """The routes /v1/openapi.json leaves out (``@hide``), from the URL map of an app built like the
    hub's; their query parameters from the model each view validates its query string with."""
    from quart_schema.openapi import QUART_SCHEMA_HIDDEN_ATTRIBUTE
    from quart_schema.validation import QUART_SCHEMA_QUERYSTRING_ATTRIBUTE

    from hub.app import create_app

    app = create_app(services)
    exclude = re.compile(EXCLUDE)
    out = []
    for rule in app.url_map.iter_rules():
        view = app.view_functions[rule.endpoint]
        path = re.sub(r"<(?:[a-z]+:)?([^>]+)>", r"{\1}", rule.rule)
        if not getattr(view, QUART_SCHEMA_HIDDEN_ATTRIBUTE, False) or exclude.search(path):
            continue
        model = getattr(view, QUART_SCHEMA_QUERYSTRING_ATTRIBUTE, None)
        query = [f.alias or name for name, f in model.model_fields.items()] if model is not None else []
        for method in sorted(rule.methods & {m.upper() for m in METHODS}):
            out.append(Operation(method, path, query, list(rule.arguments), None, None))
    return out


def _url(op: Operation, fx: Fixture, hostile: tuple[str, str] | None = None) -> str:
    """The operation's path with real ids (GET, PUT, PATCH) or unknown ones (POST, DELETE: the fuzz
    must not delete its own fixtures or reboot its device), and ``hostile`` = (param, raw value)."""
    real = op.method in ("GET", "PUT", "PATCH")

    def fill(m: re.Match) -> str:
        name = m.group(1)
        if hostile is not None and hostile[0] == name:
            return hostile[1]
        segment = op.path[:m.start()].rstrip("/").rsplit("/", 1)[-1]
        return fx.ids.get(segment, str(uuid.uuid4())) if real else str(uuid.uuid4())

    return re.sub(r"\{([^}]+)\}", fill, op.path)


@dataclass
class Case:
    op: Operation
    label: str
    url: str
    content: bytes | None = None
    content_type: str | None = None
    headers: dict[str, bytes] = field(default_factory=dict)


def cases(op: Operation, fx: Fixture) -> list[Case]:
    out: list[Case] = []
    base = _url(op, fx)
    for label, raw in URL_VALUES:
        for name in op.query:
            out.append(Case(op, f"query {name}={label}", f"{base}?{name}={raw}"))
        # the names views commonly read, in one URL (the long values go to documented ones only:
        # eighteen of them would not fit a URL)
        extra = [n for n in EXTRA_QUERY if n not in op.query]
        if len(raw) <= 1000:
            out.append(Case(op, f"common query parameters={label}", base + "?" + "&".join(f"{n}={raw}" for n in extra)))
        for name in op.path_params:
            out.append(Case(op, f"path {name}={label}", _url(op, fx, (name, raw))))
    for name in HEADER_NAMES:
        for label, value in HEADER_VALUES:
            out.append(Case(op, f"header {name}={label}", base, headers={name: value}))
    if op.method != "GET":
        for label, body in WHOLE_BODIES:
            out.append(Case(op, f"body {label}", base, body, "application/json"))
    if op.json_body is not None:
        marker = "\u2603fuzz-marker\u2603"
        for name in op.json_body:
            template = json.dumps({**op.json_body, name: marker})
            for label, raw in JSON_VALUES:
                out.append(Case(op, f"body {name}={label}", base,
                                template.replace(json.dumps(marker), raw).encode(), "application/json"))
    if op.form_body is not None:
        for name in op.form_body:
            for label, raw in URL_VALUES:
                form = {**op.form_body, "grant_type": "client_credentials", name: None}
                body = "&".join(f"{k}={quote(v) if v is not None else raw}" for k, v in form.items())
                out.append(Case(op, f"form {name}={label}", base, body.encode(),
                                "application/x-www-form-urlencoded"))
    return out


async def _probe_auth(client: httpx.AsyncClient, base_url: str, op: Operation, fx: Fixture) -> dict:
    """The first credential this operation does not refuse outright."""
    for creds in fx.credentials:
        r = await client.request(op.method, base_url + _url(op, fx), headers=creds)
        if r.status_code not in (401, 403):
            return creds
    return fx.credentials[0]


async def fixture(hub, nursery, tmp_path) -> Fixture:
    s = hub.services
    # enough requests for the run: the fuzzer is one caller of one organisation
    await s.db.execute("UPDATE organizations SET tier = 'enterprise', rate_limit = 100000000 WHERE id = $1::uuid",
                       hub.org_id)
    await s.invalidate(f"org:{hub.org_id}")
    await admin(hub, tmp_path, "billing-profile", hub.org_id, "--plan", "pro")  # billing reads need one
    r = await hub.call("POST", "/v1/fleets", json={"name": "fuzz-fleet"})
    fleet_id = r.json()["data"]["id"]
    device_id, token = await hub.provision("fuzz-device", fleet_id=fleet_id)
    await start_agent(nursery, hub.base_url, token, tmp_path / "agent")
    r = await hub.call("POST", "/v1/configurations", json={"name": "fuzz-config", "spec": {"a": 1}})
    config_id = r.json()["data"]["id"]
    r = await hub.call("POST", f"/v1/configurations/{config_id}/secret-files",
                       json={"path": "/etc/fuzz/key", "content_base64": "ZnV6eg=="})
    assert r.status_code == 201, r.text
    file_id = r.json()["data"]["id"]
    browser = await sign_in(hub)
    session = {"Cookie": browser.cookie, "X-CSRF-Token": browser.csrf, "X-Organization-ID": hub.org_id}
    service = await bearer(hub, "billing_viewer")
    r = await hub.call("POST", "/v1/cli/tunnel/token")
    assert r.status_code in (200, 201), r.text
    tunnel = {"Authorization": f"Bearer {r.json()['data']['token']}", "X-Organization-ID": hub.org_id}
    ids = {"fleets": fleet_id, "devices": device_id, "configurations": config_id, "members": str(hub.user_id),
           "secret-files": file_id}
    return Fixture(ids, [hub.headers, session, service, tunnel])


async def test_hostile_values_never_answer_5xx(nursery, db_url, tmp_path, caplog):
    with trio.fail_after(DEADLINE):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        fx = await fixture(hub, nursery, tmp_path)
        client = httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=4))
        doc = (await client.get(hub.base_url + "/v1/openapi.json")).json()
        ops = operations(doc, fx.ids)
        assert len(ops) > 60, [f"{o.method} {o.path}" for o in ops]  # the whole document, not a sample
        hidden = hidden_operations(hub.services)
        assert {"/console/api/usage-daily", "/console/{page}"} <= {o.path for o in hidden}, hidden
        ops += hidden
        all_cases: list[Case] = []
        for op in ops:
            op.auth = await _probe_auth(client, hub.base_url, op, fx)
            all_cases.extend(cases(op, fx))
        failures: list[str] = []
        answered = 0
        send, receive = trio.open_memory_channel[Case](len(all_cases))
        for c in all_cases:
            send.send_nowait(c)
        send.close()

        async def worker() -> None:
            nonlocal answered
            async for c in receive:
                headers = {**c.op.auth, **c.headers}
                if c.content_type:
                    headers["Content-Type"] = c.content_type
                try:
                    r = await client.request(c.op.method, hub.base_url + c.url, headers=headers, content=c.content)
                except httpx.HTTPError as exc:
                    failures.append(f"{c.op.method} {c.op.path} [{c.label}]: no answer ({exc!r})")
                    continue
                answered += 1
                if r.status_code >= 500:
                    failures.append(f"{c.op.method} {c.op.path} [{c.label}]: {r.status_code} {r.text[:200].strip()}")

        async with trio.open_nursery() as workers:
            for _ in range(4):
                workers.start_soon(worker)
        assert not failures, f"{len(failures)} of {len(all_cases)} cases:\n" + "\n".join(failures[:80])
        assert answered == len(all_cases)
        # and no traceback per bad request in the hub's log (each 500 was one, a flood under attack)
        unhandled = [r.getMessage() for r in caplog.records if r.name == "fleethub.http" and r.levelno >= 40]
        assert not unhandled, unhandled[:20]
