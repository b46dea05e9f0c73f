"""The built-in responder: used when no model is configured. It is not a language model.

It recognises a few kinds of question by keywords in the last user message, answers them from the
same allow-listed tools (so with the caller's own permissions), and streams the answer in the same
chunk format as a model would. Its token counts are the documented estimate (characters / 4).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator

from hub.assistant import stream
from hub.assistant.budget import estimate_tokens
from hub.assistant.chat import Tally, _text_of
from hub.assistant.schema import ChatRequest
from hub.assistant.tools import Caller, run_tool

MODEL = "fleethub-builtin"
PREAMBLE = ("I am FleetHub's built-in responder, not a language model: I answer a few fixed kinds of "
            "question from your fleet's data, and only what you may see.\n")
HELP = ("Ask me which devices are online or offline, about one device by name, about memory tests on a "
        "device, about your fleets, rollouts or configurations.")


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9_\-]+", text.lower()))


class _Answer:
    def __init__(self, services, caller: Caller, offered: list[str], tally: Tally) -> None:
        self.services, self.caller, self.offered, self.tally = services, caller, offered, tally

    async def tool(self, name: str, **args) -> dict | None:
        if name not in self.offered:
            return None
        result = await run_tool(self.services, self.caller, name, json.dumps(args))
        self.tally.tool += estimate_tokens(result)
        return json.loads(result)

    async def lines(self, question: str) -> list[str]:
        words = _words(question)
        out: list[str] = []
        devices = await self.tool("list_devices")
        named = [d for d in (devices or {}).get("devices", []) if d["name"].lower() in question.lower()]
        if "memory" in words or "memtest" in words:
            targets = named or (devices or {}).get("devices", [])[:10]
            for d in targets:
                status = await self.tool("memory_test_status", device=d["id"])
                if status is None:
                    break
                out.append(_memtest_line(d["name"], status))
        elif named and not (words & {"devices", "fleets", "fleet"}):
            for d in named:
                info = await self.tool("get_device", device=d["id"])
                if info and "error" not in info:
                    out.append(f"{info['name']}: {info['state']}, boot reason {info['boot_reason'] or 'unknown'}, "
                               f"firmware {info['firmware'] or 'unknown'}, last seen {info['last_seen'] or 'never'}.")
        if "rollout" in words or "rollouts" in words:
            found = await self.tool("list_rollouts")
            if found is not None:
                items = found["rollouts"]
                out.append(f"Rollouts you can see: {len(items)}." if items else "You can see no rollouts.")
                out += [f"- rollout {r['id']}: {r['state']}, batch {r['current_batch']}" for r in items[:10]]
        if words & {"configuration", "configurations", "config", "configs"}:
            found = await self.tool("list_configurations")
            if found is not None:
                items = found["configurations"]
                out.append(f"Configurations you can see: {found['total']}.")
                out += [f"- {c['name']}: version {c['currentVersion']}, {c['status']}, {c['deviceCount']} devices"
                        for c in items[:20]]
        if words & {"fleet", "fleets"}:
            found = await self.tool("list_fleets")
            if found is not None:
                out.append(f"Fleets you can see: {found['total']}.")
                out += [f"- {f['name']}: {f['device_count']} devices" for f in found["fleets"]]
        if not out and devices is not None and (words & {"device", "devices", "online", "offline", "status",
                                                         "state", "fleet", "fleets"} or not named):
            items = devices["devices"]
            online = [d for d in items if d["online"]]
            offline = [d for d in items if not d["online"]]
            if not items:
                out.append("You can see no devices.")
            else:
                out.append(f"You can see {devices['total']} devices: {len(online)} online, {len(offline)} offline.")
                if online and "offline" not in words:
                    out.append("Online: " + ", ".join(f"{d['name']} ({d['state']})" for d in online) + ".")
                if offline and "online" not in words:
                    out.append("Offline: " + ", ".join(d["name"] for d in offline) + ".")
        if not out:
            out.append(HELP)
        return out


def _memtest_line(name: str, status: dict) -> str:
    if "error" in status:
        return f"{name}: {status['message']}."
    caps = status.get("capabilities") or {}
    parts = [f"online test {'supported' if caps.get('online') else 'not supported'}, offline test "
             f"{'supported' if caps.get('offline') else 'not supported'}" if caps else "no capabilities reported"]
    current = status.get("status") or status.get("running_when_connected")
    if current:
        parts.append("status: " + _pairs(current))
    results = status.get("recent_results") or []
    parts.append(f"last result: {_pairs(results[0])}" if results else "no stored results")
    if status.get("note"):
        parts.append(status["note"])
    return f"{name}: " + "; ".join(parts) + "."


def _pairs(record: dict, limit: int = 6) -> str:
    keys = [k for k in ("state", "phase", "outcome", "verdict", "pass", "errors", "errorsCount", "coverage")
            if k in record] or list(record)[:limit]
    return ", ".join(f"{k} {record[k]}" for k in keys[:limit] if not isinstance(record[k], dict))


async def respond(services, caller: Caller, req: ChatRequest, tally: Tally) -> AsyncIterator[bytes]:
    maker = stream.ChunkMaker(MODEL, int(services.clock.now().timestamp()))
    lines = await _Answer(services, caller, req.tool_names, tally).lines(req.last_user_text())
    yield stream.event(maker.role())
    text = PREAMBLE
    yield stream.event(maker.content(PREAMBLE))
    for line in lines:
        yield stream.event(maker.content(line + "\n"))
        text += line + "\n"
    yield stream.event(maker.finish("stop"))
    tally.prompt += estimate_tokens(_text_of([m.model_dump() for m in req.messages]))
    tally.completion += estimate_tokens(text)
    if req.include_usage:
        yield stream.event(maker.usage(tally.prompt, tally.completion))
    yield stream.DONE
