"""A session's ``tools/call`` answered in its own POST's task (hub/mcp/session_call.py) against a real hub:
the answers are those of the SDK's own route, and the session's rules hold: a call before the session is
initialized, one that asks for progress or one with another protocol version goes the SDK's way; a
``notifications/cancelled`` cancels a call; a DELETE during a call ends it with 500, as the SDK does."""

from __future__ import annotations

import httpx
import trio

from hub.mcp import inproc
from tests.hubtools import start_hub, wait_for
from tests.mcp.mcptools import call, endpoint_of, http_session, pat_headers

URL = "/v1/mcp"
VERSION = "2025-11-25"
ACCEPT = {"Accept": "application/json, text/event-stream"}



async def open_session(client: httpx.AsyncClient, base: str, *, initialized: bool = True) -> dict[str, str]:
    """A session opened by hand (initialize, then notifications/initialized unless told not to): its headers."""
    r = await client.post(base + URL, headers=ACCEPT, json={"jsonrpc": "2.0", "id": 0, "method": "initialize",
                          "params": {"protocolVersion": VERSION, "capabilities": {},
                                     "clientInfo": {"name": "t", "version": "1"}}})
    assert r.status_code == 200, r.text
    head = {**ACCEPT, "Mcp-Session-Id": r.headers["mcp-session-id"], "Mcp-Protocol-Version": VERSION}
    if initialized:
        r = await client.post(base + URL, headers=head, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert r.status_code == 202, r.text
    return head


def tool_call(request_id: int, name: str, **arguments) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


async def test_a_sessions_calls_are_answered_in_their_post_as_the_sdk_answers_them(nursery, db_url, tmp_path):
    with trio.fail_after(90):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        dev, _ = await hub.provision("pump")
        calls = endpoint_of(hub).calls
        async with http_session(hub.base_url, pat_headers(hub.pat, hub.org_id)) as mcp:
            before = calls.served
            err, page = await call(mcp, "list_devices")
            assert not err and [d["id"] for d in page["data"]] == [dev]
            assert calls.served == before + 1  # answered in its POST's task

            async def progress(value: float, total: float | None, message: str | None) -> None:
                raise AssertionError("list_devices sends no progress")
            sdk = await mcp.call_tool("list_devices", {}, progress_callback=progress)  # the SDK's route (SSE)
            assert calls.served == before + 1
            assert sdk.structured_content == page and not sdk.is_error

            for name, arguments in (("ping_device", {"device_id": "not-a-uuid"}), ("no_such_tool", {}),
                                    ("get_device", {"device_id": "00000000-0000-4000-8000-000000000000"})):
                fast = await mcp.call_tool(name, arguments)
                slow = await mcp.call_tool(name, arguments, progress_callback=progress)
                assert fast.is_error and (fast.structured_content, fast.content) == (slow.structured_content,
                                                                                    slow.content), name
            assert calls.served == before + 4 and not len(calls)

        async with httpx.AsyncClient(headers=pat_headers(hub.pat, hub.org_id), timeout=30) as client:
            head = await open_session(client, hub.base_url, initialized=False)
            served = calls.served
            r = await client.post(hub.base_url + URL, headers=head, json=tool_call(1, "list_fleets"))
            assert calls.served == served, "a call before notifications/initialized is the SDK's to answer"
            head = await open_session(client, hub.base_url)
            r = await client.post(hub.base_url + URL, headers={**head, "Mcp-Protocol-Version": "2025-06-18"},
                                  json=tool_call(2, "list_fleets"))
            assert calls.served == served, "a version other than the session's is the SDK's to judge"
            r = await client.post(hub.base_url + URL, headers=head, json=tool_call(3, "list_fleets"))
            assert r.status_code == 200 and r.json()["id"] == 3 and not r.json()["result"]["isError"], r.text
            assert r.headers["mcp-session-id"] == head["Mcp-Session-Id"]
            assert calls.served == served + 1


async def test_a_call_is_cancelled_by_notifications_cancelled_and_ended_by_delete(nursery, db_url, tmp_path,
                                                                                   monkeypatch):
    with trio.fail_after(90):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        calls = endpoint_of(hub).calls
        release = trio.Event()
        real = inproc.call

        async def held(app, **kw):  # list_fleets waits until released: a call that takes its time
            if kw.get("tool") == "list_fleets":
                await release.wait()
            return await real(app, **kw)
        monkeypatch.setattr(inproc, "call", held)

        async with httpx.AsyncClient(headers=pat_headers(hub.pat, hub.org_id), timeout=30) as client:
            head = await open_session(client, hub.base_url)
            answers: dict[int, httpx.Response] = {}

            async def post(request_id: int) -> None:
                answers[request_id] = await client.post(hub.base_url + URL, headers=head,
                                                        json=tool_call(request_id, "list_fleets"))

            async with trio.open_nursery() as n:
                n.start_soon(post, 7)
                await wait_for(lambda: len(calls) == 1, timeout=10)
                r = await client.post(hub.base_url + URL, headers=head, json={
                    "jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}})
                assert r.status_code == 202, r.text
            assert answers[7].status_code == 200
            assert answers[7].json() == {"jsonrpc": "2.0", "id": 7,
                                         "error": {"code": -32800, "message": "Request cancelled"}}
            assert not len(calls)

            async with trio.open_nursery() as n:
                n.start_soon(post, 8)
                await wait_for(lambda: len(calls) == 1, timeout=10)
                r = await client.delete(hub.base_url + URL, headers=head)
                assert r.status_code == 200, r.text
            assert answers[8].status_code == 500, answers[8].text
            assert answers[8].json()["error"]["message"] == "Session terminated before the request completed"
            assert not len(calls)

            release.set()  # the same call on a new session, not held, is answered
            head = await open_session(client, hub.base_url)
            await post(9)
            assert answers[9].status_code == 200 and not answers[9].json()["result"]["isError"]


async def test_hostile_session_calls_get_errors_and_cost_no_one_else(nursery, db_url, tmp_path):
    """Through the path a session's calls take now: a body nested 100,000 deep, NaN and a value past its
    limit, NUL, the same call 30 times at once and 30 calls at once. Each gets an error or its answer,
    and another session of the organisation is answered all along."""
    with trio.fail_after(120):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        dev, _ = await hub.provision("pump")
        calls = endpoint_of(hub).calls
        async with httpx.AsyncClient(headers=pat_headers(hub.pat, hub.org_id), timeout=60) as client:
            head = await open_session(client, hub.base_url)
            other = await open_session(client, hub.base_url)
            url = hub.base_url + URL

            deep = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_fleets","arguments":' \
                + b'{"a":' * 100_000 + b'1' + b'}' * 100_000 + b'}}'
            r = await client.post(url, headers={**head, "Content-Type": "application/json"}, content=deep)
            assert 400 <= r.status_code < 500, r.text[:300]

            for body in (b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list_devices",'
                         b'"arguments":{"limit":NaN}}}',
                         b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"list_devices",'
                         b'"arguments":{"limit":101}}}',
                         b'{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"get_device",'
                         b'"arguments":{"device_id":"a\\u0000b"}}}'):
                r = await client.post(url, headers={**head, "Content-Type": "application/json"}, content=body)
                assert r.status_code == 200 and r.json()["result"]["isError"], r.text[:300]
                assert r.json()["result"]["structuredContent"]["status"] == 400, r.text[:300]
            r = await client.post(url, headers=head, json=tool_call(5, "list_devices", limit=100))
            assert r.status_code == 200 and not r.json()["result"]["isError"], r.text[:300]

            answers: list[httpx.Response] = []

            async def post(request_id: int) -> None:
                answers.append(await client.post(url, headers=head, json=tool_call(request_id, "list_devices")))
            for ids in ([6] * 30, list(range(100, 130))):
                answers.clear()
                async with trio.open_nursery() as n:
                    for request_id in ids:
                        n.start_soon(post, request_id)
                    r = await client.post(url, headers=other, json=tool_call(1, "ping_device", device_id=dev))
                    assert r.status_code == 200 and "result" in r.json(), r.text[:300]
                assert len(answers) == 30 and all(a.status_code < 500 for a in answers)
                assert sum(1 for a in answers if "result" in a.json() and not a.json()["result"]["isError"]) >= 1
            assert not len(calls)
            r = await client.post(url, headers=head, json=tool_call(200, "list_devices"))
            assert r.status_code == 200 and [d["id"] for d in r.json()["result"]["structuredContent"]["data"]] == [dev]
