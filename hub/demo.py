"""``fleethub demo``: a hub with a demo organisation, an admin, a fleet and N simulated devices.

Everything is created once and found again on later runs (same data dir). ``<data-dir>/demo.json``
is written when the hub and all devices are up, so scripts can wait for it and use the hub.

So that every part of the API answers out of the box, the demo organisation also gets a billing
profile (plan "demo"), tunnel sessions are enabled for it, the catalogue gets demo list prices when
no price was ever set (``DEMO_PRICES``: made-up figures, labelled as such), and each simulated
device offers a tunnel target ``echo``: a TCP echo server the demo runs on 127.0.0.1.

``containers``: a container version is rolled out too, from a registry the demo starts, to one more
device that runs podman (hub/demo_containers.py); ``info["containers"]`` says what happened.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from functools import partial
from pathlib import Path

import trio

from device_client.sim import run_sim
from hub.demo_containers import run_container_demo
from hub.auth.passwords import hash_password
from hub.auth.pat import cli_safe_secret, digest, new_pat
from hub.services import Services
from storage.private import write_private

DEMO_ORG = "Demo Robotics"
DEMO_EMAIL = "admin@demo.fleethub.local"
DEMO_FLEET = "demo-fleet"
# Made-up list prices, set only on a hub where no price was ever set (currency units per unit).
DEMO_PRICES = {"active_device": "2.00", "tunnel_minutes": "0.01", "tunnel_relayed_bytes": "0.40",
               "registry_fallback_bytes": "0.50", "assistant_prompt_tokens": "1.00",
               "assistant_completion_tokens": "3.00"}


def write_demo_file(path: Path, data: dict) -> None:
    write_private(path, (json.dumps(data, indent=2) + "\n").encode())  # 0600: it holds the admin's password


async def bootstrap(services: Services, data_dir: Path) -> dict:
    """The demo org, admin, PAT and fleet: reused from an earlier run when they still exist."""
    path = data_dir / "demo.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    now = services.clock.now()
    password = previous.get("admin", {}).get("password") or cli_safe_secret(12)
    org, user = await services.stores.orgs.ensure_demo(
        org_name=DEMO_ORG, email=DEMO_EMAIL, password_hash=await trio.to_thread.run_sync(hash_password, password),
        now=now)
    pat = previous.get("pat")
    if not pat or not await services.stores.tokens.find_pat_in_org(digest(pat["secret"]), org["id"]):
        pat_id, secret = new_pat()
        await services.stores.tokens.create_pat(pat_id, user["id"], digest(secret), now, description="demo")
        pat = {"id": pat_id, "secret": secret}
    fleets, _ = await services.stores.fleets.list(org["id"], offset=0, limit=100)
    fleet = next((f for f in fleets if f["name"] == DEMO_FLEET), None)
    if fleet is None:
        # No fleet tags: a fleet's tags are what its devices must carry to be eligible for rollouts.
        fleet = await services.stores.fleets.create(org["id"], now, name=DEMO_FLEET,
                                             description="Simulated devices of the demo", architecture=None)
    if await services.stores.billing.profile(org["id"]) is None:
        await services.stores.billing.put_profile(org["id"], now, plan="demo")
    if not await services.stores.billing.all_prices():
        for product, price in DEMO_PRICES.items():
            await services.stores.billing.set_price(product, None, dt.date(2020, 1, 1), Decimal(price), now)
    if await services.tunnels.store.entitlement(org["id"]) is None:
        await services.tunnels.store.set_entitlement(org["id"], {"enabled": True}, now)
    return {"org_id": str(org["id"]), "fleet_id": str(fleet["id"]), "pat": pat,
            "admin": {"email": DEMO_EMAIL, "password": password}}


async def echo_server(*, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A TCP echo service on 127.0.0.1, the simulated devices' tunnel target ``echo``."""
    async def echo(stream: trio.SocketStream) -> None:
        async with stream:
            try:
                async for chunk in stream:
                    await stream.send_all(chunk)
            except trio.BrokenResourceError:
                pass

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(echo, listeners)


def curl_examples(info: dict) -> str:
    h = (f"-H 'X-API-Token-ID: {info['pat']['id']}' -H 'X-API-Secret-Key: {info['pat']['secret']}' "
         f"-H 'X-Organization-ID: {info['org_id']}'")
    base = info["base_url"]
    first = info["devices"][0] if info["devices"] else "<device_id>"
    return "\n".join([
        f"  curl -s {h} {base}/v1/devices",
        f"  curl -s {h} {base}/v1/devices/{first}",
        f"  curl -s -X POST {h} {base}/v1/devices/{first}/reboot",
        f"  curl -s {h} {base}/v1/fleets",
        f"  curl -s {base}/metrics",
    ])


async def run_demo(services: Services, base_url: str, nursery: trio.Nursery, *, data_dir: Path,
                   devices: int, memory_faults: list[str] | None = None,
                   memory_budget: int | None = None, tunnel_shell: bool = False, containers: bool = True) -> dict:
    from device_client.shell import ShellUser
    from device_client.tunnel import TunnelConfig
    from webrtc.device_tunnel import attach as tunnel_engine

    info = await bootstrap(services, data_dir)
    echo_port = await nursery.start(echo_server)
    agents = await nursery.start(partial(
        run_sim, base_url, devices, data_dir, pat_id=info["pat"]["id"], pat_secret=info["pat"]["secret"],
        org_id=info["org_id"], fleet=info["fleet_id"], memory_faults=memory_faults,
        memory_budget=memory_budget,
        agent_options={"tunnel": TunnelConfig(targets={"echo": ("127.0.0.1", echo_port)},
                                              # the console's terminal: a shell as this process's user
                                              shell=ShellUser.lookup(None) if tunnel_shell else None),
                       "tunnel_engine": tunnel_engine}))
    info = {"base_url": base_url, **info, "devices": [a.device_id for a in agents]}
    if containers:
        info["containers"] = await run_container_demo(services, base_url, nursery, data_dir=data_dir, info=info)
    write_demo_file(data_dir / "demo.json", info)
    return info
