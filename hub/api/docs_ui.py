"""``GET /v1/docs``: Swagger UI on the hub's OpenAPI document, from files the hub serves itself.

Swagger UI used to come from a CDN with no integrity hash and no CSP, on the hub's origin: a changed
script there could have read the console's CSRF token and acted with its session (issue 31 item 6).
The files now come from the ``swagger-ui-bundle`` wheel (a pinned copy of swagger-ui-dist), named
in an allow-list, and the page has a CSP that lets scripts come from the hub's origin only. Its one
script of our own, the initializer, is a file (docs_static/init.js), not inline.
"""

from __future__ import annotations

from pathlib import Path

from quart import Blueprint, Response
from quart_schema import hide
from swagger_ui_bundle import swagger_ui_path
from werkzeug.exceptions import NotFound

from hub.auth.routes import no_org, public

bp = Blueprint("docs_ui", __name__)

VENDOR = Path(swagger_ui_path)
OURS = Path(__file__).parent / "docs_static"
FILES = {"swagger-ui.css": (VENDOR, "text/css"), "swagger-ui-bundle.js": (VENDOR, "text/javascript"),
         "favicon-32x32.png": (VENDOR, "image/png"), "init.js": (OURS, "text/javascript")}

# Swagger UI sets style attributes as it renders (hence 'unsafe-inline' for styles only) and draws its
# icons as data: images; everything else is the hub's own, and nothing may frame the page.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin",
           "X-Frame-Options": "DENY"}

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>fleethub API</title>
<link rel="stylesheet" href="/v1/docs/swagger-ui.css">
<link rel="icon" type="image/png" href="/v1/docs/favicon-32x32.png">
</head>
<body>
<div id="swagger-ui"></div>
<script src="/v1/docs/swagger-ui-bundle.js"></script>
<script src="/v1/docs/init.js"></script>
</body>
</html>
"""


@bp.get("/v1/docs")
@public
@no_org
@hide
async def docs_page():
    return Response(PAGE, 200, {"Content-Type": "text/html; charset=utf-8", "Cache-Control": "no-store", **HEADERS})


@bp.get("/v1/docs/<name>")
@public
@no_org
@hide
async def docs_file(name: str):
    if name not in FILES:
        raise NotFound()
    folder, mime = FILES[name]
    body = (folder / name).read_bytes()
    return Response(body, 200, {"Content-Type": mime, "Cache-Control": "public, max-age=3600", **HEADERS})
