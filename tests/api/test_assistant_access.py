"""Who may use the assistant and every refusal before the stream starts: 400, 402, 403, 413, 429, 503;
the usage view with its budget decision, fair-use percent and the staff-only cost; the admin commands."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

import trio

from hub.admin import run_admin
from hub.assistant import schema
from hub.assistant.budget import seconds_to_midnight
from hub.assistant.schema import SYSTEM_PROMPT
from hub.auth.oauth import load_or_create_key
from hub.cli import build_parser
from hub.settings import Settings
from hub.tunnels.tokens import TunnelTokens
from storage.assistant import AssistantStore
from tests.api.assistant_helpers import content, events, sign_in
from tests.hubtools import assert_error, notifications_heard, open_hub, start_hub

SYSTEM = {"role": "system", "content": SYSTEM_PROMPT}


async def _spend(hub, user_id, prompt: int, completion: int = 0, tool: int = 0) -> None:
    s = hub.services
    day = s.clock.now().date()
    for product, n in (("assistant_prompt_tokens", prompt), ("assistant_completion_tokens", completion),
                       ("assistant_tool_tokens", tool)):
        s.meter.add(uuid.UUID(hub.org_id), product, n, day=day, key=str(user_id))
    await s.meter.flush()


async def test_only_signed_in_dashboard_sessions_may_chat(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        body = {"messages": [SYSTEM, {"role": "user", "content": "hi"}]}
        # A PAT, in both of its forms.
        assert_error(await hub.call("POST", "/v1/assistant/chat/completions", json=body), 403, "session_required")
        bearer = {"Authorization": f"Bearer {hub.pat[1]}", "X-Organization-ID": hub.org_id}
        assert_error(await hub.call("POST", "/v1/assistant/chat/completions", json=body, headers=bearer), 403,
                     "session_required")
        assert_error(await hub.call("GET", "/v1/assistant/usage"), 403, "session_required")
        # A service account's bearer token.
        r = await hub.call("POST", "/v1/service-accounts", json={"name": "ci", "policies": [
            {"relation": "viewer", "object_type": "organization"}]})
        sa = r.json()["data"]
        r = await hub.client.post(hub.base_url + "/v1/oauth/token", data={
            "grant_type": "client_credentials", "client_id": sa["client_id"], "client_secret": sa["client_secret"]})
        token = r.json()["access_token"]
        sa_headers = {"Authorization": f"Bearer {token}", "X-Organization-ID": hub.org_id}
        assert_error(await hub.call("POST", "/v1/assistant/chat/completions", json=body, headers=sa_headers), 403,
                     "session_required")
        assert_error(await hub.call("GET", "/v1/assistant/usage", headers=sa_headers), 403, "session_required")
        # A tunnel token (signed with the hub's key, as POST /v1/cli/tunnel/token issues them).
        tunnel, _ = TunnelTokens(load_or_create_key(tmp_path)).issue(
            "user", hub.user_id, uuid.UUID(hub.org_id), hub.pat[0], hub.services.clock.now())
        tunnel_headers = {"Authorization": f"Bearer {tunnel}", "X-Organization-ID": hub.org_id}
        assert_error(await hub.call("POST", "/v1/assistant/chat/completions", json=body, headers=tunnel_headers),
                     403, "session_required")
        assert_error(await hub.call("GET", "/v1/assistant/usage", headers=tunnel_headers), 403, "session_required")
        # No credential at all, and a session without its CSRF token.
        assert_error(await hub.call("POST", "/v1/assistant/chat/completions", json=body, headers={}), 401)
        browser = await sign_in(hub)
        r = await browser.client.post("/v1/assistant/chat/completions", json=body,
                                      headers={"X-Organization-ID": hub.org_id})
        assert_error(r, 403, "csrf_required")
        # The session of a member of another organisation.
        other = await hub.services.stores.orgs.create_org("Other", hub.services.clock.now())
        outsider = await sign_in(hub, org_id=str(other["id"]))
        assert_error(await outsider.chat(question="hi"), 403)
        r = await browser.chat(question="hi")
        assert r.status_code == 200 and events(r.text)[-1] == "[DONE]"


async def test_requests_are_validated_strictly(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        b = await sign_in(hub)
        user = {"role": "user", "content": "hi"}
        cases400 = [
            ([SYSTEM, {"role": "developer", "content": "hi"}], {}, "invalid_field"),
            ([SYSTEM, {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}], {},
             "invalid_field"),
            ([SYSTEM, {"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}], {}, "invalid_field"),
            ([SYSTEM, {"role": "user", "content": {"text": "hi"}}], {}, "invalid_field"),
            ([user], {}, "system_prompt_required"),
            ([{"role": "system", "content": "You are a pirate."}, user], {}, "system_prompt_required"),
            ([user, SYSTEM], {}, "system_prompt_required"),
            ([SYSTEM, user], {"tools": [{"type": "function", "function": {"name": "reboot_device"}}]},
             "tool_not_allowed"),
            ([SYSTEM, user], {"unknown": 1}, "unknown_field"),
            ([SYSTEM, user], {"stream": False}, "invalid_field"),
            ([SYSTEM, {"role": "tool", "content": "x"}], {}, "invalid_field"),
            ([], {}, "invalid_field"),
        ]
        for messages, extra, code in cases400:
            assert_error(await b.chat(messages, **extra), 400, code)
        r = await b.client.post("/v1/assistant/chat/completions", headers=b.headers, content=b"{not json")
        assert_error(r, 400, "malformed_json")
        # Size caps: 413, and the caps are the published ones.
        published = (await hub.client.get(hub.base_url + "/v1/assistant/system-prompt")).json()["data"]
        assert published["system_prompt"] == SYSTEM_PROMPT
        assert published["limits"]["max_messages"] == schema.MAX_MESSAGES
        many = [SYSTEM] + [user] * schema.MAX_MESSAGES
        assert_error(await b.chat(many), 413, "too_many_messages")
        assert (await b.chat(many[:schema.MAX_MESSAGES])).status_code == 200
        long = [SYSTEM, {"role": "user", "content": "x" * schema.MAX_CHARS}]
        assert_error(await b.chat(long), 413, "too_many_characters")
        tools = [{"type": "function", "function": {"name": "list_devices"}}] * (schema.MAX_TOOLS + 1)
        assert_error(await b.chat([SYSTEM, user], tools=tools), 413, "too_many_tools")
        huge = b"{" + b" " * schema.MAX_BODY_BYTES + b"}"
        r = await b.client.post("/v1/assistant/chat/completions", headers=b.headers, content=huge)
        assert_error(r, 413, "request_too_large")
        # Text parts are text content; an allow-listed subset of tools is accepted.
        parts = [SYSTEM, {"role": "user", "content": [{"type": "text", "text": "which "}, {"type": "text",
                                                                                          "text": "devices?"}]}]
        r = await b.chat(parts, tools=[{"type": "function", "function": {"name": "list_devices"}}])
        assert r.status_code == 200, r.text
        assert "You can see no devices." in content(events(r.text))


async def test_budget_402_soft_limit_and_fair_use_429(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path, assistant_daily_user_tokens=2000)
        s = hub.services
        org_id = uuid.UUID(hub.org_id)
        await AssistantStore(s.db).set_budget(org_id, 5000, 50, s.clock.now())
        a, b = await sign_in(hub), await sign_in(hub)
        u = (await a.usage()).json()["data"]
        assert u["decision"] == "allowed" and u["monthly_tokens"] == 5000 and u["soft_limit_tokens"] == 2500
        assert u["fair_use"] == {"daily_tokens": 2000, "used_tokens": 0, "percent_used": 0.0,
                                 "resets_at": (s.clock.now().date() + dt.timedelta(days=1)).isoformat() + "T00:00:00Z"}
        assert u["tokens"] == {"prompt": 0, "completion": 0, "tool": 0} and "upstream_cost" not in u
        await _spend(hub, a.user_id, 1800, 200, 0)       # a: 2000 today, the whole allowance
        await _spend(hub, b.user_id, 1000, 500, 100)     # b: 1600 (80 %); the org: 3600, past the soft limit
        r = await a.chat(question="hi")
        assert_error(r, 429, "fair_use_exhausted")
        assert abs(int(r.headers["Retry-After"]) - seconds_to_midnight(s.clock.now())) <= 3
        assert (await a.usage()).json()["data"]["fair_use"]["percent_used"] == 100.0
        u = (await b.usage()).json()["data"]
        assert u["decision"] == "soft_limit_reached" and u["used_tokens"] == 3600
        assert u["tokens"] == {"prompt": 2800, "completion": 700, "tool": 100}
        assert u["fair_use"]["used_tokens"] == 1600 and u["fair_use"]["percent_used"] == 80.0
        r = await b.chat(question="hi")                  # soft limit: still answered
        assert r.status_code == 200 and events(r.text)[-1] == "[DONE]"
        await _spend(hub, a.user_id, 1500)               # the org: past 5000
        c = await sign_in(hub)
        assert_error(await c.chat(question="hi"), 402, "budget_exhausted")
        assert (await c.usage()).json()["data"]["decision"] == "blocked"


async def test_staff_see_the_upstream_cost(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path, assistant_price_prompt=2.0, assistant_price_completion=8.0)
        staff = await sign_in(hub, "member", staff=True)
        member = await sign_in(hub, "member")
        await _spend(hub, member.user_id, 500_000, 250_000, 1000)
        u = (await staff.usage()).json()["data"]
        cost = u["upstream_cost"]
        # 0.5 M prompt at 2 USD and 0.25 M completion at 8 USD; tool tokens are not priced twice.
        assert cost["currency"] == "USD" and cost["today"] == 3.0
        assert cost["days"] == [{"day": hub.services.clock.now().date().isoformat(), "cost": 3.0}]
        assert "upstream_cost" not in (await member.usage()).json()["data"]


async def test_assistant_off_is_503(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path, assistant_enabled=False)
        b = await sign_in(hub)
        assert_error(await b.chat(question="hi"), 503, "assistant_disabled")
        assert_error(await b.usage(), 503, "assistant_disabled")
        assert_error(await hub.call("GET", "/v1/assistant/usage"), 403, "session_required")


async def test_admin_commands_set_the_budget_and_the_staff_flag(nursery, db_url, tmp_path):
    with trio.fail_after(40):
        hub = await start_hub(nursery, db_url, tmp_path)
        b = await sign_in(hub)
        email = (await hub.services.db.fetchrow("SELECT email FROM users WHERE id = $1", b.user_id))["email"]
        settings = Settings(data_dir=tmp_path, database_url=db_url)
        # The arguments as `fleethub admin …` parses them.
        def cli(*argv: str):
            return build_parser().parse_args(["admin", *argv])

        out = await run_admin(settings, cli("assistant-budget", hub.org_id, "--monthly-tokens", "10",
                                            "--soft-percent", "60"))
        assert out == {"org_id": hub.org_id, "monthly_tokens": 10, "soft_percent": 60}
        out = await run_admin(settings, cli("staff", email, "--on"))
        assert out["is_staff"] is True
        await notifications_heard(hub)  # another process's change: the hub hears it by NOTIFY
        u = (await b.usage()).json()["data"]
        assert u["monthly_tokens"] == 10 and u["soft_limit_tokens"] == 6 and "upstream_cost" in u
        await _spend(hub, b.user_id, 10)
        assert_error(await b.chat(question="hi"), 402, "budget_exhausted")
        out = await run_admin(settings, cli("staff", email, "--off"))
        assert out["is_staff"] is False
        await notifications_heard(hub)
        assert "upstream_cost" not in (await b.usage()).json()["data"]


async def test_concurrent_chats_on_two_nodes_cannot_overspend_the_budget(nursery, db_url, tmp_path):
    """Issue 31 item 3: a budget of 300 tokens, one chat, then 20 at once answered 200 and used 14,028.
    Now each answer holds its reservation in PostgreSQL before it starts, so however many run, on
    however many hub nodes, the budget is overspent by at most one answer."""
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "a")
        s = hub.services
        org_id = uuid.UUID(hub.org_id)
        other_services, other_url = await open_hub(nursery, db_url, tmp_path / "b")  # a second node
        other = dataclasses.replace(hub, services=other_services, base_url=other_url)
        first = await sign_in(hub)
        r = await first.chat(question="how many devices?", max_tokens=64)
        assert r.status_code == 200
        await s.meter.flush()  # where usage went before reservations: counted all the same
        one_answer = (await first.usage()).json()["data"]["used_tokens"]
        assert one_answer > 0
        budget = one_answer * 4
        await AssistantStore(s.db).set_budget(org_id, budget, 80, s.clock.now())
        browsers = [await sign_in(hub if i % 2 else other) for i in range(20)]
        results: list[int] = []

        async def ask(b) -> None:
            results.append((await b.chat(question="how many devices?", max_tokens=64)).status_code)

        async with trio.open_nursery() as n:
            for b in browsers:
                n.start_soon(ask, b)
        await s.meter.flush()
        await other_services.meter.flush()
        assert set(results) <= {200, 402} and 200 in results and 402 in results, results
        used = (await first.usage()).json()["data"]["used_tokens"]
        assert used <= budget + one_answer, (used, budget, results)
        held = await s.db.fetchval("SELECT count(*) FROM assistant_reservations WHERE org_id = $1", org_id)
        assert held == 0  # every answer settled its hold
