"""The assistant against a real hub, real PostgreSQL and a real local model server (the documented
fake in upstream_fake.py): chunks passed through unchanged, tool calls run with the caller's own
permissions, upstream failures before and after the first chunk, and metering."""

from __future__ import annotations

import datetime as dt
import json
import uuid

import trio

from hub.assistant.schema import SYSTEM_PROMPT
from hub.assistant.tools import TOOL_DEFINITIONS
from tests.api.assistant_helpers import content, events, sign_in
from tests.api.upstream_fake import (
    FakeModel,
    start_fake_model,
    text_chunks,
    tool_call_chunks,
)
from tests.hubtools import assert_error, start_hub, wait_for
from tests.ports import free_port


async def _hub_with_model(nursery, db_url, tmp_path, model: FakeModel | None = None, **settings):
    fake = await start_fake_model(nursery, model)
    hub = await start_hub(nursery, db_url, tmp_path, assistant_upstream=fake.base_url,
                          assistant_key="sk-upstream-secret", **settings)
    return hub, fake


async def _usage_rows(hub) -> dict:
    await hub.services.meter.flush()
    today = hub.services.clock.now().date()
    rows = await hub.services.stores.usage.daily(uuid.UUID(hub.org_id), today, today + dt.timedelta(days=1))
    return {(r["product"], r["key"]): int(r["quantity"]) for r in rows if r["product"].startswith("assistant_")}


async def test_chunks_pass_through_unchanged_and_usage_is_metered(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        sent = text_chunks("Three devices are online.", usage=(123, 45))
        hub, fake = await _hub_with_model(nursery, db_url, tmp_path, FakeModel(respond=lambda body: [*sent, "done"]))
        browser = await sign_in(hub)
        r = await browser.chat(question="how are my devices?", stream_options={"include_usage": True})
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/event-stream")
        got = events(r.text)
        # Byte for byte the chunks the model sent (its JSON text), then [DONE].
        assert got == [json.dumps(c, separators=(",", ":")) for c in sent] + ["[DONE]"]
        assert content(got) == "Three devices are online."
        # What the model received: the key as bearer, usage asked for, the prompt first, the
        # hub's own tool definitions (the whole allow-list when the caller named none).
        req = fake.requests[0]
        assert req["headers"]["authorization"] == "Bearer sk-upstream-secret"
        assert req["body"]["stream"] is True and req["body"]["stream_options"] == {"include_usage": True}
        assert req["body"]["messages"][0] == {"role": "system", "content": SYSTEM_PROMPT}
        assert req["body"]["tools"] == TOOL_DEFINITIONS
        usage = await _usage_rows(hub)
        key = str(browser.user_id)
        assert usage == {("assistant_prompt_tokens", key): 123, ("assistant_completion_tokens", key): 45}
        assert "sk-upstream-secret" not in r.text


async def _member_with_one_fleet(hub):
    fleets = {}
    for name in ("fleet-visible", "fleet-hidden"):
        r = await hub.call("POST", "/v1/fleets", json={"name": name})
        assert r.status_code == 201, r.text
        fleets[name] = r.json()["data"]["id"]
    dev_ok, _ = await hub.provision("robot-visible", fleet_id=fleets["fleet-visible"])
    dev_hidden, _ = await hub.provision("robot-hidden", fleet_id=fleets["fleet-hidden"])
    member = await sign_in(hub, "member")
    await hub.services.stores.identity.grant(uuid.UUID(hub.org_id), "fleet", uuid.UUID(fleets["fleet-visible"]), "viewer",
                                      "user", member.user_id, hub.services.clock.now())
    await hub.services.invalidate(f"relations:{hub.org_id}")
    return member, dev_ok, dev_hidden


async def test_tool_call_runs_with_the_callers_own_permissions(nursery, db_url, tmp_path):
    with trio.fail_after(40):
        hub, fake = await _hub_with_model(nursery, db_url, tmp_path)
        member, _, dev_hidden = await _member_with_one_fleet(hub)
        r = await member.chat(question="which devices do I have?")
        assert r.status_code == 200, r.text
        got = events(r.text)
        assert got[-1] == "[DONE]"
        chunks = [json.loads(d) for d in got[:-1]]
        # The tool-call round stays inside the hub: no tool_calls deltas and no tool_calls finish.
        assert not any((c["choices"] or [{}])[0].get("delta", {}).get("tool_calls") for c in chunks)
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]] \
            == ["stop"]
        answer = content(got)
        assert answer.startswith("Tool said: ") and "robot-visible" in answer
        assert "robot-hidden" not in answer and dev_hidden not in answer and "fleet-hidden" not in answer
        # Round two carried the assistant's tool call and the hub's result for it.
        assert len(fake.requests) == 2
        second = fake.requests[1]["body"]["messages"]
        assert second[-2]["role"] == "assistant" and second[-2]["tool_calls"][0]["function"]["name"] == "list_devices"
        result = json.loads(second[-1]["content"])
        assert second[-1]["tool_call_id"] == "call_1"
        assert [d["name"] for d in result["devices"]] == ["robot-visible"] and result["total"] == 1
        usage = await _usage_rows(hub)
        assert usage[("assistant_tool_tokens", str(member.user_id))] == (len(second[-1]["content"]) + 3) // 4
        # The default fake answered round one with 20/5 and round two with 11/7 tokens.
        assert usage[("assistant_prompt_tokens", str(member.user_id))] == 31
        assert usage[("assistant_completion_tokens", str(member.user_id))] == 12

        # A direct question about the hidden fleet's device: it answers like a missing one.
        fake.respond = lambda body: ([*tool_call_chunks("get_device", {"device": dev_hidden}), "done"]
                                     if body["messages"][-1]["role"] == "user"
                                     else [*text_chunks("Tool said: " + body["messages"][-1]["content"]), "done"])
        r = await member.chat(question="tell me about that device")
        assert r.status_code == 200
        answer = content(events(r.text))
        assert "no such device is visible to you" in answer and "robot-hidden" not in answer
        # The org admin, asking the same, sees it.
        admin = await sign_in(hub, "admin")
        r = await admin.chat(question="tell me about that device")
        assert "robot-hidden" in content(events(r.text))


async def test_upstream_failure_before_the_first_chunk_is_502(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub, fake = await _hub_with_model(nursery, db_url, tmp_path, FakeModel(respond=lambda body: [("status", 500)]),
                                          assistant_timeout=1.0)
        browser = await sign_in(hub)
        r = await browser.chat(question="anything")
        body = assert_error(r, 502, "upstream_failed")
        assert "sk-upstream-secret" not in r.text and "fake failure" not in body["message"]
        # A model server that answers nothing at all within the timeout: 502 too, not a hang.
        fake.respond = lambda body: ["hang"]
        r = await browser.chat(question="anything")
        assert_error(r, 502, "upstream_failed")
        # Broken before its first chunk, and a tool round that fails before anything was sent.
        fake.respond = lambda body: ["break"]
        assert_error(await browser.chat(question="anything"), 502, "upstream_failed")


async def test_unreachable_upstream_is_502(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        port = free_port()  # nothing listens there
        hub = await start_hub(nursery, db_url, tmp_path, assistant_upstream=f"http://127.0.0.1:{port}/v1")
        browser = await sign_in(hub)
        assert_error(await browser.chat(question="anything"), 502, "upstream_failed")


async def test_upstream_failure_after_the_first_chunk_ends_the_stream_with_an_error_event(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        first = text_chunks("partial answer", usage=None)[:2]
        hub, fake = await _hub_with_model(nursery, db_url, tmp_path, FakeModel(respond=lambda body: [*first, "break"]),
                                          assistant_timeout=1.0)
        browser = await sign_in(hub)
        for steps in ([*first, "break"], [*first, "hang"]):
            fake.respond = lambda body, steps=steps: steps
            started = trio.current_time()
            r = await browser.chat(question="anything")
            assert r.status_code == 200, r.text
            got = events(r.text)
            assert got[:2] == [json.dumps(c, separators=(",", ":")) for c in first]
            assert "[DONE]" not in got
            error = json.loads(got[-1])["error"]
            assert error["code"] == "upstream_error" and error["message"]
            assert len(got) == 3
            assert trio.current_time() - started < 10
        # Completion tokens of the partial answer are still counted (the estimate: no usage came).
        usage = await _usage_rows(hub)
        assert usage[("assistant_completion_tokens", str(browser.user_id))] > 0


async def test_tool_rounds_are_bounded(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        # A model that calls a tool every time, even when offered none.
        always = FakeModel(respond=lambda body: [*tool_call_chunks("list_fleets", {}, call_id=f"c{len(body['messages'])}"),
                                                 "done"])
        hub, fake = await _hub_with_model(nursery, db_url, tmp_path, always)
        browser = await sign_in(hub)
        r = await browser.chat(question="loop forever")
        assert r.status_code == 200
        got = events(r.text)
        assert got[-1] == "[DONE]"
        chunks = [json.loads(d) for d in got[:-1]]
        finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        assert finishes == ["stop"]
        assert not any(c["choices"] and c["choices"][0]["delta"].get("tool_calls") for c in chunks)
        assert len(fake.requests) == 4
        assert all("tools" in req["body"] for req in fake.requests[:3]) and "tools" not in fake.requests[3]["body"]
        # Three tool rounds ran: three calls and three results went back.
        assert [m["role"] for m in fake.requests[3]["body"]["messages"][2:]] == ["assistant", "tool"] * 3


async def test_a_tool_that_was_not_offered_is_not_run(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub, fake = await _hub_with_model(nursery, db_url, tmp_path)
        await hub.provision("robot-1")
        browser = await sign_in(hub)
        # Only list_fleets offered; the model asks for list_devices anyway.
        fake.respond = lambda body: ([*tool_call_chunks("list_devices", {}), "done"]
                                     if body["messages"][-1]["role"] == "user"
                                     else [*text_chunks("Tool said: " + body["messages"][-1]["content"]), "done"])
        r = await browser.chat(question="devices?", tools=[{"type": "function", "function": {"name": "list_fleets"}}])
        answer = content(events(r.text))
        assert "tool_not_allowed" in answer and "robot-1" not in answer
        assert [t["function"]["name"] for t in fake.requests[0]["body"]["tools"]] == ["list_fleets"]


async def test_a_client_that_goes_away_mid_stream_is_counted_and_the_model_stream_closed(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        first = text_chunks("a long answer", usage=None)[:2]
        hub, fake = await _hub_with_model(nursery, db_url, tmp_path, FakeModel(respond=lambda body: [*first, "hang"]))
        browser = await sign_in(hub)
        body = {"messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "go"}]}
        async with browser.client.stream("POST", "/v1/assistant/chat/completions", headers=browser.headers,
                                         json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data:"):
                    break  # the first chunk arrived: hang up
        # The model's answer hangs (timeout 60 s), yet the request is over and counted at once.
        async def counted() -> bool:
            return ("assistant_completion_tokens", str(browser.user_id)) in await _usage_rows(hub)
        await wait_for(counted, timeout=10)
        assert len(fake.requests) == 1
