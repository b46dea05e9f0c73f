"""A real hub for integration tests: in the test's trio run, on 127.0.0.1, a fresh database."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio

from hub.auth.pat import digest, new_pat
from hub.server import run_hub
from hub.services import Services
from hub.settings import Settings


@dataclass
class Hub:
    services: Services
    base_url: str
    org_id: str
    user_id: uuid.UUID
    pat: tuple[str, str]
    client: httpx.AsyncClient
    extra_orgs: dict[str, Any] = field(default_factory=dict)

    @property
    def headers(self) -> dict[str, str]:
        return {"X-API-Token-ID": self.pat[0], "X-API-Secret-Key": self.pat[1], "X-Organization-ID": self.org_id}

    async def call(self, method: str, path: str, *, headers: dict | None = None, **kw) -> httpx.Response:
        return await self.client.request(method, self.base_url + path,
                                         headers=self.headers if headers is None else headers, **kw)

    async def provision(self, name: str = "dev", **body) -> tuple[str, str]:
        r = await self.call("POST", "/v1/devices", json={"name": name, **body})
        assert r.status_code == 201, r.text
        data = r.json()["data"]
        return data["id"], data["token"]

    async def new_user(self, role: str, org_id: str | None = None) -> tuple[str, str]:
        """A user with ``role`` in the org (default: this hub's) and a PAT; returns (pat id, secret)."""
        s = self.services
        now = s.clock.now()
        user = await s.stores.orgs.create_user(f"{uuid.uuid4().hex[:8]}@test.local", now)
        await s.stores.orgs.add_member(uuid.UUID(org_id or self.org_id), user["id"], role, now)
        pat_id, secret = new_pat()
        await s.stores.tokens.create_pat(pat_id, user["id"], digest(secret), now)
        return pat_id, secret


async def start_hub(nursery: trio.Nursery, db_url: str, data_dir: Path, *, clock=None, **settings: Any) -> Hub:
    cfg = Settings(data_dir=data_dir, database_url=db_url, port=0, **settings)
    services, base_url = await nursery.start(partial(run_hub, cfg, clock=clock))
    now = services.clock.now()
    org = await services.stores.orgs.create_org("Test Org", now)
    user = await services.stores.orgs.create_user(f"admin-{uuid.uuid4().hex[:6]}@test.local", now)
    await services.stores.orgs.add_member(org["id"], user["id"], "admin", now)
    pat_id, secret = new_pat()
    await services.stores.tokens.create_pat(pat_id, user["id"], digest(secret), now)
    client = httpx.AsyncClient(timeout=30)
    return Hub(services, base_url, str(org["id"]), user["id"], (pat_id, secret), client)


async def wait_for(predicate, *, timeout: float = 10.0, interval: float = 0.02) -> None:
    """Poll ``predicate`` (sync or async) until true; a bounded wait, never an unbounded loop."""
    with trio.fail_after(timeout):
        while True:
            result = predicate()
            if hasattr(result, "__await__"):
                result = await result
            if result:
                return
            await trio.sleep(interval)


async def notifications_heard(hub: "Hub", *, timeout: float = 10.0) -> None:
    """Wait until the running hub has heard every NOTIFY committed before this call (another
    process's ``fleethub admin`` change, say). PostgreSQL delivers notifications in commit order, so
    once a marker sent now has reached the hub's LISTEN connection, so has everything before it."""
    from hub.services import AUTH_CHANNEL

    marker = f"test-marker-{uuid.uuid4().hex}"
    with hub.services.access.auth_cache.watch({marker}) as heard:
        await hub.services.db.execute("SELECT pg_notify($1, $2)", AUTH_CHANNEL, marker)
        await wait_for(lambda: heard.changed, timeout=timeout)


# ---- helpers for the integration tests ------------------------------------------------------------

FAST_BACKOFF = dict(backoff_initial=0.05, backoff_max=0.2)


async def open_hub(nursery: trio.Nursery, db_url: str, data_dir: Path, *, clock=None,
                   **settings: Any) -> tuple[Services, str]:
    """A hub on an existing database, creating nothing in it (a restart of an earlier hub).
    Binds a free port unless ``port`` is given."""
    cfg = Settings(data_dir=data_dir, database_url=db_url, **{"port": 0, **settings})
    return await nursery.start(partial(run_hub, cfg, clock=clock))


class Stoppable:
    """Something started in its own nursery and cancel scope, stopped like a process exit."""

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.stopped = trio.Event()
        self.value: Any = None

    async def stop(self) -> None:
        self.scope.cancel()
        with trio.fail_after(15):
            await self.stopped.wait()


async def start_stoppable(nursery: trio.Nursery, start) -> Stoppable:
    """``await start(inner_nursery)`` inside a child scope; its result is ``.value``."""
    handle = Stoppable()

    async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            with handle.scope:
                async with trio.open_nursery() as inner:
                    handle.value = await start(inner)
                    task_status.started()
        finally:
            handle.stopped.set()

    await nursery.start(run)
    return handle


@dataclass
class RunningAgent:
    agent: Any
    scope: trio.CancelScope
    done: trio.Event

    async def kill(self) -> None:
        """Stop the agent's task at once, like pulling the plug."""
        self.scope.cancel()
        with trio.fail_after(10):
            await self.done.wait()


async def start_agent(nursery: trio.Nursery, hub_url: str, token: str, data_dir: Path, *,
                      agent_cls=None, wait: bool = True, **options: Any) -> RunningAgent:
    """A real device agent in its own cancel scope; by default returns after its first welcome.
    Launched as ``fleethub agent`` launches it: with the tunnel engine (webrtc/device_tunnel.py), unless
    ``tunnel_engine=None`` is passed."""
    from device_client.agent import Agent, AgentConfig
    from webrtc.device_tunnel import attach as tunnel_engine

    agent = (agent_cls or Agent)(AgentConfig(hub_url, token, data_dir,
                                             **{**FAST_BACKOFF, "tunnel_engine": tunnel_engine, **options}))
    running = RunningAgent(agent, trio.CancelScope(), trio.Event())

    async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            with running.scope:
                await agent.run(task_status=task_status)
        finally:
            running.done.set()

    if wait:
        await nursery.start(run)
    else:
        nursery.start_soon(run)
    return running


def threads_calling(monkeypatch, owner: Any, name: str) -> list[bool]:
    """Wrap ``owner.name`` so that each call notes whether it ran on the main thread (a hub in a test
    serves on it): what work the loop must not do checks it went to a worker thread. The list fills as
    the wrapped callable is called."""
    import threading

    on_main: list[bool] = []
    wrapped = getattr(owner, name)

    def noted(*args: Any, **kwargs: Any) -> Any:
        on_main.append(threading.current_thread() is threading.main_thread())
        return wrapped(*args, **kwargs)
    monkeypatch.setattr(owner, name, noted)
    return on_main


def ca_loads_on_main_thread(monkeypatch) -> list[str]:
    """Each CA store loaded on the main thread (a hub or an agent in a test runs there), named by the
    ``ssl.SSLContext`` method that loaded it: what must be made once, off the loop, checks none is.
    The list fills as contexts load."""
    import ssl
    import threading

    seen: list[str] = []
    for name in ("load_verify_locations", "load_default_certs", "set_default_verify_paths"):
        original = getattr(ssl.SSLContext, name)

        def noted(self: Any, *args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            if threading.current_thread() is threading.main_thread():
                seen.append(_name)
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(ssl.SSLContext, name, noted)
    return seen


def metric_value(text: str, name: str, labels: dict[str, str] | None = None) -> float | None:
    """The value of one sample in Prometheus text; None when absent."""
    want = ""
    if labels:
        want = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, _, value = line.rpartition(" ")
        if key == name + want:
            return float(value)
    return None


async def metrics(hub: "Hub") -> str:
    r = await hub.client.get(hub.base_url + "/metrics")
    assert r.status_code == 200, r.text
    return r.text


async def device(hub: "Hub", device_id: str) -> dict:
    r = await hub.call("GET", f"/v1/devices/{device_id}")
    assert r.status_code == 200, r.text
    return r.json()["data"]


def assert_error(r: httpx.Response, status: int, code: str | None = None) -> dict:
    """An error answer of DESIGN.md section 7: JSON {"error", "message"}, never HTML, with a request id."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json"), r.headers["content-type"]
    assert "<html" not in r.text.lower()
    body = r.json()
    assert isinstance(body.get("error"), str) and body["error"], body
    assert isinstance(body.get("message"), str) and body["message"], body
    if code is not None:
        assert body["error"] == code, body
    assert r.headers.get("x-request-id"), "every response carries X-Request-ID"
    return body
