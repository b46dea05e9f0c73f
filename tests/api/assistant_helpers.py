"""Shared by the assistant tests: a signed-in dashboard session, a chat call, the SSE parser."""

from __future__ import annotations

import json
import uuid

import httpx

from hub.assistant.schema import SYSTEM_PROMPT
from hub.auth.passwords import hash_password

PASSWORD = "correct horse battery"


class Browser:
    """A dashboard session: the cookie jar of an httpx client plus the CSRF token from sign-in."""

    def __init__(self, hub, client: httpx.AsyncClient, csrf: str, user_id: uuid.UUID, cookie: str) -> None:
        self.hub, self.client, self.csrf, self.user_id, self.cookie = hub, client, csrf, user_id, cookie

    @property
    def headers(self) -> dict:
        return {"X-Organization-ID": self.hub.org_id, "X-CSRF-Token": self.csrf}

    async def chat(self, messages: list[dict] | None = None, question: str = "hello", **body) -> httpx.Response:
        msgs = messages if messages is not None else [{"role": "system", "content": SYSTEM_PROMPT},
                                                      {"role": "user", "content": question}]
        r = await self.client.post("/v1/assistant/chat/completions", headers=self.headers,
                                   json={"model": "any", "messages": msgs, "stream": True, **body})
        return r

    async def usage(self) -> httpx.Response:
        return await self.client.get("/v1/assistant/usage", headers={"X-Organization-ID": self.hub.org_id})


async def sign_in(hub, role: str = "admin", *, staff: bool = False, org_id: str | None = None) -> Browser:
    s = hub.services
    email = f"{uuid.uuid4().hex[:8]}@dash.test"
    user = await s.stores.orgs.create_user(email, s.clock.now(), password_hash=hash_password(PASSWORD), is_staff=staff)
    await s.stores.orgs.add_member(uuid.UUID(org_id or hub.org_id), user["id"], role, s.clock.now())
    client = httpx.AsyncClient(base_url=hub.base_url, timeout=30)
    r = await client.post("/v1/auth/login", json={"email": email, "password": PASSWORD})
    assert r.status_code == 200, r.text
    cookie = r.headers["set-cookie"].split(";")[0]
    return Browser(hub, client, r.json()["data"]["csrfToken"], user["id"], cookie)


def events(text: str) -> list[str]:
    """The data fields of a server-sent event stream, in order (comments skipped)."""
    out = []
    for block in text.split("\n\n"):
        data = [line[5:].lstrip() if line.startswith("data:") else None for line in block.split("\n")]
        data = [d for d in data if d is not None]
        if data:
            out.append("\n".join(data))
    return out


def content(datas: list[str]) -> str:
    text = ""
    for d in datas:
        if d == "[DONE]":
            continue
        chunk = json.loads(d)
        for choice in chunk.get("choices") or []:
            text += (choice.get("delta") or {}).get("content") or ""
    return text
