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
        user = await s.orgs.create_user(f"{uuid.uuid4().hex[:8]}@test.local", now)
        await s.orgs.add_member(uuid.UUID(org_id or self.org_id), user["id"], role, now)
        pat_id, secret = new_pat()
        await s.tokens.create_pat(pat_id, user["id"], digest(secret), now)
        return pat_id, secret


async def start_hub(nursery: trio.Nursery, db_url: str, data_dir: Path, *, clock=None, **settings: Any) -> Hub:
    cfg = Settings(data_dir=data_dir, database_url=db_url, port=0, **settings)
    services, base_url = await nursery.start(partial(run_hub, cfg, clock=clock))
    now = services.clock.now()
    org = await services.orgs.create_org("Test Org", now)
    user = await services.orgs.create_user(f"admin-{uuid.uuid4().hex[:6]}@test.local", now)
    await services.orgs.add_member(org["id"], user["id"], "admin", now)
    pat_id, secret = new_pat()
    await services.tokens.create_pat(pat_id, user["id"], digest(secret), now)
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
