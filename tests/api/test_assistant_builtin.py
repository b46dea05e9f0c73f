"""The built-in responder (no model configured) on a real demo fleet — `fleethub demo`'s own
bootstrap, simulated devices that are real agents over WebSockets — and the `openai` client library
consuming the hub's stream unchanged, from the built-in responder and from a model server."""

from __future__ import annotations

import json
import uuid
from functools import partial

import httpx
import openai
import trio

from hub.assistant.builtin import PREAMBLE
from hub.assistant.schema import SYSTEM_PROMPT
from hub.demo import run_demo
from tests.api.assistant_helpers import content, events
from tests.api.upstream_fake import start_fake_model
from tests.hubtools import start_hub


async def _demo(nursery, db_url, tmp_path, **settings):
    hub = await start_hub(nursery, db_url, tmp_path / "hub", **settings)
    (tmp_path / "demo").mkdir()
    # the three simulated devices the answers name; the demo's podman device is tests/e2e/test_demo.py's
    info = await run_demo(hub.services, hub.base_url, nursery, data_dir=tmp_path / "demo", devices=3,
                          containers=False)
    client = httpx.AsyncClient(base_url=hub.base_url, timeout=30)
    r = await client.post("/v1/auth/login", json=info["admin"])
    assert r.status_code == 200, r.text
    headers = {"X-Organization-ID": info["org_id"], "X-CSRF-Token": r.json()["data"]["csrfToken"]}
    return hub, info, client, headers, r.headers["set-cookie"].split(";")[0]


def _ask(question: str, **extra) -> dict:
    return {"messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}],
            "stream": True, **extra}


async def _devices(hub, info) -> list[dict]:
    pat = {"X-API-Token-ID": info["pat"]["id"], "X-API-Secret-Key": info["pat"]["secret"],
           "X-Organization-ID": info["org_id"]}
    r = await hub.client.get(hub.base_url + "/v1/devices", headers=pat)
    return r.json()["data"]


async def _device_names(hub, info) -> dict[str, bool]:
    return {d["name"]: d["online"] for d in await _devices(hub, info)}


def consume(base_url: str, cookie: str, headers: dict, question: str) -> tuple[str, list]:
    """The `openai` library, unchanged, reading the hub's stream (in a worker thread: it is sync)."""
    # The library insists on an api_key; openai.Omit() drops its Authorization header, so the
    # session cookie (with the CSRF and organisation headers) is the credential.
    oa = openai.OpenAI(base_url=base_url + "/v1/assistant", api_key="session-cookie", max_retries=0,
                       default_headers={"Cookie": cookie, **headers})
    stream = oa.chat.completions.create(
        extra_headers={"Authorization": openai.Omit()}, model="anything", stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}])
    seen = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in seen if c.choices)
    return text, seen


async def test_builtin_responder_answers_about_the_demo_fleet(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub, info, client, headers, cookie = await _demo(nursery, db_url, tmp_path)
        names = await _device_names(hub, info)
        assert len(names) == 3 and all(names.values())
        r = await client.post("/v1/assistant/chat/completions", headers=headers,
                              json=_ask("Which devices are online?", stream_options={"include_usage": True}))
        assert r.status_code == 200, r.text
        got = events(r.text)
        assert got[-1] == "[DONE]"
        chunks = [json.loads(d) for d in got[:-1]]
        assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
        answer = content(got)
        assert answer.startswith(PREAMBLE) and "not a language model" in answer
        assert "You can see 3 devices: 3 online, 0 offline." in answer
        for name in names:
            assert name in answer
        usage = chunks[-1]["usage"]
        assert chunks[-1]["choices"] == []
        assert usage["completion_tokens"] == (len(answer) + 3) // 4

        # One device by name, its memory tests, the fleets, the rollouts.
        first = min(names)
        r = await client.post("/v1/assistant/chat/completions", headers=headers,
                              json=_ask(f"Tell me about {first}"))
        answer = content(events(r.text))
        assert f"{first}: online" in answer and "firmware" in answer
        r = await client.post("/v1/assistant/chat/completions", headers=headers,
                              json=_ask(f"memory test status of {first}?"))
        answer = content(events(r.text))
        assert answer.startswith(PREAMBLE) and f"{first}: online test " in answer and "no stored results" in answer
        # A stored result (as the memory-test feature writes it) is what the next answer reports.
        first_id = next(d for d in (await _devices(hub, info)) if d["name"] == first)["id"]
        await hub.services.stores.memtests.save_result(uuid.UUID(info["org_id"]), uuid.UUID(first_id), {
            "runId": "run-1", "outcome": "passed", "verdict": "healthy", "errors": []}, hub.services.clock.now())
        r = await client.post("/v1/assistant/chat/completions", headers=headers,
                              json=_ask(f"memory test status of {first}?"))
        assert "last result: outcome passed, verdict healthy, errorsCount 0" in content(events(r.text))
        r = await client.post("/v1/assistant/chat/completions", headers=headers, json=_ask("list my fleets"))
        assert "- demo-fleet: 3 devices" in content(events(r.text))
        r = await client.post("/v1/assistant/chat/completions", headers=headers, json=_ask("any rollouts?"))
        assert "You can see no rollouts." in content(events(r.text))

        # Metered by the documented estimate, under the signed-in user.
        await hub.services.meter.flush()
        r = await client.get("/v1/assistant/usage", headers={"X-Organization-ID": info["org_id"]})
        u = r.json()["data"]
        assert u["responder"] == "builtin" and u["decision"] == "allowed"
        assert u["tokens"]["prompt"] > 0 and u["tokens"]["completion"] > 0 and u["tokens"]["tool"] > 0

        # The `openai` library reads the built-in responder like any model.
        text, seen = await trio.to_thread.run_sync(consume, hub.base_url, cookie, headers, "which devices are online?")
        assert text.startswith(PREAMBLE) and "3 online" in text
        assert seen[-1].usage.completion_tokens == (len(text) + 3) // 4


async def test_openai_client_library_consumes_the_stream(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        fake = await start_fake_model(nursery)
        hub, info, _, headers, cookie = await _demo(nursery, db_url, tmp_path, assistant_upstream=fake.base_url)

        ask = partial(consume, hub.base_url, cookie, headers)
        text, seen = await trio.to_thread.run_sync(ask, "which devices are there?")
        assert text.startswith("Tool said: ")
        listed = json.loads(text[len("Tool said: "):])
        assert sorted(d["name"] for d in listed["devices"]) == sorted(await _device_names(hub, info))
        assert seen[-1].usage.prompt_tokens == 31 and seen[-1].usage.completion_tokens == 12

        # An upstream failure after the first chunk reaches the library as an APIError.
        fake.respond = lambda body: [{"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                      "choices": [{"index": 0, "delta": {"content": "par"}, "finish_reason": None}]},
                                     "break"]
        def broken() -> str:
            try:
                ask("hello")
            except openai.APIError as exc:
                return str(exc)
            return "no error"
        message = await trio.to_thread.run_sync(broken)
        assert "model server" in message
