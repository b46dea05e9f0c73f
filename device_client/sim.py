"""Many device agents in one trio process, for testing a hub at scale (``fleethub sim``).

Every simulated device is a real ``Agent`` with its own data directory
``<data_dir>/devices/<device_id>/`` (state, identity key, and ``root/`` for delivered files), so a
simulated fleet exercises the same code a real device runs. No threads per agent: one nursery holds
them all, and a shared CapacityLimiter bounds how many are in their connect handshake at once, which
is what lets 15,000 agents come up (or come back after a hub restart) without a SYN flood.

Devices are remembered in ``<data_dir>/sim.json`` = ``{"devices": [{"id", "token"}, ...]}`` so a
second run reuses them. Missing ones are provisioned through ``POST /v1/devices`` with a personal
access token, or handed in already provisioned with ``devices=[(id, token), ...]``.

The simulator usually shares a host with the hub, and configuration workloads are commands chosen by
the hub's tenants: when it runs as root, every simulated workload runs as one unprivileged account
(FLEETHUB_WORKLOAD_USER, default ``nobody``; device_client/workload_account.py), which owns every file
delivered to a simulated device. Not root: they run as the simulator's own user (no other choice).

With ``fake_containers`` (``fleethub sim``'s default) every device has its own in-memory container
engine (device_client/engine/fake.py): its hello offers one, so a simulated fleet takes a version with
containers and goes through the agent's whole apply (pull, create, start, check, switch) with nothing
pulled or run.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any, Iterable

import httpx
import trio

from .agent import Agent
from .agentconfig import AgentConfig, hub_urls
from .engine.fake import FakeEngine
from .shared.clock import Clock
from .memtest import sim_config
from .names import NameLookupError, resolve
from .state import write_json_atomic
from .workload_account import RunAs, simulator_user

log = logging.getLogger("fleethub.agent.sim")

_AUTO: Any = object()
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # becomes a directory name


class SimError(RuntimeError):
    """The simulation cannot start: too few devices and no way to provision more, or the hub said no."""


def load_registry(data_dir: Path) -> list[dict[str, str]]:
    path = data_dir / "sim.json"
    try:
        devices = json.loads(path.read_text())["devices"]
    except FileNotFoundError:
        return []
    except (ValueError, KeyError, TypeError) as exc:
        raise SimError(f"{path} is not a sim registry ({exc}); move it aside to start over") from None
    return [{"id": str(d["id"]), "token": str(d["token"])} for d in devices]


def save_registry(data_dir: Path, devices: list[dict[str, str]]) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(data_dir / "sim.json", {"devices": devices})  # 0600: it holds device tokens


async def provision(hub_url: str, names: list[str], *, pat_id: str, pat_secret: str,
                    org_id: str | None = None, fleet: str | None = None, concurrency: int = 16,
                    transport: httpx.AsyncBaseTransport | None = None,
                    into: list[dict[str, str]] | None = None) -> list[dict[str, str]]:
    """Create one device per name, in ``fleet`` (its id or its name) when given; each created device is
    appended to ``into`` as it arrives, so a failure half way still leaves the caller with the devices
    the hub did create."""
    created = into if into is not None else []
    headers = {"X-API-Token-ID": pat_id, "X-API-Secret-Key": pat_secret}
    if org_id:
        headers["X-Organization-ID"] = org_id
    limiter = trio.CapacityLimiter(concurrency)
    failure: list[SimError] = []

    async def create(client: httpx.AsyncClient, name: str, cancel: trio.CancelScope) -> None:
        body: dict[str, Any] = {"name": name}
        if fleet_id is not None:
            body["fleet_id"] = fleet_id
        async with limiter:
            try:
                response = await client.post("/v1/devices", json=body)
            except httpx.HTTPError as exc:
                failure.append(SimError(f"provisioning {name}: {exc!r}"))
                cancel.cancel()
                return
        if response.status_code not in (200, 201):
            failure.append(SimError(f"provisioning {name}: HTTP {response.status_code} {response.text[:300]}"))
            cancel.cancel()
            return
        try:
            data = response.json()["data"]
            created.append({"id": str(data["id"]), "token": str(data["token"])})
        except (ValueError, KeyError, TypeError):
            failure.append(SimError(f"provisioning {name}: unexpected answer {response.text[:300]}"))
            cancel.cancel()

    async with httpx.AsyncClient(base_url=hub_url, headers=headers, transport=transport, timeout=30) as client:
        fleet_id = None if fleet is None else await _fleet_id(client, fleet)
        async with trio.open_nursery() as nursery:
            for name in names:
                nursery.start_soon(create, client, name, nursery.cancel_scope)
    if failure:
        raise failure[0]
    return created


async def _fleet_id(client: httpx.AsyncClient, fleet: str) -> str:
    """``--fleet`` as typed (an id or a name) as the fleet's id; any failure is a SimError."""
    async def fetch(path: str, params: dict[str, str]) -> Any:
        try:
            response = await client.get(path, params=params)
            body = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as exc:
            raise SimError(f"looking up fleet {fleet!r}: {exc!r}") from None
        if body is None:
            raise SimError(f"looking up fleet {fleet!r}: HTTP {response.status_code} {response.text[:300]}")
        return body

    try:
        return await resolve("fleet", fleet, fetch)
    except NameLookupError as exc:
        raise SimError(str(exc)) from None


async def run_sim(hub_url: str, n: int, data_dir: Path, *, pat_id: str | None = None,
                  pat_secret: str | None = None, org_id: str | None = None,
                  fleet: str | None = None, devices: Iterable[tuple[str, str]] | None = None,
                  clock: Clock | None = None, connect_concurrency: int = 200,
                  ready_timeout: float = 120.0, agent_options: dict[str, Any] | None = None,
                  http_transport: httpx.AsyncBaseTransport | None = None,
                  memory_faults: list[str] | None = None,
                  memory_budget: int | None = None, workload_user: RunAs | None = _AUTO,
                  fake_containers: bool = False,
                  task_status: trio.TaskStatus[list[Agent]] = trio.TASK_STATUS_IGNORED) -> None:
    """Run ``n`` agents until cancelled.

    ``task_status.started(agents)`` fires once every agent has had its first welcome, or after
    ``ready_timeout`` seconds, whichever is first: a sim with a few unreachable devices still starts,
    and the caller reads ``agent.connected`` / ``statistics()`` to see which ones are linked.
    Devices handed in with ``devices`` come first, then those in sim.json, then new ones (in ``fleet``,
    its id or its name, when given).
    ``workload_user``: the account of every workload (default: ``simulator_user()``). ``hub_url`` may
    name several nodes, comma-separated: devices are provisioned through the first, and each agent
    fails over along the list (device_client/agentconfig.py ``hub_urls``). ``agent_options`` go to every
    ``AgentConfig``; tunnels among them come from the launcher, ``{"tunnel": TunnelConfig, "tunnel_engine":
    webrtc.device_tunnel.attach}`` (hub/cli.py, hub/demo.py): without them the devices have none.
    """
    primary = hub_urls(hub_url)[0]
    data_dir = Path(data_dir)
    registry = await trio.to_thread.run_sync(load_registry, data_dir)
    given = [{"id": str(i), "token": str(t)} for i, t in (devices or [])]
    given_ids = {d["id"] for d in given}
    registry = given + [d for d in registry if d["id"] not in given_ids]
    dirty = bool(given)
    missing = n - len(registry)
    if missing > 0:
        if not (pat_id and pat_secret):
            raise SimError(f"{data_dir / 'sim.json'} has {len(registry)} devices, {n} wanted; pass a "
                           "personal access token (pat_id, pat_secret) to provision the rest")
        first = len(registry) + 1
        names = [f"sim-{k}" for k in range(first, first + missing)]
        log.info("sim: provisioning %d devices at %s", missing, primary)
        try:
            await provision(primary, names, pat_id=pat_id, pat_secret=pat_secret, org_id=org_id,
                            fleet=fleet, transport=http_transport, into=registry)
        finally:
            await trio.to_thread.run_sync(save_registry, data_dir, registry)
        dirty = False
    if dirty:
        await trio.to_thread.run_sync(save_registry, data_dir, registry)

    chosen = registry[:n]
    for d in chosen:
        if not _SAFE_ID.match(d["id"]):
            raise SimError(f"device id {d['id']!r} cannot be used as a directory name")
    limiter = trio.CapacityLimiter(connect_concurrency)
    clock = clock or Clock()
    # Simulated devices share one user account: file owners other than ours cannot be set, so they
    # are recorded as intended (a real device agent runs as root and sets them).
    options: dict[str, Any] = {"ignore_owner": True}
    try:
        user = simulator_user() if workload_user is _AUTO else workload_user
    except ValueError as exc:
        raise SimError(str(exc)) from None
    if user is not None and user.is_other():
        options.update(workload_user=user, owner_for_all_files=(user.uid, user.gid))
        log.info("sim: workloads run as %s (uid %d)", user.name, user.uid)
    devices_dir = data_dir / "devices"
    devices_dir.mkdir(parents=True, exist_ok=True)
    # the workload account passes through to its own device, but lists no other device's id
    devices_dir.chmod(0o711 if options.get("workload_user") else 0o700)
    options.update(agent_options or {})
    # memory tests: the i-th --memory-fault to the i-th device, each capped at its memory budget
    agents = [Agent(AgentConfig(hub_url, d["token"], data_dir / "devices" / d["id"], clock=clock,
                                connect_limiter=limiter,
                                **{"memtest": sim_config(i, memory_faults, memory_budget),
                                   **({"container_engine": FakeEngine()} if fake_containers else {}), **options}))
              for i, d in enumerate(chosen)]
    async with trio.open_nursery() as nursery:
        for agent in agents:
            nursery.start_soon(agent.run)
        with trio.move_on_after(ready_timeout):
            for agent in agents:
                await agent.wait_connected()
        linked = sum(agent.connected for agent in agents)
        (log.info if linked == len(agents) else log.warning)("sim: %d of %d agents linked", linked, len(agents))
        task_status.started(agents)
