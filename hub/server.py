"""Serving the app: hypercorn's trio worker in front of the services, in one trio process."""

from __future__ import annotations

import logging
from functools import partial

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from device_client.shared import loopwatch
from device_client.shared.clock import Clock
from hub.frames import HARD_CAP
from hub.app import create_app
from hub.errors import ServerError
from hub.services import Services, open_services
from hub.settings import Settings

log = logging.getLogger("fleethub")


class ServerStopped(ServerError):
    """The hub's HTTP server returned while nobody had asked the hub to stop."""


def hypercorn_config(host: str, port: int, settings: Settings | None = None) -> Config:
    config = Config()
    config.bind = [f"{host}:{port}"]
    if settings is not None and settings.tls:
        # HTTPS with ALPN h2/http1.1 on TCP, HTTP/3 on UDP (aioquic); hypercorn advertises the QUIC
        # endpoint to TCP clients with an Alt-Svc header.
        config.certfile = str(settings.certfile)
        config.keyfile = str(settings.keyfile)
        quic_port = settings.quic_port if settings.quic_port is not None else port
        if quic_port:
            config.quic_bind = [f"{host}:{quic_port}"]
    # Thousands of devices connect at once after a hub restart; the default backlog of 100 drops them.
    config.backlog = 4096
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = 3
    # Device frames are bounded by construction below MAX_FRAME_BYTES (device_client/shared/protocol.py); the
    # link refuses a bigger one itself, with a reason the device can act on (hub/frames.py). hypercorn
    # closes (1009, no reason) only past HARD_CAP, so a broken or hostile peer cannot make it buffer more.
    config.websocket_max_message_size = HARD_CAP
    return config


async def serve_app(services: Services, host: str, port: int, *, shutdown_trigger=None,
                    task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve until cancelled, or until ``shutdown_trigger()`` returns: then hypercorn stops accepting,
    lets requests in flight finish (``graceful_timeout``) and returns. ``task_status.started(base_url)``
    once the socket listens."""
    # Building the app (every blueprint, quart-schema's models, pydantic's validators) is 0.1-0.5 s of
    # CPU: on the loop it held every task the services had started (write-behind, resumed rollouts, a
    # cluster's NATS) and logged a stall at each start on a busy host. Nothing in it needs the loop.
    app = await trio.to_thread.run_sync(create_app, services)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve, app, hypercorn_config(host, port, services.settings),
                                            shutdown_trigger=shutdown_trigger))
        base_url = binds[0].replace("0.0.0.0", "127.0.0.1")
        task_status.started(base_url)


async def run_hub(settings: Settings, *, clock: Clock | None = None, on_ready=None, stopping: trio.Event | None = None,
                  task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Storage, actors and HTTP in one process; ``on_ready(services, base_url)`` may add more tasks.

    When ``stopping`` is set the hub shuts down gracefully and returns: /readyz turns 503, devices
    are told to reconnect (elsewhere when FLEETHUB_SUCCESSOR_URL names a hub), HTTP stops accepting
    and finishes what is in flight, then storage closes (write-behind flushed). Cancelling instead
    stops at once."""
    async with open_services(settings, clock) as services:
        async with trio.open_nursery() as nursery:
            await loopwatch.ensure(nursery)  # `fleethub serve` started one already; a hub in a test has this
            http_stop = trio.Event()
            http_done = trio.Event()

            async def serve_http(task_status=trio.TASK_STATUS_IGNORED) -> None:
                try:
                    await serve_app(services, settings.host, settings.port, shutdown_trigger=http_stop.wait,
                                    task_status=task_status)
                finally:
                    http_done.set()
                if not http_stop.is_set():
                    # hypercorn returns, without an error, when its worker is told to terminate or a
                    # KeyboardInterrupt reaches its tasks: without this the hub would close its storage
                    # and return as if asked to stop (`fleethub serve` exiting 0, a supervisor that
                    # restarts on failure leaving it down)
                    log.error("the HTTP server stopped without being asked to; stopping the hub")
                    raise ServerStopped("the HTTP server stopped without being asked to")

            base_url = await nursery.start(serve_http)
            log.info("fleethub listening on %s", base_url)
            if on_ready is not None:
                await on_ready(services, base_url, nursery)
            task_status.started((services, base_url))
            if stopping is not None:
                await stopping.wait()
                log.info("draining: telling %d devices to reconnect", len(services.links))
                await services.drain()
                # Keep answering (readiness says 503) while the devices move and balancers notice.
                await trio.sleep(settings.drain_window)
                http_stop.set()
                await http_done.wait()
                log.info("drained; stopping")
                nursery.cancel_scope.cancel()
    if stopping is None or not stopping.is_set():
        # Only ``stopping`` ends the hub with a return; a cancellation from outside does not get here.
        # A scope inside (the services' nursery) cancelled by mistake would: say so, do not exit 0.
        log.error("the hub's services stopped without being asked to")
        raise ServerStopped("the hub's services stopped without being asked to")
