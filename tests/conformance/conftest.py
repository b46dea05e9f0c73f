"""ONE real hub (embedded PostgreSQL, real agents on 127.0.0.1) for the whole conformance suite.

pytest-trio runs every test in its own trio run, so a hub shared between tests lives in a thread
with a trio run of its own. Tests are plain functions: they call the hub over HTTP with ``spec.call``
(a synchronous httpx client with a timeout) and reach into the hub's trio run with ``spec.run``
(``trio.from_thread.run``) for what only the hub process can do (a service account, a tier).
Every test makes what it needs under fresh names, so the order of tests does not matter.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from device_client.memtest import MemtestConfig
from tests.hubtools import Hub, start_agent, start_hub
from tests.threadhub import hub_in_thread

SMALL_MEMORY = 256 << 10


@dataclass
class SpecHub:
    hub: Hub
    token: trio.lowlevel.TrioToken
    http: httpx.Client
    device_id: str            # linked, with a real agent that runs memory tests
    offline_device_id: str    # provisioned, never linked
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return self.hub.base_url

    @property
    def org_id(self) -> str:
        return self.hub.org_id

    @property
    def headers(self) -> dict[str, str]:
        return self.hub.headers

    def call(self, method: str, path: str, *, headers: dict | None = None, **kw) -> httpx.Response:
        try:
            return self.http.request(method, self.base_url + path,
                                     headers=self.headers if headers is None else headers, **kw)
        except httpx.ConnectError:
            self._say_why_stopped()
            raise

    def run(self, afn, *args):
        """``await afn(*args)`` in the hub's trio run; its result."""
        try:
            return trio.from_thread.run(afn, *args, trio_token=self.token)
        except trio.RunFinishedError:
            self._say_why_stopped()
            raise

    def _say_why_stopped(self) -> None:
        # The shared hub's trio run ended (every later call of this worker fails the same way): say
        # why, from the exception its thread kept (tests/threadhub.py), not only "refused".
        error = self.extra.get("ready", {}).get("error")
        if error is not None:
            raise RuntimeError("the conformance hub stopped; its trio run ended with the error above") from error

    def new_user(self, role: str, org_id: str | None = None) -> dict[str, str]:
        pat_id, secret = self.run(self.hub.new_user, role, org_id)
        return {"X-API-Token-ID": pat_id, "X-API-Secret-Key": secret, "X-Organization-ID": org_id or self.org_id}

    def new_org(self, tier: str = "standard", rate_limit: int | None = None) -> dict[str, str]:
        """A second organisation, with an admin's PAT headers for it."""
        async def make() -> str:
            s = self.hub.services
            org = await s.stores.orgs.create_org(f"org-{uuid.uuid4().hex[:6]}", s.clock.now())
            await s.db.execute("UPDATE organizations SET tier = $2, rate_limit = $3 WHERE id = $1",
                               org["id"], tier, rate_limit)
            await s.invalidate(f"org:{org['id']}")
            return str(org["id"])

        org_id = self.run(make)
        return self.new_user("admin", org_id)

    def linked_device(self, name: str = "dev", **memtest: Any) -> str:
        """A new device with its own real agent (small memory for memory tests, and the
        MemtestConfig options given: a simulated ``fault``, ``enabled`` False, ...), linked; its id."""
        config = MemtestConfig(**{"budget": SMALL_MEMORY, "chunk_words": 1 << 13, **memtest})

        async def make() -> str:
            device_id, token = await self.hub.provision(f"{name}-{uuid.uuid4().hex[:6]}")
            where = self.extra["root"] / f"agent-{device_id}"
            running = await start_agent(self.extra["nursery"], self.base_url, token, where, memtest=config)
            self.extra.setdefault("agents", {})[device_id] = (running, token, where, config)
            return device_id

        return self.run(make)

    def unplug(self, device_id: str) -> None:
        """Stop a linked_device's agent for good, and wait until the hub has seen it go."""
        running = self.extra["agents"][device_id][0]

        async def unplug() -> None:
            await running.kill()
            with trio.fail_after(10):
                while uuid.UUID(device_id) in self.hub.services.links:
                    await trio.sleep(0.05)

        self.run(unplug)

    def reset_device(self, device_id: str) -> None:
        """Pull the plug on a linked_device's agent and start it again on the same data: a device
        reset as the agent's next boot sees it."""
        running, token, where, config = self.extra["agents"][device_id]

        async def reset() -> None:
            await running.kill()
            again = await start_agent(self.extra["nursery"], self.base_url, token, where, memtest=config)
            self.extra["agents"][device_id] = (again, token, where, config)

        self.run(reset)

    def signed_in(self, role: str = "admin") -> tuple[httpx.Client, dict[str, str]]:
        """A dashboard session of a new member with ``role``: the client (it holds the cookie; the
        caller closes it) and the headers a mutating call sends with it."""
        from hub.auth.passwords import hash_password

        email = f"op-{uuid.uuid4().hex[:6]}@example.test"

        async def make() -> None:
            s = self.hub.services
            user = await s.stores.orgs.create_user(email, s.clock.now(), password_hash=hash_password("correct horse"))
            await s.stores.orgs.add_member(uuid.UUID(self.org_id), user["id"], role, s.clock.now())

        self.run(make)
        browser = httpx.Client(base_url=self.base_url, timeout=30)
        r = browser.post("/v1/auth/login", json={"email": email, "password": "correct horse"})
        assert r.status_code == 200, r.text
        return browser, {"X-Organization-ID": self.org_id, "X-CSRF-Token": r.json()["data"]["csrfToken"]}

    def service_bearer(self, relation: str = "editor") -> dict[str, str]:
        """Headers with a service account's access token (OAuth client credentials)."""
        r = self.call("POST", "/v1/service-accounts", json={
            "name": f"sa-{uuid.uuid4().hex[:6]}", "policies": [{"relation": relation, "object_type": "organization"}]})
        assert r.status_code == 201, r.text
        sa = r.json()["data"]
        r = self.http.post(self.base_url + "/v1/oauth/token", data={
            "grant_type": "client_credentials", "client_id": sa["client_id"], "client_secret": sa["client_secret"]})
        assert r.status_code == 200, r.text
        return {"Authorization": f"Bearer {r.json()['access_token']}", "X-Organization-ID": self.org_id}


@pytest.fixture(scope="session")
def spec(pg_server_dsn, pg_template):
    async def setup(nursery: trio.Nursery, db_url: str, root: Path) -> dict[str, Any]:
        hub = await start_hub(nursery, db_url, root / "hub", heartbeat_interval=1.0)
        # The suite is one caller making a few hundred calls: room for all of them.
        await hub.services.db.execute(
            "UPDATE organizations SET tier = 'enterprise', rate_limit = 1000000 WHERE id = $1::uuid",
            hub.org_id)
        await hub.services.invalidate(f"org:{hub.org_id}")
        device_id, token = await hub.provision("conformance-device")
        await start_agent(nursery, hub.base_url, token, root / "agent",
                          memtest=MemtestConfig(budget=SMALL_MEMORY, chunk_words=1 << 13))
        offline_id, _ = await hub.provision("conformance-offline")
        return {"hub": hub, "device_id": device_id, "offline_id": offline_id}

    with hub_in_thread(pg_server_dsn, pg_template, "conformance", setup, start_timeout=60) as ready, \
            httpx.Client(timeout=30) as http:
        yield SpecHub(ready["hub"], ready["token"], http, ready["device_id"], ready["offline_id"],
                      {"nursery": ready["nursery"], "root": ready["root"], "ready": ready})
