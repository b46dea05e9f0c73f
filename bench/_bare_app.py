"""The bare baseline: a tiny Quart-Trio app on hypercorn's trio worker, with the hub's server config.

    python bench/_bare_app.py --port P [--json FILE]

    GET  /v1/devices/<id>   answers the JSON document in FILE (the hub's own answer, captured once)
    WS   /ws                echoes every frame (the capacity comparison)
    GET  /count             open WebSockets
    GET  /healthz

No storage, no authentication, no actors: what is left is Quart-Trio + hypercorn + wsproto, which is
the floor the hub's figures are compared with.
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


def create_app(document: dict) -> QuartTrio:
    app = QuartTrio("bare")
    state = {"open": 0}

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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--json", help="file with the JSON document GET /v1/devices/<id> answers")
    args = p.parse_args()
    document = json.loads(Path(args.json).read_text()) if args.json else {"data": {"id": "x"}}
    app = create_app(document)

    async def stop_on_signal() -> None:
        # hypercorn's graceful shutdown (config.graceful_timeout) on SIGINT/SIGTERM; a bare
        # KeyboardInterrupt after a load run can leave it waiting on connection tasks
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                return

    trio.run(partial(serve, app, hypercorn_config("127.0.0.1", args.port), shutdown_trigger=stop_on_signal))


if __name__ == "__main__":
    main()
