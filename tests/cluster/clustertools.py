"""Hub nodes as real ``fleethub serve`` processes sharing one database and one nats-server."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import trio

from hub.auth.pat import digest, new_pat
from hub.services import open_services
from hub.settings import Settings
from tests.e2e.clitools import free_port
from tests.e2e.killtools import EnvProc


class Node:
    def __init__(self, name: str, db_url: str, nats_url: str, data_dir: Path, log_dir: Path,
                 env: dict[str, str] | None = None) -> None:
        self.name, self.port = name, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = EnvProc(f"node-{name}", ["serve", "--port", str(self.port), "--node-id", name], log_dir, {
            "FLEETHUB_DATABASE_URL": db_url, "FLEETHUB_NATS_URL": nats_url,
            "FLEETHUB_DATA_DIR": str(data_dir), **(env or {})})

    async def ready(self, client: httpx.AsyncClient, timeout: float = 30) -> None:
        with trio.fail_after(timeout):
            while True:
                if self.proc.popen.poll() is not None:
                    raise AssertionError(f"node {self.name} exited\n{self.proc.log_tail()}")
                try:
                    if (await client.get(self.url + "/readyz", timeout=2)).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await trio.sleep(0.1)


async def seed(db_url: str, data_dir: Path) -> tuple[str, dict[str, str]]:
    """An organisation with an admin's PAT, written straight to the shared database (as ``fleethub
    admin`` would): returns the org id and the API headers."""
    async with open_services(Settings(data_dir=data_dir, database_url=db_url), serving=False) as s:
        now = s.clock.now()
        org = await s.stores.orgs.create_org("Cluster Org", now)
        user = await s.stores.orgs.create_user(f"admin-{uuid.uuid4().hex[:6]}@test.local", now)
        await s.stores.orgs.add_member(org["id"], user["id"], "admin", now)
        pat_id, secret = new_pat()
        await s.stores.tokens.create_pat(pat_id, user["id"], digest(secret), now)
    return str(org["id"]), {"X-API-Token-ID": pat_id, "X-API-Secret-Key": secret,
                            "X-Organization-ID": str(org["id"])}
