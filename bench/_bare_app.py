"""The bare baseline: a tiny Quart-Trio app on hypercorn's trio worker, with the hub's server config.

    python bench/_bare_app.py --port P [--json FILE] [--framework]

    GET  /v1/devices/<id>   answers the JSON document in FILE (the hub's own answer, captured once)
    WS   /ws                echoes every frame through Quart (the capacity comparison the issue names)
    GET  /count             open WebSockets of /ws
    WS   /ws-raw            the same echo on plain ASGI in front of Quart, as the hub serves its device
                            link (hub/app.py HubApp): the transport's own floor
    GET  /count-raw         open WebSockets of /ws-raw
    GET  /healthz

No storage, no authentication, no actors: what is left is Quart-Trio + hypercorn + wsproto, which is
the floor the hub's figures are compared with.

``--framework`` adds what the hub takes from its framework before any of its own work: quart_schema
set up as the hub sets it up (hub/app.py, and hub/answers.py: plain answers as they are, encoded
with orjson), the route in a blueprint, the same app config, and a before/after request hook pair
that sets the hub's answer headers
(X-Request-ID, the three X-RateLimit-*) with none of its logic (no authentication, rate counting,
metrics or audit). Between the bare app and this one is the framework's price; between this one and
the hub, ours.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from functools import partial
from pathlib import Path

import trio
from hypercorn.trio import serve
from quart import websocket
from quart_trio import QuartTrio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hub.server import hypercorn_config  # noqa: E402  (the same hypercorn settings as the hub)


def create_app(document: dict, framework: bool = False) -> QuartTrio:
    app = QuartTrio("bare")
    state = {"open": 0}
    if framework:
        return _with_framework(app, document)

    @app.get("/healthz")
    async def healthz():
        return {"data": {"status": "ok"}}

    @app.get("/count")
    async def count():
        return {"open": state["open"]}

    @app.get("/v1/devices/<device_id>")
    async def device(device_id: str):
        return document

    @app.websocket("/ws")
    async def ws():
        await websocket.accept()
        state["open"] += 1
        try:
            while True:
                await websocket.send(await websocket.receive())
        finally:
            state["open"] -= 1

    return app


def _with_framework(app: QuartTrio, document: dict) -> QuartTrio:
    import uuid

    from quart import Blueprint, g
    from quart_schema import QuartSchema
    from quart_schema.openapi import APIKeySecurityScheme, Info

    from hub import answers
    from hub.openapi import FleethubOpenAPI

    app.config["MAX_CONTENT_LENGTH"] = 1024 * 1024
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = True
    QuartSchema(app, openapi_path="/v1/openapi.json", redoc_ui_path=None, scalar_ui_path=None,
                swagger_ui_path="/v1/docs", info=Info(title="floor", version="1.0"),
                security_schemes={"ApiTokenAuth": APIKeySecurityScheme(in_="header", name="X-API-Token-ID")},
                openapi_provider_class=FleethubOpenAPI)
    answers.set_up(app)
    bp = Blueprint("devices", __name__, url_prefix="/v1/devices")

    @bp.get("/<device_id>")
    async def device(device_id: str):
        return document

    app.register_blueprint(bp)

    @app.get("/healthz")
    async def healthz():
        return {"data": {"status": "ok"}}

    @app.before_request
    async def before() -> None:
        g.started = trio.current_time()
        g.request_id = str(uuid.uuid4())

    @app.after_request
    async def after(response):
        response.headers["X-Request-ID"] = g.request_id
        response.headers.update({"X-RateLimit-Limit": "2000000000", "X-RateLimit-Remaining": "1999999999",
                                 "X-RateLimit-Reset": "1800000000"})
        return response

    return app


def below_quart(quart_app):
    """WebSocket /ws-raw (and GET /count-raw) in plain ASGI, before Quart; everything else goes on to it."""
    state = {"open": 0}

    async def raw_echo(receive, send):
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        state["open"] += 1
        try:
            while True:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    return
                await send({"type": "websocket.send", "text": message.get("text"), "bytes": message.get("bytes")})
        finally:
            state["open"] -= 1

    async def app(scope, receive, send):
        if scope["type"] == "websocket" and scope["path"] == "/ws-raw":
            await raw_echo(receive, send)
        elif scope["type"] == "http" and scope["path"] == "/count-raw":
            body = json.dumps({"open": state["open"]}).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
        else:
            await quart_app(scope, receive, send)

    return app


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--json", help="file with the JSON document GET /v1/devices/<id> answers")
    p.add_argument("--framework", action="store_true", help="the hub's framework set-up, none of its logic")
    args = p.parse_args()
    document = json.loads(Path(args.json).read_text()) if args.json else {"data": {"id": "x"}}
    app = below_quart(create_app(document, args.framework))

    async def stop_on_signal() -> None:
        # hypercorn's graceful shutdown (config.graceful_timeout) on SIGINT/SIGTERM; a bare
        # KeyboardInterrupt after a load run can leave it waiting on connection tasks
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                return

    trio.run(partial(serve, app, hypercorn_config("127.0.0.1", args.port), shutdown_trigger=stop_on_signal))


if __name__ == "__main__":
    main()
