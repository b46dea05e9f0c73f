"""The OpenAPI document: quart-schema's, completed from the same declarations the middleware obeys.

What a client generator and a fuzzer need beside the views' own models, derived here so the
document cannot drift from behaviour:

- security per operation, from the route's ``RouteAuth`` (hub/auth/routes.py, hub/tunnels/auth.py):
  ``@public`` none; ``@tunnel_token`` TunnelToken; ``@device_token`` DeviceToken (hub/auth/device.py);
  ``@session_only`` the dashboard cookie; an
  explicit ``security_scheme`` on the view (the Bearer-only tunnel usage rows); otherwise the
  spec's "Either" (ApiTokenAuth with ApiSecretAuth, or BearerAuth) and the dashboard cookie;
- ``X-Organization-ID`` as a header parameter: required on every organisation-scoped operation,
  optional where the view is ``@no_org``, absent on public and tunnel-token routes (the token
  names its organisation);
- enums of path parameters a view declares (``hub/api/validation.path_values``); request bodies
  required unless the view is ``@optional_body`` (hub/api/validation.py);
- tags: the spec's section for each operation the spec lists (``SPEC_OPERATIONS``); every other
  operation is tagged ``extensions``, marked ``x-fleethub-extension`` and described
  (``EXTENSIONS``);
- the error answers any call can give — 401 (credential), 403 (role or organisation), 400 (missing
  organisation header, malformed input), 429 (rate limit), 500 and 503 (storage failure or
  outage) — and 404 on any operation with a path parameter, 413 on any with a body, with the error
  body the path uses (DESIGN.md section 7), so a fuzzer finds no undocumented status.
- the rate headers on every /v1 answer, and Retry-After on a 429, as response headers
  (``components.headers``), so a client reads them as declared rather than from prose.
"""

from __future__ import annotations

from typing import Any

from quart import Response
from quart_schema import hide
from quart_schema.openapi import OpenAPIProvider
from werkzeug.routing import Rule

from hub.api.validation import DOCUMENTED
from hub.auth.routes import route_auth
from hub.documents import CachedDocument

ORG_HEADER = "X-Organization-ID"
EITHER = [{"ApiTokenAuth": [], "ApiSecretAuth": []}, {"BearerAuth": []}, {"SessionCookie": []}]
SESSION_ONLY = [{"SessionCookie": []}]
EXTENSION_TAG = "extensions"

# Every operation the spec's Endpoints part lists, with the section it is under. Paths as the
# spec writes them, path parameter names included: the spec calls the device id {device_id},
# {deviceId} or {id} on different rows, and the routes use each row's name so a generated client's
# arguments are the spec's.
SPEC_OPERATIONS: dict[tuple[str, str], str] = {
    ("post", "/v1/assistant/chat/completions"): "Assistant",
    ("get", "/v1/assistant/usage"): "Assistant",
    ("get", "/v1/audit-events"): "Audit",
    ("get", "/v1/billing/tunnel/usage"): "Billing and registry fallback",
    ("get", "/v1/billing/tunnel/usage/records"): "Billing and registry fallback",
    ("get", "/v1/billing/features"): "Billing and registry fallback",
    ("put", "/v1/billing/features/{feature}"): "Billing and registry fallback",
    ("get", "/v1/billing/pricing"): "Billing and registry fallback",
    ("get", "/v1/billing/registry-fallback"): "Billing and registry fallback",
    ("get", "/v1/billing/usage"): "Billing and registry fallback",
    ("get", "/v1/cli/tunnel/entitlements"): "Tunnel sessions",
    ("post", "/v1/cli/tunnel/session"): "Tunnel sessions",
    ("delete", "/v1/cli/tunnel/session/{sid}"): "Tunnel sessions",
    ("post", "/v1/cli/tunnel/session/{sid}/renew"): "Tunnel sessions",
    ("get", "/v1/configurations"): "Configurations",
    ("post", "/v1/configurations"): "Configurations",
    ("get", "/v1/configurations/summary"): "Configurations",
    ("get", "/v1/configurations/{configId}"): "Configurations",
    ("put", "/v1/configurations/{configId}"): "Configurations",
    ("get", "/v1/configurations/{configId}/secret-files"): "Secret files",
    ("post", "/v1/configurations/{configId}/secret-files"): "Secret files",
    ("delete", "/v1/configurations/{configId}/secret-files/{fileId}"): "Secret files",
    ("get", "/v1/devices/{deviceId}/secret-files"): "Secret files",
    ("post", "/v1/devices/{deviceId}/secret-files"): "Secret files",
    ("delete", "/v1/devices/{deviceId}/secret-files/{fileId}"): "Secret files",
    ("put", "/v1/fleets/{fleetId}/update-window"): "Fleet update window",
    ("get", "/v1/fleets/{fleetId}/update-window/check"): "Fleet update window",
    ("post", "/v1/rollouts/impact"): "Rollouts",
    ("post", "/v1/rollouts"): "Rollouts",
    ("get", "/v1/rollouts/{rollout_id}"): "Rollouts",
    ("post", "/v1/rollouts/{rollout_id}/pause"): "Rollouts",
    ("get", "/v1/devices"): "Devices, fleets and configuration versions",
    ("get", "/v1/devices/{device_id}"): "Devices, fleets and configuration versions",
    ("post", "/v1/devices/{device_id}/reboot"): "Devices, fleets and configuration versions",
    ("patch", "/v1/devices/{device_id}"): "Devices, fleets and configuration versions",
    ("get", "/v1/fleets"): "Devices, fleets and configuration versions",
    ("post", "/v1/fleets"): "Devices, fleets and configuration versions",
    ("patch", "/v1/fleets/{fleet_id}"): "Devices, fleets and configuration versions",
    ("get", "/v1/configurations/{config_id}/versions"): "Devices, fleets and configuration versions",
    ("post", "/v1/configurations/{config_id}/versions"): "Devices, fleets and configuration versions",
    ("post", "/v1/devices/{id}/memory-test"): "Memory test",
    ("post", "/v1/devices/{id}/memory-test/cancel"): "Memory test",
    ("get", "/v1/devices/{id}/memory-test"): "Memory test",
    ("get", "/v1/devices/{id}/memory-test/results"): "Memory test",
    ("post", "/v1/oauth/token"): "Authentication",
}

# Operations the spec does not list: what each is for (DESIGN.md section 12 and docs/).
EXTENSIONS: dict[tuple[str, str], str] = {
    ("get", "/healthz"): "Liveness: the process is up.",
    ("get", "/readyz"): "Readiness: the database is reachable (503 while draining or without it).",
    ("get", "/metrics"): "Prometheus metrics of the hub process.",
    ("post", "/v1/pats"): "Create a personal API token for the caller; its secret is shown once.",
    ("get", "/v1/pats"): "The caller's personal API tokens (metadata only).",
    ("delete", "/v1/pats/{pat_id}"): "Delete (revoke) one of the caller's personal API tokens at once.",
    ("post", "/v1/auth/login"): "Dashboard sign-in: sets the session cookie and returns the CSRF token.",
    ("post", "/v1/auth/logout"): "End the dashboard session.",
    ("get", "/v1/auth/session"): "The current dashboard session.",
    ("get", "/v1/me"): "Who is calling, and their role in the organisation when one is named.",
    ("get", "/v1/members"): "Members of the organisation and their roles.",
    ("post", "/v1/members"): "Add a member to the organisation (admins).",
    ("delete", "/v1/members/{user_id}"): "Remove a member from the organisation (admins).",
    ("get", "/v1/invitations"): "Open invitations to the organisation.",
    ("delete", "/v1/invitations/{invitation_id}"): "Revoke an open invitation.",
    ("get", "/v1/me/invitations"): "Invitations addressed to the caller.",
    ("post", "/v1/invitations/{invitation_id}/accept"): "Accept an invitation: the caller joins the organisation.",
    ("get", "/v1/relations"): "Relation tuples (viewer, editor, billing roles, tunnel access) of the organisation.",
    ("post", "/v1/relations"): "Grant a relation on an object to a user or service account (admins).",
    ("delete", "/v1/relations"): "Revoke a relation tuple (admins).",
    ("get", "/v1/service-accounts"): "Service accounts of the organisation.",
    ("post", "/v1/service-accounts"): "Create a service account with IAM policies; its client secret is shown once.",
    ("delete", "/v1/service-accounts/{sa_id}"): "Delete a service account; its tokens stop working at once.",
    ("post", "/v1/devices"): "Provision a device; its device token is shown once.",
    ("delete", "/v1/devices/{device_id}"): "Remove an offline device from the organisation (its files are deleted).",
    ("post", "/v1/devices/{device_id}/ping"): "A live round trip to the device with no side effect.",
    ("get", "/v1/devices/{device_id}/events"): "The device state stream (server-sent events).",
    ("post", "/v1/devices/{device_id}/factory-reset"): "Wipe the device's secret files and its configuration assignment.",
    ("post", "/v1/devices/{device_id}/unpair"): "Wipe the device's secret files, then remove it from the organisation.",
    ("get", "/v1/devices/{device_id}/diagnosis"): "The device's issues: MemoryFault (critical), an interrupted memory test (warning).",
    ("put", "/v1/devices/{device_id}/configuration"): "Assign a configuration version to one device.",
    ("get", "/v1/fleets/{fleet_id}"): "One fleet.",
    ("delete", "/v1/configurations/{configId}"): "Delete a configuration with its versions and secret files.",
    ("get", "/v1/rollouts"): "Rollouts of the organisation, newest first.",
    ("post", "/v1/rollouts/{rollout_id}/resume"): "Resume a paused rollout, accepting the failures so far.",
    ("post", "/v1/rollouts/{rollout_id}/cancel"): "Cancel a rollout; devices in flight finish.",
    ("get", "/v1/rollouts/{rollout_id}/events"): "The rollout's progress stream (server-sent events).",
    ("post", "/v1/fleets/{fleet_id}/revert"): "Roll the fleet back to what it ran before its newest rollout "
                                              "(a rollout of that version, with a rollout's gates).",
    ("post", "/v1/devices/{device_id}/revert"): "Roll the device back to the version it ran before the one it runs "
                                                "(a rollout of its fleet over that device, with a rollout's gates).",
    ("get", "/v1/fleets/{fleetId}/update-window"): "The fleet's update window.",
    ("delete", "/v1/fleets/{fleetId}/update-window"): "Remove the fleet's update window (rollouts are then never held).",
    ("post", "/v1/cli/tunnel/token"): "A 15-minute tunnel token (the TunnelToken credential of the session routes).",
    ("get", "/v1/events"): "The organisation's event log after a cursor, as CloudEvents (docs/events.md).",
    ("post", "/v1/webhooks"): "Register a webhook endpoint (admins); its signing secret is shown once.",
    ("get", "/v1/webhooks"): "The organisation's webhook endpoints and their health (admins).",
    ("get", "/v1/webhooks/{webhook_id}"): "One webhook endpoint and its health (admins).",
    ("patch", "/v1/webhooks/{webhook_id}"): "Change a webhook endpoint, or enable or disable it (admins).",
    ("delete", "/v1/webhooks/{webhook_id}"): "Remove a webhook endpoint and its delivery log (admins).",
    ("get", "/v1/webhooks/{webhook_id}/deliveries"): "A webhook endpoint's delivery log, newest first (admins).",
    ("post", "/v1/webhooks/{webhook_id}/test"): "Send a signed ping event to a webhook endpoint now (admins).",
    ("post", "/v1/webhooks/{webhook_id}/redeliver"): "Send a range of events to a webhook endpoint again (admins).",
    ("get", "/v1/assistant/system-prompt"): "The assistant's dashboard system prompt, tools and limits (public).",
}

_GENERAL = {"type": "object", "required": ["error", "message"],
            "properties": {"error": {"type": "string"}, "message": {"type": "string"}, "details": {}}}
_MEMTEST = {"type": "object", "required": ["error", "message"],
            "properties": {"error": {"type": "string"}, "message": {"type": "string"},
                           # 409 busy: the running test's status (hub/api/memtests.py)
                           "status": {"$ref": "#/components/schemas/MemtestStatus"}}}
_TUNNEL = {"type": "object", "required": ["error_code", "message"],
           "properties": {"error_code": {"type": "string"}, "message": {"type": "string"}}}

_DESCRIPTIONS = {400: "invalid request, missing organisation, malformed body", 401: "authentication required",
                 403: "access denied or missing role", 404: "not found", 413: "request body too large",
                 429: "rate limit exceeded (X-RateLimit-* headers, Retry-After)",
                 500: "failed to load or persist", 503: "the database or a feature is not available"}


# Every /v1 answer carries the rate headers (hub/app.py, from hub/auth/ratelimit.Decision.headers);
# a 429 adds Retry-After (hub/errors.RateLimited, hub/api/oauth.py).
RATE_HEADERS = {
    "X-RateLimit-Limit": "requests allowed in the current one-hour window",
    "X-RateLimit-Remaining": "requests left in the current window",
    "X-RateLimit-Reset": "when the current window ends, in seconds since the epoch",
}
RETRY_AFTER = "Retry-After"
_HEADERS = {**{name: {"description": text, "required": True, "schema": {"type": "integer", "minimum": 0}}
               for name, text in RATE_HEADERS.items()},
            RETRY_AFTER: {"description": "seconds to wait before trying again", "required": True,
                          "schema": {"type": "integer", "minimum": 0}}}


def _declare_headers(path: str, responses: dict) -> None:
    if not path.startswith("/v1/"):
        return
    for status, answer in responses.items():
        names = list(RATE_HEADERS) + ([RETRY_AFTER] if str(status) == "429" else [])
        headers = answer.setdefault("headers", {})
        for name in names:
            headers[name] = {"$ref": f"#/components/headers/{name}"}


def _error_ref(path: str) -> str:
    if "/memory-test" in path:
        return "#/components/schemas/MemoryTestError"
    if path.startswith("/v1/cli/tunnel/"):
        return "#/components/schemas/TunnelError"
    return "#/components/schemas/Error"


# Inline models quart-schema repeats per response are hoisted into components under these names (the
# error bodies keep the names the document always gave them).
_COMPONENT_NAMES = {"ErrorBody": "Error", "MemtestErrorBody": "MemoryTestError", "TunnelError": "TunnelError"}


def _hoist(media: dict, schemas: dict) -> None:
    """Replace a named inline schema (a pydantic model's title) by a $ref to one component, so a
    generator builds one model rather than one per response and status (openapi-python-client
    refuses the duplicates)."""
    schema = media.get("schema")
    if not isinstance(schema, dict) or "$ref" in schema or "title" not in schema:
        return
    if schema.get("type") != "object":
        return
    name = _COMPONENT_NAMES.get(schema["title"], schema["title"])
    if name not in _COMPONENT_NAMES.values():  # the error bodies' components are set by schema()
        if schemas.get(name, schema) != schema:
            return  # another model of that name: leave this one inline
        schemas[name] = schema
    media["schema"] = {"$ref": f"#/components/schemas/{name}"}


def _org_parameter(required: bool) -> dict[str, Any]:
    return {"name": ORG_HEADER, "in": "header", "required": required,
            "description": "the organisation the call acts in" if required else
            "optional: an organisation the caller belongs to (its rate limit and role apply); where the "
            "path names an object, that object's organisation when absent",
            # a plain string, as the spec types it (generators turn "format: uuid" into objects that
            # their own header code does not turn back into text)
            "schema": {"type": "string"}}


class FleethubOpenAPI(OpenAPIProvider):
    def build_paths(self, rule: Rule) -> tuple[dict, dict]:
        paths, components = super().build_paths(rule)
        view = self._app.view_functions[rule.endpoint]
        route = route_auth(view)
        documented = DOCUMENTED.of(view)
        enums = documented.path_values
        for operations in paths.values():
            for method, op in operations.items():
                # quart-schema shares one parameter list between a rule's methods: copy it.
                op["parameters"] = [dict(p) for p in op.get("parameters", [])]
                for p in op["parameters"]:
                    if p["in"] == "path" and p["name"] in enums:
                        p["schema"] = {**p.get("schema", {}), "type": "string", "enum": list(enums[p["name"]])}
                if "requestBody" in op:
                    op["requestBody"] = {**op["requestBody"],
                                         "required": not documented.body_optional}
                if "security" not in op:
                    op["security"] = SESSION_ONLY if route.only == "session" else EITHER
                if not (route.public or route.org_in_credential):
                    required = route.needs_org and route.org_of is None
                    op["parameters"].append(_org_parameter(required))
        return paths, components

    def schema(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        schema = super().schema(*args, **kwargs)
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        schemas.setdefault("Error", _GENERAL)
        schemas.setdefault("MemoryTestError", _MEMTEST)
        schemas.setdefault("TunnelError", _TUNNEL)
        schema["components"]["headers"] = _HEADERS
        chat = schema.get("paths", {}).get("/v1/assistant/chat/completions", {}).get("post")
        if chat is not None:
            chat.setdefault("responses", {})[200] = {
                "description": "chat.completion.chunk events (OpenAI streaming format), ending with data: [DONE]",
                "content": {"text/event-stream": {"schema": {"type": "string"}}}}
        metrics = schema.get("paths", {}).get("/metrics", {}).get("get")
        if metrics is not None:
            metrics.setdefault("responses", {})[200] = {
                "description": "Prometheus text exposition format",
                "content": {"text/plain": {"schema": {"type": "string"}}}}
        sections = sorted(set(SPEC_OPERATIONS.values()))
        schema["tags"] = [{"name": name, "description": f"the spec's Endpoints: {name}"} for name in sections] + [
            {"name": EXTENSION_TAG, "description": "operations the spec does not list: the hub's own"}]
        for path, operations in schema.get("paths", {}).items():
            stream = operations.get("get") if path.endswith("/events") else None
            if stream is not None:
                stream.setdefault("responses", {})[200] = {
                    "description": "server-sent events: a snapshot first, then each change",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}}}
            for method, op in operations.items():
                if not isinstance(op, dict) or "responses" not in op:
                    continue
                section = SPEC_OPERATIONS.get((method, path))
                if section is not None:
                    op["tags"] = [section]
                else:
                    op["tags"] = [EXTENSION_TAG]
                    op["x-fleethub-extension"] = True
                    described = EXTENSIONS.get((method, path))
                    if described:
                        op["summary"] = op.get("summary") or described
                        op["description"] = op.get("description") or described
                for answer in list(op.get("responses", {}).values()) + [op.get("requestBody") or {}]:
                    for media in (answer.get("content") or {}).values():
                        _hoist(media, schemas)
                public = op.get("security") == []
                statuses: list[int] = [] if public else [400, 401, 403, 429, 500, 503]
                if not public and "{" in path:
                    statuses.append(404)
                if not public and method in ("post", "put", "patch"):
                    statuses.append(413)
                if public:
                    statuses = [500, 503] + ([400, 429] if path.startswith("/v1/") else [])
                responses = op["responses"]
                # quart-schema keys responses by int until the document is serialised
                as_str = any(isinstance(k, str) for k in responses)
                for status in statuses:
                    responses.setdefault(str(status) if as_str else status, {
                        "description": _DESCRIPTIONS[status],
                        "content": {"application/json": {"schema": {"$ref": _error_ref(path)}}}})
                _declare_headers(path, responses)
        return schema


def view(document: CachedDocument) -> Any:
    """GET /v1/openapi.json in place of quart-schema's own view, which built the document again on every
    request, on the event loop (hub/documents.py says what that cost)."""
    @hide
    async def openapi() -> Response:
        return await document.response()
    openapi.document = document  # type: ignore[attr-defined]  # for a test to find
    return openapi
