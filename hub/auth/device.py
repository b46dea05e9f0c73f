"""The device token as a credential scheme: how a device proves itself, on its link and its HTTP calls.

A device holds one secret, the token shown once when it was registered (POST /v1/devices); the hub
keeps its digest. It opens the device link with ``Authorization: Bearer <token>`` (hub/api/link.py,
a WebSocket served in front of Quart, so it asks ``device_row`` itself) and makes its few HTTP calls
with the same header, on routes declared ``@device_token`` (the page-map upload). There the
middleware finds the credential through this scheme like any other, and nothing but a device token
is taken: a PAT or a bearer JWT is refused as the device's own missing token would be.

The token binds the device's organisation. A device's calls count against the device's own budget,
never its organisation's: a fleet uploading page maps must not spend its operators' API budget.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from quart import Request
from quart_schema import security_scheme

from hub.auth.access import Authenticating
from hub.auth.pat import digest
from hub.auth.principals import Principal
from hub.auth.routes import RouteAuth, declare
from hub.auth.schemes import SCHEMES, Found, Resolved, bearer_of, org_row
from hub.errors import FleethubError, Unauthenticated

SCHEME = "DeviceToken"  # its name in /v1/openapi.json
KIND = "device"         # its kind among the credential schemes


@dataclass(frozen=True)
class DevicePrincipal(Principal):
    """The device a token names; ``row`` is its device row as the token lookup read it."""
    row: dict = field(default_factory=dict, hash=False, compare=False, repr=False)

    @property
    def credential_kind(self) -> str:
        return "device_token"


def device_token(view: Callable) -> Callable:
    """The route takes a device token and nothing else; the device's organisation is the call's."""
    return security_scheme([{SCHEME: []}])(declare(view, only=KIND, needs_org=False, org_in_credential=True))


def unauthenticated() -> Unauthenticated:
    return Unauthenticated("a valid device token is required")


async def device_row(services: Authenticating, token: str | None) -> dict | None:
    """The device whose token this is, or None (no token, or not one of ours)."""
    return await services.stores.devices.find_by_token(digest(token)) if token else None


class DeviceTokenScheme:
    kind = KIND
    general = False

    def find(self, req: Request | None, headers: dict[str, str], route: RouteAuth) -> Found | None:
        value = bearer_of(headers)
        return Found(KIND, None, value) if value is not None and route.only == KIND else None

    async def resolve(self, services: Authenticating, found: Found, org_id: uuid.UUID | None) -> Resolved:
        row = await device_row(services, found.secret)
        if row is None:
            raise unauthenticated()
        org = await org_row(services, row["org_id"])
        principal = DevicePrincipal(kind="device", id=str(row["id"]), via="device", row=row)
        return Resolved(principal, "device", org["tier"] if org else None, None, bound_org=row["org_id"],
                        own_budget=True)

    def missing(self) -> FleethubError:
        return unauthenticated()

    def other(self) -> FleethubError:
        return unauthenticated()


# Ahead of every bearer scheme: where a route takes device tokens, its bearer is read as one.
SCHEMES.register(DeviceTokenScheme(), before="pat")
