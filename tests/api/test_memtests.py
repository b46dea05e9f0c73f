"""Memory tests through the REST API, against a real hub and PostgreSQL.

The device here is ``ScriptedDevice``: a device that speaks the documented link protocol
(device_client/shared/protocol.py, "Memory tests") over a real WebSocket and answers each memtest verb as
the test scripts it — including the refusals a real agent only gives under hardware conditions
(workload that will not stop, a device that never answers). It pins the hub's half of the contract,
every row of the spec's memory-test errors table included, independently of the agent.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

from device_client.shared import protocol
from device_client.agent import link_url
from hub.auth.passwords import hash_password
from tests.hubtools import start_hub, wait_for

BOTH = {"online": True, "offline": True}
ONLINE_ONLY = {"online": True, "offline": False,
               "offlineReason": "test boot is not supported by this board's bootloader yet"}
HEALTH = {"capabilities": BOTH, "hardwareCorruptedBytes": 0, "edac": {"correctable": -1, "uncorrectable": -1}, "retiredPages": [],
          "fault": False, "faultReason": None, "kernelLines": []}
COMMAND_TIMEOUT = 1.0


class Refuse(Exception):
    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(code)
        self.code, self.message = code, message


class ScriptedDevice:
    """A device on a real WebSocket whose memtest verbs behave as the test says (see module doc).

    The default script is a well-behaved device: one test at a time (busy otherwise), status reads,
    cancel, and acknowledgements recorded in ``acked``."""

    def __init__(self, hub, token: str, caps: dict | None = None, **hello: Any) -> None:
        self.hub, self.token = hub, token
        self.hello = protocol.Hello(
            firmware="scripted 1.0", architecture="x86_64",
            capabilities=protocol.Capabilities(memoryTest=protocol.MemoryTestCapabilities(**(caps or BOTH))),
            **hello)
        self.commands: list[tuple[str, dict]] = []
        self.running: dict | None = None
        self.history: list[dict] = []
        self.acked: list[str] = []
        self.ws: Any = None
        self.scope = trio.CancelScope()
        self.handlers = {"memtest.start": self.start, "memtest.status": self.status,
                         "memtest.cancel": self.cancel, "memtest.ack": self.ack}

    # the default script ------------------------------------------------------------------------
    async def start(self, p: dict) -> dict:
        if self.running is not None:
            raise Refuse("busy", "a memory test is already running")
        self.running = {"runId": p["runId"], "plan": p["plan"], "phase": "preparing", "pass": 0,
                        "passes": p["plan"]["passes"], "pattern": None, "testedBytes": 0, "coverageBytes": 0,
                        "totalBytes": 64 << 20, "rateBps": 0, "etaSeconds": None, "errors": 0,
                        "confirmedErrors": 0, "tempMilliC": -1, "startedAt": "2026-01-05T12:00:00.000Z"}
        return {"status": self.running}

    async def status(self, p: dict) -> dict:
        return {"supported": True, "status": self.running, "health": HEALTH, "history": self.history}

    async def cancel(self, p: dict) -> dict:
        if self.running is None or (p.get("runId") and p["runId"] != self.running["runId"]):
            raise Refuse("not_running", "no memory test is running")
        ended, self.running = {**self.running, "phase": "cancelled"}, None
        return {"status": ended}

    async def ack(self, p: dict) -> dict:
        self.acked += p["runIds"]
        return {}

    # the link -------------------------------------------------------------------------------------
    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        headers = [(b"authorization", f"Bearer {self.token}".encode())]
        with self.scope:
            async with open_websocket_url(link_url(self.hub.base_url), extra_headers=headers) as ws:
                self.ws = ws
                await ws.send_message(protocol.encode(self.hello))
                assert isinstance(protocol.decode(await ws.get_message()), protocol.Welcome)
                task_status.started(self)
                async with trio.open_nursery() as nursery:
                    while True:
                        try:
                            frame = protocol.decode(await ws.get_message())
                        except ConnectionClosed:
                            break
                        if isinstance(frame, protocol.Command):
                            nursery.start_soon(self._answer, frame)
                    nursery.cancel_scope.cancel()

    async def _answer(self, cmd: protocol.Command) -> None:
        verb = protocol.verb_of(cmd.subject)
        self.commands.append((verb, cmd.payload))
        handler = self.handlers.get(verb)
        try:
            if handler is None:
                raise Refuse("unknown_command", f"this agent has no command {verb!r}")
            reply = protocol.Reply(id=cmd.id, ok=True, payload=await handler(cmd.payload))
        except Refuse as exc:
            reply = protocol.Reply(id=cmd.id, ok=False, error=protocol.ReplyError(code=exc.code, message=exc.message))
        try:
            await self.ws.send_message(protocol.encode(reply))
        except ConnectionClosed:
            pass

    async def event(self, kind: str, payload: dict) -> None:
        await self.ws.send_message(protocol.encode(protocol.Event(kind=kind, payload=payload)))

    def sent(self, verb: str) -> list[dict]:
        return [p for v, p in self.commands if v == verb]


@pytest.fixture
async def hub(nursery, db_url, tmp_path):
    return await start_hub(nursery, db_url, tmp_path / "hub", command_timeout=COMMAND_TIMEOUT)


async def connect(hub, nursery, caps: dict | None = None, name: str = "dev", fleet_id: str | None = None,
                  **hello) -> tuple[str, ScriptedDevice]:
    dev_id, token = await hub.provision(name, **({"fleet_id": fleet_id} if fleet_id else {}))
    device = ScriptedDevice(hub, token, caps, **hello)
    await nursery.start(device.run)

    async def linked() -> bool:
        actor = hub.services.registry.lookup(("device", uuid.UUID(dev_id)))
        return actor is not None and actor.machine is not None and actor.machine.online and actor.facts is not None

    await wait_for(linked, timeout=10)
    return dev_id, device


def mt(dev_id: str, suffix: str = "") -> str:
    return f"/v1/devices/{dev_id}/memory-test{suffix}"


def bare_error(r: httpx.Response, status: int, code: str) -> dict:
    """The memory-test endpoints' bare body: error and message (and status only for busy)."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["error"] == code and isinstance(body["message"], str) and body["message"], body
    assert set(body) <= {"error", "message", "status"}, body
    if code != "busy":
        assert "status" not in body, body
    return body


def result(run_id: str, outcome: str = "pass", verdict: str = "ok", **kw) -> dict:
    return {"runId": run_id, "plan": {"mode": "live"}, "source": "physical", "outcome": outcome, "verdict": verdict,
            "summary": f"{outcome}/{verdict}", "startedAt": "2026-01-05T12:00:00.000Z",
            "finishedAt": "2026-01-05T12:01:00.000Z", "passesCompleted": 1, "patternsRun": ["stuck_address"],
            "testedBytes": 1 << 20, "coverageBytes": 1 << 20, "totalBytes": 64 << 20, "maxTempMilliC": -1,
            "kernel": None, "errors": [], "errorCount": 0, "retired": [], "fault": False, "pages": [], **kw}


async def audit_rows(hub, path: str) -> list[dict]:
    r = await hub.call("GET", "/v1/audit-events", params={"pathPrefix": path, "limit": 100})
    assert r.status_code == 200, r.text
    return r.json()["data"]


# -- the flow ---------------------------------------------------------------------------------------------
async def test_start_progress_result_ack_and_reads(hub, nursery):
    with trio.fail_after(30):
        dev_id, device = await connect(hub, nursery)
        sse_events: list[dict] = []
        seen_progress = trio.Event()

        async def watch(task_status=trio.TASK_STATUS_IGNORED) -> None:
            async with hub.client.stream("GET", hub.base_url + f"/v1/devices/{dev_id}/events",
                                         headers=hub.headers) as r:
                task_status.started()
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        sse_events.append(json.loads(line[6:]))
                        if sse_events[-1]["kind"] == "device.operation" and \
                                sse_events[-1]["payload"]["phase"] == "testing":
                            seen_progress.set()

        async with trio.open_nursery() as watchers:
            await watchers.start(watch)
            r = await hub.call("POST", mt(dev_id), json={"quick": True, "maxBytes": 1 << 24})
            assert r.status_code == 202, r.text
            data = r.json()["data"]
            run_id = data["runId"]
            assert data["deviceId"] == dev_id and data["status"]["runId"] == run_id
            assert data["status"]["phase"] == "preparing"
            plan = {"mode": "live_quick", "impact": "running", "placement": "online", "quick": True, "passes": 1,
                    "kernelPasses": 4, "bitFade": False, "holdOnFailure": False, "timeBudgetSeconds": 7200,
                    "maxBytes": 1 << 24}
            assert device.sent("memtest.start") == [{"runId": run_id, "plan": plan}]
            assert data["status"]["plan"] == plan

            progress = {**device.running, "phase": "testing", "pass": 1, "pattern": "checkerboard",
                        "coverageBytes": 8 << 20, "rateBps": 2.5e9, "errors": 2, "tempMilliC": 51000}
            device.running = progress
            await device.event("memtest.progress", progress)
            with trio.fail_after(5):
                await seen_progress.wait()
            watchers.cancel_scope.cancel()
        op = [e for e in sse_events if e["kind"] == "device.operation"][-1]["payload"]
        assert op == {"kind": "memory_test", "runId": run_id, "phase": "testing", "pass": 1, "passes": 1,
                      "pattern": "checkerboard", "coverage": 0.125, "coverageBytes": 8 << 20, "totalBytes": 64 << 20,
                      "progress": None, "testedBytes": 0,  # no etaSeconds: the planned work is unknown
                      "rate": 2.5e9, "etaSeconds": None, "errors": 2, "confirmedErrors": 0, "temperature": 51.0}

        # live status: the device answers
        r = await hub.call("GET", mt(dev_id))
        assert r.status_code == 200, r.text
        live = r.json()["data"]
        assert live["source"] == "live" and live["supported"] is True
        assert live["status"]["pattern"] == "checkerboard" and live["health"] == HEALTH
        assert "healthReportedAt" not in live

        # the result: stored once (re-sent twice), acknowledged, listed newest first
        device.running = None
        first = result(run_id)
        await device.event("memtest.result", {"result": first})
        await device.event("memtest.result", {"result": first})
        await wait_for(lambda: device.acked.count(run_id) >= 1, timeout=5)
        await device.event("memtest.health", {"health": {**HEALTH, "retiredPages": [0x5000]}})
        r = await hub.call("GET", mt(dev_id, "/results"))
        assert r.status_code == 200 and [x["runId"] for x in r.json()["data"]["results"]] == [run_id]
        rows = await hub.services.db.fetchval("SELECT count(*) FROM memtest_results")
        assert rows == 1

        # stored status once the device is gone
        device.scope.cancel()
        await wait_for(lambda: hub.services.links.get(uuid.UUID(dev_id)) is None, timeout=5)

        async def stored_read() -> bool:
            d = (await hub.call("GET", mt(dev_id))).json()["data"]
            return d["source"] == "stored" and d["health"]["retiredPages"] == [0x5000]

        await wait_for(stored_read, timeout=5)
        stored = (await hub.call("GET", mt(dev_id))).json()["data"]
        assert stored["supported"] is True and stored["healthReportedAt"]
        assert stored["status"]["runId"] == run_id and stored["status"]["phase"] == "done"
        assert [h["runId"] for h in stored["history"]] == [run_id]

        # every start is in the audit log with its plan
        start = next(e for e in await audit_rows(hub, mt(dev_id)) if e["method"] == "POST")
        assert start["status"] == 202 and start["details"]["plan"] == plan and start["details"]["runId"] == run_id


async def test_results_are_newest_first_and_limited(hub, nursery):
    with trio.fail_after(30):
        dev_id, device = await connect(hub, nursery)
        for i in range(3):
            await device.event("memtest.result", {"result": result(f"run-{i}")})
            await wait_for(lambda i=i: f"run-{i}" in device.acked, timeout=5)
        r = await hub.call("GET", mt(dev_id, "/results"), params={"limit": 2})
        assert [x["runId"] for x in r.json()["data"]["results"]] == ["run-2", "run-1"]
        r = await hub.call("GET", mt(dev_id, "/results"))
        assert [x["runId"] for x in r.json()["data"]["results"]] == ["run-2", "run-1", "run-0"]
        for bad in ("0", "101", "x"):
            body = bare_error(await hub.call("GET", mt(dev_id, "/results"), params={"limit": bad}), 400, "invalid")
            assert body["message"].startswith("limit:")
        assert (await hub.call("GET", mt(dev_id, "/results"), params={"limit": 100})).status_code == 200


async def test_cancel_with_and_without_run_id_is_audited_with_the_plan(hub, nursery):
    with trio.fail_after(30):
        dev_id, device = await connect(hub, nursery)
        r = await hub.call("POST", mt(dev_id), json={"impact": "stopped", "passes": 3})
        run_id = r.json()["data"]["runId"]
        r = await hub.call("POST", mt(dev_id, "/cancel"), json={"runId": run_id})
        assert r.status_code == 202, r.text
        data = r.json()["data"]
        assert (data["deviceId"], data["runId"], data["status"]["phase"]) == (dev_id, run_id, "cancelled")
        assert device.sent("memtest.cancel") == [{"runId": run_id}]
        await trio.sleep(5)  # the start rate: one every 5 seconds
        r = await hub.call("POST", mt(dev_id), json={})
        assert r.status_code == 202, r.text
        r = await hub.call("POST", mt(dev_id, "/cancel"))  # no body: whatever runs
        assert r.status_code == 202 and r.json()["data"]["status"]["phase"] == "cancelled"
        assert device.sent("memtest.cancel")[-1] == {}
        cancels = [e for e in await audit_rows(hub, mt(dev_id, "/cancel"))]
        assert len(cancels) == 2 and all(e["status"] == 202 for e in cancels)
        plans = sorted((e["details"]["plan"]["mode"], e["details"]["plan"]["passes"]) for e in cancels)
        assert plans == [("full_online", 3), ("live", 1)]


# -- the errors table -------------------------------------------------------------------------------------
async def test_400_invalid_names_the_field(hub, nursery):
    with trio.fail_after(30):
        dev_id, device = await connect(hub, nursery)
        cases = [({"impact": "running", "placement": "offline"}, "placement"), ({"passes": 21}, "passes"),
                 ({"passes": 0}, "passes"), ({"timeBudgetSeconds": 59}, "timeBudgetSeconds"),
                 ({"impact": "stopped", "placement": "offline", "kernelPasses": 18}, "kernelPasses"),
                 ({"mode": "live"}, "mode"), ({"passes": "2"}, "passes")]
        for body, field in cases:
            err = bare_error(await hub.call("POST", mt(dev_id), json=body), 400, "invalid")
            assert err["message"].startswith(f"{field}:"), err
        err = bare_error(await hub.call("POST", mt(dev_id), content=b"{nope", headers={
            **hub.headers, "Content-Type": "application/json"}), 400, "invalid")
        err = bare_error(await hub.call("POST", mt(dev_id, "/cancel"), json={"run": "x"}), 400, "invalid")
        assert err["message"].startswith("run:")
        assert device.sent("memtest.start") == [], "nothing invalid reaches the device"
        # a device refusing the plan (say, maxBytes beyond what it has) is a 400 invalid too
        device.handlers["memtest.start"] = _refuse("invalid", "maxBytes: more than this device has")
        err = bare_error(await hub.call("POST", mt(dev_id), json={"maxBytes": 1 << 40}), 400, "invalid")
        assert err["message"] == "maxBytes: more than this device has"


def _refuse(code: str, message: str = ""):
    async def handler(p: dict) -> dict:
        raise Refuse(code, message)
    return handler


async def _login(hub, role: str = "admin") -> tuple[httpx.AsyncClient, dict]:
    s = hub.services
    email = f"op-{uuid.uuid4().hex[:6]}@example.test"
    user = await s.stores.orgs.create_user(email, s.clock.now(), password_hash=hash_password("correct horse"))
    await s.stores.orgs.add_member(uuid.UUID(hub.org_id), user["id"], role, s.clock.now())
    browser = httpx.AsyncClient(base_url=hub.base_url, timeout=30)
    r = await browser.post("/v1/auth/login", json={"email": email, "password": "correct horse"})
    assert r.status_code == 200, r.text
    return browser, {"X-Organization-ID": hub.org_id, "X-CSRF-Token": r.json()["data"]["csrfToken"]}


async def test_403_a_test_boot_needs_a_signed_in_dashboard_session(hub, nursery):
    with trio.fail_after(60):
        dev_id, device = await connect(hub, nursery, maintenance=False)
        boot = {"impact": "stopped", "placement": "offline", "holdOnFailure": True}
        bare_error(await hub.call("POST", mt(dev_id), json=boot), 403, "operator_required")  # PAT
        bearer = {"Authorization": f"Bearer {hub.pat[1]}", "X-Organization-ID": hub.org_id}
        bare_error(await hub.call("POST", mt(dev_id), json=boot, headers=bearer), 403, "operator_required")
        r = await hub.call("POST", "/v1/service-accounts", json={"name": "ci", "policies": [{"relation": "editor"}]})
        sa = r.json()["data"]
        r = await hub.client.post(hub.base_url + "/v1/oauth/token", data={
            "grant_type": "client_credentials", "client_id": sa["client_id"], "client_secret": sa["client_secret"]})
        sa_headers = {"Authorization": f"Bearer {r.json()['access_token']}", "X-Organization-ID": hub.org_id}
        bare_error(await hub.call("POST", mt(dev_id), json=boot, headers=sa_headers), 403, "operator_required")
        r = await hub.call("POST", "/v1/cli/tunnel/token")  # a CLI token
        cli = {"Authorization": f"Bearer {r.json()['data']['token']}", "X-Organization-ID": hub.org_id}
        bare_error(await hub.call("POST", mt(dev_id), json=boot, headers=cli), 403, "operator_required")
        bare_error(await hub.call("POST", mt(dev_id), json={}, headers=cli), 401, "unauthenticated")
        assert device.sent("memtest.start") == []
        # the service account may start online modes
        r = await hub.call("POST", mt(dev_id), json={}, headers=sa_headers)
        assert r.status_code == 202, r.text
        await hub.call("POST", mt(dev_id, "/cancel"))
        await trio.sleep(5)
        # a viewer may read but not start (reboot permission)
        viewer = await hub.new_user("member")
        vh = {"X-API-Token-ID": viewer[0], "X-API-Secret-Key": viewer[1], "X-Organization-ID": hub.org_id}
        me = (await hub.call("GET", "/v1/me", headers=vh)).json()["data"]["userId"]
        await hub.call("POST", "/v1/relations", json={"object_type": "device", "object_id": dev_id,
                                                      "relation": "viewer", "subject_type": "user", "subject_id": me})
        assert (await hub.call("GET", mt(dev_id, "/results"), headers=vh)).status_code == 200
        bare_error(await hub.call("POST", mt(dev_id), json={}, headers=vh), 403, "missing_relation")
        bare_error(await hub.call("POST", mt(dev_id, "/cancel"), headers=vh), 403, "missing_relation")
        # a signed-in person in the dashboard may
        browser, headers = await _login(hub)
        try:
            r = await browser.post(mt(dev_id), json=boot, headers=headers)
            assert r.status_code == 202, r.text
        finally:
            await browser.aclose()
        plan = device.sent("memtest.start")[-1]["plan"]
        assert (plan["mode"], plan["passes"], plan["kernelPasses"], plan["holdOnFailure"]) == ("test_boot", 2, 4, True)
        refused = [e for e in await audit_rows(hub, mt(dev_id)) if e["status"] == 403 and e["path"] == mt(dev_id)]
        assert sorted(e["details"]["plan"]["mode"] for e in refused) == ["live"] + ["test_boot"] * 4


async def test_409_busy_from_the_hubs_knowledge_and_from_the_devices(hub, nursery):
    with trio.fail_after(30):
        dev_id, device = await connect(hub, nursery)
        r = await hub.call("POST", mt(dev_id), json={})
        run_id = r.json()["data"]["runId"]
        await device.event("memtest.progress", {**device.running, "phase": "testing", "pattern": "bit_flip"})
        await wait_for(lambda: (hub.services.registry.lookup(("device", uuid.UUID(dev_id))).memtests.machine
                                .status.get("pattern")) == "bit_flip", timeout=5)
        body = bare_error(await hub.call("POST", mt(dev_id), json={"quick": True}), 409, "busy")
        assert body["status"]["runId"] == run_id and body["status"]["pattern"] == "bit_flip"
        assert len(device.sent("memtest.start")) == 1, "answered from the hub's own knowledge"

        # A device running a test the hub does not know of (it linked without saying so).
        other_id, other = await connect(hub, nursery, name="other")
        other.running = {"runId": "console-run", "plan": {"mode": "full_online"}, "phase": "testing"}
        body = bare_error(await hub.call("POST", mt(other_id), json={}), 409, "busy")
        assert body["status"]["runId"] == "console-run"
        assert len(other.sent("memtest.start")) == 1 and len(other.sent("memtest.status")) == 1
        # now the hub knows: the next start is answered without asking the device
        bare_error(await hub.call("POST", mt(other_id), json={}), 409, "busy")
        assert len(other.sent("memtest.start")) == 1


async def test_409_not_running(hub, nursery):
    with trio.fail_after(30):
        dev_id, device = await connect(hub, nursery)
        bare_error(await hub.call("POST", mt(dev_id, "/cancel")), 409, "not_running")
        assert device.sent("memtest.cancel") == [{}], "the hub knew of nothing: the device answered"
        r = await hub.call("POST", mt(dev_id), json={})
        assert r.status_code == 202
        body = bare_error(await hub.call("POST", mt(dev_id, "/cancel"), json={"runId": "not-this-one"}),
                          409, "not_running")
        assert "not-this-one" in body["message"]


async def test_422_unsupported(hub, nursery):
    with trio.fail_after(30):
        dev_id, device = await connect(hub, nursery, caps={"online": False, "offline": False})
        bare_error(await hub.call("POST", mt(dev_id), json={}), 422, "unsupported")
        assert device.sent("memtest.start") == []
        board_id, _board = await connect(hub, nursery, caps=ONLINE_ONLY, name="board")
        browser, headers = await _login(hub)
        try:
            r = await browser.post(mt(board_id), json={"impact": "stopped", "placement": "offline"}, headers=headers)
        finally:
            await browser.aclose()
        body = bare_error(r, 422, "unsupported")
        assert body["message"] == "test boot is not supported by this board's bootloader yet"
        assert _board.sent("memtest.start") == []
        # Firmware without memory tests at all: the verbs are unknown; the status says supported false.
        old_id, old = await connect(hub, nursery, caps=BOTH, name="old")
        old.handlers.clear()
        bare_error(await hub.call("POST", mt(old_id), json={}), 422, "unsupported")
        r = await hub.call("GET", mt(old_id))
        assert r.status_code == 200 and r.json()["data"]["source"] == "live"
        assert r.json()["data"]["supported"] is False
        r = await hub.call("GET", mt(dev_id))
        assert r.json()["data"]["supported"] is True  # the scripted device's status read says so


async def test_429_rate_limited_within_five_seconds_of_an_accepted_start(hub, nursery):
    with trio.fail_after(30):
        dev_id, device = await connect(hub, nursery)
        r = await hub.call("POST", mt(dev_id), json={"quick": True})
        run_id = r.json()["data"]["runId"]
        device.running = None
        await device.event("memtest.result", {"result": result(run_id)})
        await wait_for(lambda: run_id in device.acked, timeout=5)
        r = await hub.call("POST", mt(dev_id), json={"quick": True})
        bare_error(r, 429, "rate_limited")
        assert 1 <= int(r.headers["Retry-After"]) <= 5
        assert len(device.sent("memtest.start")) == 1
        await trio.sleep(int(r.headers["Retry-After"]))
        assert (await hub.call("POST", mt(dev_id), json={"quick": True})).status_code == 202


async def test_502_workload_stop_failed_and_internal(hub, nursery):
    with trio.fail_after(30):
        dev_id, device = await connect(hub, nursery)
        device.handlers["memtest.start"] = _refuse("workload_stop_failed", "the workload ignored SIGTERM and SIGKILL")
        body = bare_error(await hub.call("POST", mt(dev_id), json={"impact": "stopped"}), 502, "workload_stop_failed")
        assert body["message"] == "the workload ignored SIGTERM and SIGKILL"
        device.handlers["memtest.start"] = _refuse("engine_exploded", "numpy went away")
        bare_error(await hub.call("POST", mt(dev_id), json={}), 502, "internal")
        # neither counted as an accepted start: a good start goes through at once
        device.handlers["memtest.start"] = device.start
        assert (await hub.call("POST", mt(dev_id), json={})).status_code == 202


async def test_503_device_offline_and_404_unknown_device(hub, nursery):
    with trio.fail_after(30):
        dev_id, _ = await hub.provision("never-linked")
        bare_error(await hub.call("POST", mt(dev_id), json={}), 503, "device_offline")
        bare_error(await hub.call("POST", mt(dev_id, "/cancel")), 503, "device_offline")
        r = await hub.call("GET", mt(dev_id))
        assert r.status_code == 200 and r.json()["data"]["source"] == "stored"
        missing = str(uuid.uuid4())
        for method, path in (("POST", mt(missing)), ("POST", mt(missing, "/cancel")), ("GET", mt(missing)),
                             ("GET", mt(missing, "/results"))):
            bare_error(await hub.call(method, path, json={} if method == "POST" else None), 404, "not_found")
        for method, path in (("POST", mt("not-a-uuid")), ("POST", mt("not-a-uuid", "/cancel")),
                             ("GET", mt("not-a-uuid")), ("GET", mt("not-a-uuid", "/results"))):
            bare_error(await hub.call(method, path, json={} if method == "POST" else None), 400, "bad_uuid")


async def test_504_device_timeout(hub, nursery):
    with trio.fail_after(30):
        dev_id, device = await connect(hub, nursery)

        async def silent(p: dict) -> dict:
            await trio.sleep_forever()

        device.handlers["memtest.start"] = silent
        device.handlers["memtest.cancel"] = silent
        device.handlers["memtest.status"] = silent
        bare_error(await hub.call("POST", mt(dev_id), json={}), 504, "device_timeout")
        bare_error(await hub.call("POST", mt(dev_id, "/cancel")), 504, "device_timeout")
        r = await hub.call("GET", mt(dev_id))
        assert r.status_code == 200 and r.json()["data"]["source"] == "stored", "a silent device: stored"


# -- MemoryFault, diagnosis, interruption, rollouts -------------------------------------------------------
async def test_memory_fault_on_the_record_and_critical_in_the_diagnosis(hub, nursery):
    with trio.fail_after(30):
        dev_id, device = await connect(hub, nursery)
        r = await hub.call("GET", f"/v1/devices/{dev_id}/diagnosis")
        assert r.status_code == 200 and r.json()["data"]["status"] == "ok" and r.json()["data"]["issues"] == []
        await device.event("memtest.result", {"result": result("weak", "fail", "weak_cells", errorCount=3,
                                                               retired=[0x1000 * i for i in range(1, 33)])})
        await wait_for(lambda: "weak" in device.acked, timeout=5)
        d = (await hub.call("GET", f"/v1/devices/{dev_id}")).json()["data"]
        assert d["conditions"] == [], "32 retired pages, weak cells: no fault yet"
        await trio.sleep(0.01)
        await device.event("memtest.result", {"result": result("line", "fail", "data_line", errorCount=900)})
        await wait_for(lambda: "line" in device.acked, timeout=5)
        d = (await hub.call("GET", f"/v1/devices/{dev_id}")).json()["data"]
        [fault] = d["conditions"]
        assert fault["type"] == "MemoryFault" and fault["verdict"] == "data_line" and fault["since"]
        r = await hub.call("GET", f"/v1/devices/{dev_id}/diagnosis")
        diag = r.json()["data"]
        assert diag["status"] == "critical"
        assert [(i["severity"], i["code"]) for i in diag["issues"]] == [("critical", "MemoryFault")]
        # a passing run clears the line verdict, but the 33rd retired page keeps the fault
        await device.event("memtest.health", {"health": {**HEALTH, "retiredPages": [0x1000 * i for i in range(1, 34)]}})
        await device.event("memtest.result", {"result": result("clean", "pass", "ok")})
        await wait_for(lambda: "clean" in device.acked, timeout=5)

        async def retired_fault() -> bool:
            c = (await hub.call("GET", f"/v1/devices/{dev_id}")).json()["data"]["conditions"]
            return len(c) == 1 and c[0]["retiredPages"] == 33 and c[0]["verdict"] == "ok"

        await wait_for(retired_fault, timeout=5)
        c = (await hub.call("GET", f"/v1/devices/{dev_id}")).json()["data"]["conditions"][0]
        assert c["since"] == fault["since"], "the fault holds since it first did"


async def test_a_result_listing_more_than_256_errors_keeps_256_and_the_full_count(hub, nursery):
    """"Up to 256 errors are kept per result; errorCount carries the full count": a device that lists
    more loses the rest of the list, not its result (the typed wire model would refuse the whole)."""
    with trio.fail_after(30):
        entry = {"physAddr": 4096, "expected": "0x0", "actual": "0x1", "mask": "0x1", "pattern": "stuck_address",
                 "pass": 1, "tempMilliC": 40000, "confirmed": True}
        long = result("long", "fail", "weak_cells", errors=[{**entry, "physAddr": 4096 * i} for i in range(300)],
                      errorCount=300, pages=[{"page": 4096 * i, "errors": 1} for i in range(300)])
        dev_id, device = await connect(hub, nursery, lastMemoryTest=long)
        await wait_for(lambda: "long" in device.acked, timeout=5)
        [kept] = (await hub.call("GET", mt(dev_id, "/results"))).json()["data"]["results"]
        assert len(kept["errors"]) == 256 and kept["errorCount"] == 300 and len(kept["pages"]) == 256
        assert kept["errors"][0]["physAddr"] == 0 and kept["errors"][-1]["physAddr"] == 4096 * 255


async def test_interrupted_test_reported_at_hello_is_stored_acked_and_a_warning(hub, nursery):
    with trio.fail_after(30):
        interrupted = result("lost", "interrupted", "ok", interrupted={"phase": "testing", "pass": 2,
                                                                       "pattern": "moving_inversions"})
        dev_id, device = await connect(hub, nursery, bootReason="power_on", lastMemoryTest=interrupted)
        await wait_for(lambda: "lost" in device.acked, timeout=5)
        r = await hub.call("GET", mt(dev_id, "/results"))
        [kept] = r.json()["data"]["results"]
        assert kept["outcome"] == "interrupted" and kept["source"] == "stored"
        assert kept["interrupted"]["pattern"] == "moving_inversions"  # present for an interrupted run
        diag = (await hub.call("GET", f"/v1/devices/{dev_id}/diagnosis")).json()["data"]
        assert diag["status"] == "warning"
        [issue] = diag["issues"]
        assert issue["code"] == "MemoryTestInterrupted"
        assert "phase testing, pass 2, pattern moving_inversions" in issue["message"]


async def test_a_test_boot_in_maintenance_is_known_after_the_hello_and_its_boot_reason_recorded(hub, nursery):
    with trio.fail_after(30):
        running = {"runId": "boot-1", "plan": {"mode": "test_boot", "impact": "stopped"}, "phase": "testing"}
        dev_id, device = await connect(hub, nursery, bootReason="memory_test", maintenance=True, workloadHeld=True,
                                       memoryTestRunning=running)
        d = (await hub.call("GET", f"/v1/devices/{dev_id}")).json()["data"]
        assert (d["state"], d["boot_reason"]) == ("maintenance", "memory_test")
        body = bare_error(await hub.call("POST", mt(dev_id), json={}), 409, "busy")
        assert body["status"]["runId"] == "boot-1" and device.sent("memtest.start") == []


async def test_rollouts_defer_a_device_whose_workload_a_test_holds(hub, nursery):
    with trio.fail_after(60):
        r = await hub.call("POST", "/v1/fleets", json={"name": "f"})
        fid = r.json()["data"]["id"]
        dev_id, device = await connect(hub, nursery, fleet_id=fid)
        await hub.services.presence.flush()
        # The hold is written through: with the write-behind held (as it lags under load), a rollout
        # made the moment the start is answered still defers the device.
        async with hub.services.presence.held():
            r = await hub.call("POST", mt(dev_id), json={"impact": "stopped"})
            run_id = r.json()["data"]["runId"]
            actor = hub.services.registry.lookup(("device", uuid.UUID(dev_id)))
            assert actor.facts["workloadHeld"] is True
            r = await hub.call("POST", "/v1/configurations", json={"name": "app", "spec": {"a": 1}})
            cid = r.json()["data"]["id"]
            r = await hub.call("POST", "/v1/rollouts", json={"fleet_id": fid, "config_id": cid, "force": True})
            assert r.status_code == 201, r.text
            rid = r.json()["data"]["id"]

            async def step() -> str:
                data = (await hub.call("GET", f"/v1/rollouts/{rid}")).json()["data"]
                return {s["device_id"]: s["step"] for s in data["devices"]}.get(dev_id)

            await wait_for(lambda: _eq(step(), "deferred_memory_test"), timeout=10)
        assert device.sent("config.apply") == [], "no update while the test holds the workload"
        device.running = None
        await device.event("memtest.result", {"result": result(run_id)})
        await wait_for(lambda: not actor.facts["workloadHeld"], timeout=5)
        await wait_for(lambda: len(device.sent("config.apply")) == 1, timeout=10)


async def _eq(value, expected) -> bool:
    return (await value) == expected


# -- with the real agent (device_client/memtest/): the whole flow over real memory ---------------------
def _agent_options(**config) -> dict:
    from device_client.memtest import MemtestConfig

    return {"memtest": MemtestConfig(**{"budget": 4 << 20, **config})}


async def _results(hub, dev_id: str) -> list[dict]:
    r = await hub.call("GET", mt(dev_id, "/results"))
    assert r.status_code == 200, r.text
    return r.json()["data"]["results"]


async def _wait_result(hub, dev_id: str, run_id: str, timeout: float = 60) -> dict:
    async def stored() -> bool:
        return any(x["runId"] == run_id for x in await _results(hub, dev_id))

    await wait_for(stored, timeout=timeout, interval=0.2)
    return next(x for x in await _results(hub, dev_id) if x["runId"] == run_id)


async def test_agent_live_quick_run_is_stored_acknowledged_and_read_live(hub, nursery, tmp_path):
    from tests.hubtools import start_agent

    with trio.fail_after(120):
        dev_id, token = await hub.provision("real")
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent", **_agent_options())
        r = await hub.call("POST", mt(dev_id), json={"quick": True})
        assert r.status_code == 202, r.text
        run_id = r.json()["data"]["runId"]
        bare_error(await hub.call("POST", mt(dev_id), json={"quick": True}), 409, "busy")
        res = await _wait_result(hub, dev_id, run_id)
        assert (res["outcome"], res["verdict"], res["errorCount"]) == ("pass", "ok", 0)
        assert res["plan"]["mode"] == "live_quick" and res["testedBytes"] > 0
        await wait_for(lambda: running.agent.memtest.store.unacked() == [], timeout=10)
        live = (await hub.call("GET", mt(dev_id))).json()["data"]
        assert live["source"] == "live" and live["supported"] is True
        assert live["status"]["runId"] == run_id and live["status"]["phase"] == "done"
        assert [h["runId"] for h in live["history"]] == [run_id]
        # Issue 31 items 11 and 12: a result's source is live or stored (it said "simulated"), and
        # "interrupted" appears only on an interrupted run (every result carried "interrupted": null)
        [listed] = (await hub.call("GET", mt(dev_id, "/results"))).json()["data"]["results"]
        assert listed["source"] == "stored" and "interrupted" not in listed
        assert listed["hardware"]["simulated"] is True and listed["addressKind"] in ("physical", "virtual")
        assert live["history"][0]["source"] in ("live", "stored") and "interrupted" not in live["history"][0]
        assert live["health"]["lastResult"]["source"] in ("live", "stored")
        d = (await hub.call("GET", f"/v1/devices/{dev_id}")).json()["data"]
        assert d["conditions"] == []


# Each fault kind at a realistic size (issue 19, item 4): 16 MiB is 4,096 pages, and a data line fails
# every word of most sweeps, so its count passes a billion; the result lists the pages with the most
# errors and sums up the rest, fits its frame, and the device stays online. (Weak cells need idle
# decay's 5-minute wait: test_memtest_engine.py runs them on the virtual clock.)
@pytest.mark.parametrize("fault, verdict, faulted, at_least", [
    ("data_line", "data_line", True, 1_000_000_000),
    ("address_line", "address_line", True, 10_000_000),
    ("stuck", "weak_cells", False, 100),
    ("thermal", "thermal", False, 3),
    ("intermittent", "unknown", False, 10),
])
async def test_agent_injected_fault_is_classified_and_raises_memory_fault_as_the_rules_say(
        hub, nursery, tmp_path, fault, verdict, faulted, at_least):
    from tests.hubtools import start_agent

    with trio.fail_after(180):
        dev_id, token = await hub.provision("faulty")
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent",
                                    **_agent_options(fault=fault, budget=16 << 20))
        r = await hub.call("POST", mt(dev_id), json={"quick": True})
        assert r.status_code == 202, r.text
        res = await _wait_result(hub, dev_id, r.json()["data"]["runId"], timeout=150)
        assert (res["outcome"], res["verdict"]) == ("fail", verdict)
        assert res["errorCount"] >= at_least and len(res["errors"]) <= 256
        summary = res["pageSummary"]
        assert len(res["pages"]) == summary["listedPages"] <= 256
        assert summary["listedPages"] + summary["omittedPages"] == summary["pagesWithErrors"]
        assert sum(p["errors"] for p in res["pages"]) + summary["omittedErrors"] == res["errorCount"]
        assert [p["errors"] for p in res["pages"]] == sorted((p["errors"] for p in res["pages"]), reverse=True)
        await wait_for(lambda: running.agent.memtest.store.unacked() == [], timeout=10)
        assert running.agent.connected and running.agent.statistics().links == 1  # never kicked off
        assert running.agent.frames.records() == []

        async def condition() -> list:
            return (await hub.call("GET", f"/v1/devices/{dev_id}")).json()["data"]["conditions"]

        diag = None
        if faulted:
            await wait_for(lambda: _truthy(condition()), timeout=10)
            [c] = await condition()
            assert c["type"] == "MemoryFault" and c["verdict"] == verdict
            diag = (await hub.call("GET", f"/v1/devices/{dev_id}/diagnosis")).json()["data"]
            assert diag["status"] == "critical"
        else:
            await trio.sleep(0.5)
            assert await condition() == [], "a few retired pages or one-off errors are no MemoryFault"
            if fault == "stuck":
                assert res["retired"], "reproducible single-cell faults retire their pages"
        if summary["omittedPages"]:
            diag = diag or (await hub.call("GET", f"/v1/devices/{dev_id}/diagnosis")).json()["data"]
            [info] = [i for i in diag["issues"] if i["code"] == "MemoryTestPageMapSummarised"]
            assert info["details"]["omittedPages"] == summary["omittedPages"]
        d = (await hub.call("GET", f"/v1/devices/{dev_id}")).json()["data"]
        assert d["online"] is True


async def _truthy(value) -> bool:
    return bool(await value)


async def test_agent_full_online_cancel_keeps_results_and_restores_the_workload(hub, nursery, tmp_path):
    from tests.hubtools import start_agent

    with trio.fail_after(120):
        dev_id, token = await hub.provision("full")
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent",
                                    **_agent_options(budget=32 << 20))
        r = await hub.call("POST", mt(dev_id), json={"impact": "stopped", "bitFade": False, "passes": 20})
        assert r.status_code == 202, r.text
        run_id = r.json()["data"]["runId"]
        actor = hub.services.registry.lookup(("device", uuid.UUID(dev_id)))
        assert actor.facts["workloadHeld"] is True and running.agent.workload.held
        r = await hub.call("POST", mt(dev_id, "/cancel"), json={"runId": run_id})
        assert r.status_code == 202, r.text
        res = await _wait_result(hub, dev_id, run_id)
        assert res["outcome"] == "cancelled"
        await wait_for(lambda: not running.agent.workload.held, timeout=10)
        await wait_for(lambda: not actor.facts["workloadHeld"], timeout=10)


async def test_agent_killed_mid_test_reports_interrupted_at_its_next_start(hub, nursery, tmp_path):
    from tests.hubtools import start_agent

    with trio.fail_after(120):
        dev_id, token = await hub.provision("killed")
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent",
                                    **_agent_options(budget=32 << 20))
        r = await hub.call("POST", mt(dev_id), json={"passes": 20})
        started = trio.current_time()
        run_id = r.json()["data"]["runId"]
        await trio.sleep(0.5)
        await running.kill()
        await start_agent(nursery, hub.base_url, token, tmp_path / "agent", **_agent_options(budget=32 << 20))
        res = await _wait_result(hub, dev_id, run_id)
        assert res["outcome"] == "interrupted" and res["interrupted"]["phase"]
        diag = (await hub.call("GET", f"/v1/devices/{dev_id}/diagnosis")).json()["data"]
        assert [i["code"] for i in diag["issues"]] == ["MemoryTestInterrupted"]
        # the hub no longer thinks a test runs: a new start goes through (once the 5 s rate allows)
        await trio.sleep_until(started + 5)
        assert (await hub.call("POST", mt(dev_id), json={"quick": True})).status_code == 202


async def test_agent_test_boot_from_a_dashboard_session(hub, nursery, tmp_path):
    from tests.hubtools import start_agent

    with trio.fail_after(180):
        dev_id, token = await hub.provision("boot")
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent", **_agent_options())
        browser, headers = await _login(hub)
        try:
            r = await browser.post(mt(dev_id), headers=headers, json={
                "impact": "stopped", "placement": "offline", "passes": 1, "kernelPasses": 1, "bitFade": False})
        finally:
            await browser.aclose()
        assert r.status_code == 202, r.text
        run_id = r.json()["data"]["runId"]
        assert r.json()["data"]["status"]["phase"] == "rebooting"
        res = await _wait_result(hub, dev_id, run_id, timeout=120)
        assert res["outcome"] == "pass" and res["plan"]["mode"] == "test_boot"

        async def back_in_service() -> bool:
            d = (await hub.call("GET", f"/v1/devices/{dev_id}")).json()["data"]
            return d["state"] == "online" and d["boot_reason"] == "memory_test_done"

        await wait_for(back_in_service, timeout=30, interval=0.2)
        assert not running.agent.workload.held


async def test_an_older_agents_phases_and_null_verdict_read_as_the_spec_names_them(hub, nursery):
    """Issue 15 §1: phase takes only the spec's values (a sub-step goes in ``step``) and verdict is
    always one of the spec's, also when an older agent sends ``patterns`` or a null verdict."""
    with trio.fail_after(30):
        old = result("old-1", "interrupted", "ok", interrupted={"phase": "idle_decay", "pass": 1,
                                                                "pattern": "idle_decay"})
        old["verdict"] = None
        dev_id, device = await connect(hub, nursery, lastMemoryTest=old)
        await wait_for(lambda: "old-1" in device.acked, timeout=5)
        [stored] = (await hub.call("GET", mt(dev_id, "/results"))).json()["data"]["results"]
        assert stored["verdict"] == "unknown"
        assert (stored["interrupted"]["phase"], stored["interrupted"]["step"]) == ("testing", "idle_decay")
        r = await hub.call("POST", mt(dev_id), json={"quick": True})
        assert r.status_code == 202, r.text
        run_id = r.json()["data"]["runId"]
        device.running = {**device.running, "phase": "patterns", "pattern": "walking_ones"}
        await device.event("memtest.progress", device.running)
        actor = hub.services.registry.lookup(("device", uuid.UUID(dev_id)))
        await wait_for(lambda: (actor.memtests.machine.status or {}).get("pattern") == "walking_ones", timeout=5)
        assert (actor.memtests.machine.status["phase"], actor.memtests.machine.status["step"]) == ("testing", "patterns")
        live = (await hub.call("GET", mt(dev_id))).json()["data"]
        assert live["status"]["runId"] == run_id and live["status"]["phase"] == "testing"
