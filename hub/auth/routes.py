"""What each route asks of its caller, declared in one typed place.

A view is authenticated and organisation-scoped unless its decorator says otherwise: ``@public``
(health, metrics, the OpenAPI document, the device link which checks its own device token, the OAuth
token endpoint), ``@no_org`` (the caller's own tokens, login), ``@org_of(finder)`` (the path's object
names its organisation), ``@session_only`` (the assistant). hub/tunnels/auth.py adds its own two
(``@tunnel_token``, ``@also_tunnel_token``) through ``declare``. The middleware
(hub/auth/middleware.py) and the OpenAPI document (hub/openapi.py) read a route's ``RouteAuth``
from here, never from attributes on the view.

The declarations are kept beside the views, in a table keyed by the view function (hub/declared.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from quart_schema import security_scheme

from hub.declared import Declared

OrgFinder = Callable[..., Awaitable[uuid.UUID | None]]


@dataclass(frozen=True)
class RouteAuth:
    public: bool = False           # no credential asked; the view checks its own, if any
    needs_org: bool = True         # X-Organization-ID (or what ``org_of`` finds) is required
    org_of: OrgFinder | None = None
    org_in_credential: bool = False  # the credential names the organisation; the header is not parsed
    only: str | None = None        # the one credential scheme the route takes (hub/auth/schemes.py kinds)
    also: frozenset[str] = frozenset()  # schemes taken beside the general ones

    def takes(self, kind: str, general: bool) -> bool:
        """Whether a credential of scheme ``kind`` (one of the general ones, or not) is accepted here."""
        if self.only is not None:
            return kind == self.only
        return general or kind in self.also

    def asks(self, kind: str, general: bool) -> bool:
        """Whether the middleware looks for that scheme's credential here: everywhere for a general
        one (so a route that takes only another can name what it got), else where the route takes it."""
        return general or kind == self.only or kind in self.also


DEFAULT = RouteAuth()
_DECLARED: Declared[RouteAuth] = Declared(DEFAULT)


# The view's declaration (``DEFAULT`` when it has none); the bound method itself, since every request asks.
route_auth: Callable[[Callable | None], RouteAuth] = _DECLARED.of


def declare(view: Callable, **changes: Any) -> Callable:
    """Add ``changes`` (RouteAuth fields) to what ``view`` and the views it wraps declare already."""
    if "also" in changes:
        changes["also"] = _DECLARED.of(view).also | changes["also"]
    return _DECLARED.declare(view, **changes)


def public(view: Callable) -> Callable:
    return security_scheme([])(declare(view, public=True))


def no_org(view: Callable) -> Callable:
    return declare(view, needs_org=False)


def org_of(finder: OrgFinder) -> Callable:
    """A route whose object names its organisation: without X-Organization-ID the call acts in that
    organisation (``await finder(services, **path values)``, None when there is no such object). The
    spec lists some routes with no organisation header (GET /rollouts/{id}, its pause). A caller who is
    not a member of it hears 404, as for a missing object; a header that names another organisation
    is used as given, and the object is not found in it."""
    def decorator(view: Callable) -> Callable:
        return declare(view, org_of=finder)

    return decorator


def session_only(view: Callable) -> Callable:
    """Only a signed-in dashboard session is ever accepted here (the assistant)."""
    return declare(view, only="session")
