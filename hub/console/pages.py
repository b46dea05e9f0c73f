"""Console routes: ``/`` → the console, the page shell, the static files; a strict CSP on all of them.

The shell holds no data and no inline script or style: the page's name and (for a device or a
rollout) its id are data attributes, the id checked as a UUID here so nothing a caller typed reaches
the HTML unescaped. Pages and static files are public (they hold no data; every datum comes from the
API, which authenticates each call); a signed-out visitor is sent to the sign-in page by the script.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from markupsafe import escape
from quart import Blueprint, Response, redirect, request, send_from_directory
from quart_schema import hide
from werkzeug.exceptions import NotFound

from hub.auth.routes import public
from hub.auth.schemes import SESSION_COOKIE

bp = Blueprint("console", __name__)
STATIC = Path(__file__).parent / "static"

# No inline script or style anywhere (the modules set styles through CSSOM, which CSP allows), nothing
# from another origin, no framing. connect-src 'self' covers the API calls and the SSE streams.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")

# page name -> title; pages with an object id take it from the path
PAGES = {"signin": "Sign in", "devices": "Devices", "device": "Device", "rollouts": "Rollouts",
         "rollout": "Rollout", "fleets": "Fleets", "configurations": "Configurations", "audit": "Audit log",
         "access": "Access", "billing": "Billing", "assistant": "Assistant", "webhooks": "Webhooks"}
# pages without an object id, each at /console/<name>
LIST_PAGES = ("devices", "rollouts", "fleets", "configurations", "audit", "access", "billing", "assistant",
              "webhooks")

SHELL = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · fleethub</title>
<link rel="stylesheet" href="/console/static/console.css">
<script type="module" src="/console/static/app.js"></script>
</head>
<body data-page="{page}" data-id="{obj}">
<a class="skip" href="#main">Skip to content</a>
<header id="top"></header>
<main id="main" tabindex="-1"><p class="muted">Loading…</p></main>
<noscript><p>The console needs JavaScript.</p></noscript>
</body>
</html>
"""


def _shell(page: str, obj: str = "") -> Response:
    html = SHELL.format(title=escape(PAGES[page]), page=escape(page), obj=escape(obj))
    return Response(html, 200, {"Content-Type": "text/html; charset=utf-8", "Cache-Control": "no-store"})


def _uuid(raw: str) -> str:
    try:
        return str(uuid.UUID(raw))
    except ValueError:
        raise NotFound("no such page") from None


@bp.after_request
async def _headers(response: Response) -> Response:
    if request.path == "/" or request.path.startswith("/console"):
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        response.headers["X-Frame-Options"] = "DENY"
    return response


@bp.get("/")
@public
@hide
async def root():
    """The console: its device list when a session cookie is present, else its sign-in page."""
    signed_in = SESSION_COOKIE in request.cookies
    return redirect("/console/devices" if signed_in else "/console/signin")


@bp.get("/console")
@bp.get("/console/")
@public
@hide
async def console_root():
    return redirect("/console/devices")


@bp.get("/console/signin")
@public
@hide
async def signin_page():
    return _shell("signin")


@bp.get("/console/<page>")
@public
@hide
async def list_page(page: str):
    if page not in LIST_PAGES:
        raise NotFound("no such page")
    return _shell(page)


@bp.get("/console/devices/<device_id>")
@public
@hide
async def device_page(device_id: str):
    return _shell("device", _uuid(device_id))


@bp.get("/console/rollouts/<rollout_id>")
@public
@hide
async def rollout_page(rollout_id: str):
    return _shell("rollout", _uuid(rollout_id))


@bp.get("/console/static/<path:name>")
@public
@hide
async def static_file(name: str):
    # send_from_directory refuses paths that leave STATIC (.., absolute); a name the file system
    # cannot even look up (longer than NAME_MAX, say) is no such file either, not a server error
    try:
        response = await send_from_directory(STATIC, name)
    except (OSError, ValueError):
        raise NotFound("no such file") from None
    response.headers["Cache-Control"] = "no-cache"  # revalidated each load: no stale module after an upgrade
    return response
