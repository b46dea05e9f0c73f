"""One fault suite run (issue 38), in the style of Jepsen: a real cluster (cluster.py), a workload
(back-to-back rollouts, pings through every node, an SSE stream, audit-tagged REST calls, each with its
own X-Request-ID), a nemesis injecting faults one after the other, observers sampling PostgreSQL and
the agents, and a history of JSON lines that checker.py judges. ``run`` returns the history's path.

Faults (``FAULTS``): node-stop (SIGSTOP of the rollout's lease holder), node-kill (SIGKILL, then a
restart), two-nodes-kill, nats-stop (SIGSTOP), nats-kill (SIGKILL, then a restart on its port),
pg-freeze (every PostgreSQL process SIGSTOPped), pg-stop (a fast shutdown, then a start), clock-skew
(a node restarted with its clock ``SKEW`` seconds ahead, FLEETHUB_TEST_CLOCK_OFFSET)."""

from __future__ import annotations

import itertools
import random
import signal
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import trio

from tests.cluster.clustertools import seed
from tests.cluster.faults.checker import ENDED
from tests.cluster.faults.cluster import FaultCluster, FaultNode
from tests.cluster.faults.history import History
from tests.hubtools import start_agent

FAULTS = ("node-stop", "node-kill", "two-nodes-kill", "nats-stop", "nats-kill", "pg-freeze", "pg-stop",
          "clock-skew")
SKEW = 30.0  # seconds: past the leases below many times over (leases and liveness are timed on PostgreSQL's clock)
WORKLOAD = {"command": ["/bin/sleep", "100000"], "healthCheck": {"timeoutSeconds": 2, "graceSeconds": 0.2}}
# Short leases so that a run of minutes sees every recovery; the bound the checker holds presence to
# follows from them (a node lease, a renewal round, the row cache's 2 s, a sampling period).
NODE_ENV = {"FLEETHUB_ROLLOUT_LEASE_SECONDS": "4", "FLEETHUB_NODE_LEASE_SECONDS": "4",
            "FLEETHUB_ROLLOUT_RESEND_AFTER": "3", "FLEETHUB_HEARTBEAT_INTERVAL": "1",
            "FLEETHUB_LOG_LEVEL": "INFO"}
OFFLINE_BOUND = 10.0
GRACE = 10.0  # after a fault on a node: its devices' reconnect backoff, the survivors' node lease


@dataclass
class Plan:
    faults: tuple[str, ...]
    nodes: int = 3
    devices: int = 12
    fault_seconds: float = 5.0
    gap: float = 4.0  # between one fault's end and the next one's start
    settle: float = 45.0  # after the last fault: the longest a rollout may take to end
    batch_size: int = 2
    seed: int = 38


class Run:
    def __init__(self, plan: Plan, root: Path, history: History) -> None:
        self.plan, self.root, self.h = plan, root, history
        self.cluster = FaultCluster(root, plan.nodes, NODE_ENV)
        self.rng = random.Random(plan.seed)
        self.down: set[str] = set()  # nodes the workload leaves alone now (stopped, killed, restarting)
        self.headers: dict[str, str] = {}
        self.agents: list = []
        self.fleet_id = ""
        self.rollouts: list[str] = []
        self.faulting = True
        self.holder: str | None = None  # the newest rollout lease's owner, as last read
        self.calls: list[trio.CancelScope] = []  # the workload's callers, stopped before the audit is read

    # -- the workload's calls --------------------------------------------------------------------

    def live_nodes(self) -> list[FaultNode]:
        return [n for n in self.cluster.nodes if n.name not in self.down] or self.cluster.nodes

    async def call(self, client: httpx.AsyncClient, node: FaultNode, method: str, path: str,
                   **kw) -> httpx.Response | None:
        request_id = f"fault-{uuid.uuid4().hex}"
        status = None
        try:
            r = await client.request(method, node.url + path, headers={**self.headers, "X-Request-ID": request_id},
                                     timeout=12, **kw)
            status = r.status_code
            return r
        except httpx.HTTPError:
            return None
        finally:
            self.h.add("call", request_id=request_id, method=method, path=path, status=status, node=node.name)

    async def until_settled(self, fn, *args) -> None:
        with trio.CancelScope() as scope:
            self.calls.append(scope)
            await fn(*args)

    async def pings(self, client: httpx.AsyncClient, node: FaultNode, device_ids: list[str]) -> None:
        """Through one node, to any device: one waiting out a timeout holds up no other node's."""
        while True:
            if node.name in self.down:
                await trio.sleep(0.1)
                continue
            await self.call(client, node, "POST", f"/v1/devices/{self.rng.choice(device_ids)}/ping")
            await trio.sleep(0.3)

    async def writes(self, client: httpx.AsyncClient) -> None:
        for i in itertools.count():
            await self.call(client, self.rng.choice(self.live_nodes()), "POST", "/v1/fleets",
                            json={"name": f"fault-write-{i}"})
            await trio.sleep(0.5)

    async def rollouts_loop(self, client: httpx.AsyncClient) -> None:
        """A rollout always under way while faults are injected: the next starts when one ends."""
        for i in itertools.count():
            if not self.faulting:
                return
            node = self.rng.choice(self.live_nodes())
            r = await self.call(client, node, "POST", "/v1/configurations",
                                json={"name": f"app-{i}", "spec": {"workload": WORKLOAD}})
            if r is None or r.status_code != 201:
                await trio.sleep(0.5)
                continue
            cid = r.json()["data"]["id"]
            r = None
            while r is None or r.status_code != 201:
                r = await self.call(client, self.rng.choice(self.live_nodes()), "POST", "/v1/rollouts",
                                    json={"fleet_ids": [self.fleet_id], "configuration_id": cid,
                                          "batch_size": self.plan.batch_size})
                if r is None or r.status_code != 201:
                    await trio.sleep(0.5)
            rid = r.json()["data"]["id"]
            self.rollouts.append(rid)
            self.h.add("rollout_started", rollout=rid)
            while True:
                await trio.sleep(0.5)
                state = await self.db_state(rid)
                if state in ("completed", "cancelled", "paused"):
                    break
            if state == "paused":
                return  # the checker judges its reason; nothing else starts on this fleet

    async def db_state(self, rid: str) -> str | None:
        try:
            return await self.cluster.db.fetchval("SELECT state FROM rollouts WHERE id = $1", uuid.UUID(rid))
        except Exception:  # noqa: BLE001 — the database is frozen or down: no answer this round
            return None

    async def stream(self, client: httpx.AsyncClient) -> None:
        """An SSE stream on the last node for whichever rollout is current: what it shows is recorded."""
        node = self.cluster.nodes[-1]
        watched = None
        while True:
            if not self.rollouts or self.rollouts[-1] == watched or node.name in self.down:
                await trio.sleep(0.2)
                continue
            watched = self.rollouts[-1]
            try:
                async with client.stream("GET", f"{node.url}/v1/rollouts/{watched}/events", headers=self.headers,
                                         timeout=httpx.Timeout(10, read=None)) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("event: "):
                            self.h.add("sse", rollout=watched, event=line[7:], node=node.name)
                        if self.rollouts[-1] != watched:
                            break
            except httpx.HTTPError:
                watched = None
                await trio.sleep(0.5)

    # -- observers -------------------------------------------------------------------------------

    async def observe(self) -> None:
        steps: dict[tuple[str, str], str] = {}
        while True:
            await trio.sleep(0.5)
            try:
                rows = await self.cluster.db.fetch("SELECT rollout_id, device_id, step FROM rollout_devices")
                online = {str(r["id"]): r["online"] for r in await self.cluster.db.fetch("SELECT id, online FROM devices")}
            except Exception:  # noqa: BLE001 — frozen or down: this sample is skipped
                continue
            for r in rows:
                key = (str(r["rollout_id"]), str(r["device_id"]))
                if steps.get(key) != r["step"]:
                    steps[key] = r["step"]
                    self.h.add("step", rollout=key[0], device=key[1], step=r["step"])
            for device_id, agent in self.agents:
                self.h.add("presence", device=device_id, link=agent.agent.connected,
                           node=self.cluster.node_of(agent.agent.hub_url), online=online.get(device_id, False))

    # -- the nemesis -----------------------------------------------------------------------------

    def lease_holder(self) -> FaultNode:
        names = [n.name for n in self.live_nodes()]
        return next((n for n in self.cluster.nodes if n.name == self.holder and n.name in names),
                    self.rng.choice(self.live_nodes()))

    async def refresh_holder(self) -> None:
        try:
            self.holder = await self.cluster.db.fetchval(
                "SELECT owner FROM rollout_leases ORDER BY epoch DESC LIMIT 1")
        except Exception:  # noqa: BLE001 — the database is frozen or down: any node will do
            self.holder = None

    async def inject(self, client: httpx.AsyncClient, fault: str) -> None:
        c, secs = self.cluster, self.plan.fault_seconds
        await self.refresh_holder()
        if fault in ("node-stop", "node-kill", "clock-skew"):
            targets = [self.lease_holder()]
        elif fault == "two-nodes-kill":
            first = self.lease_holder()
            targets = [first, self.rng.choice([n for n in c.nodes if n is not first])]
        else:
            targets = []
        names = [n.name for n in targets] or (["nats"] if fault.startswith("nats") else ["postgres"])
        self.h.add("fault", fault=fault, targets=names, phase="start")
        self.down |= {n.name for n in targets}
        if fault == "node-stop":
            targets[0].signal(signal.SIGSTOP)
            await trio.sleep(secs)
            targets[0].signal(signal.SIGCONT)
        elif fault in ("node-kill", "two-nodes-kill", "clock-skew"):
            for n in targets:
                await n.kill()
            if fault == "clock-skew":
                targets[0].start(FLEETHUB_TEST_CLOCK_OFFSET=str(SKEW))
                await targets[0].ready(client)
                self.down -= set(names)
                await trio.sleep(secs)
                self.down |= set(names)
                await targets[0].kill()
            else:
                await trio.sleep(secs)
            for n in targets:
                n.start()
            for n in targets:
                await n.ready(client)
        elif fault == "nats-stop":
            c.stop_nats()
            await trio.sleep(secs)
            c.resume_nats()
        elif fault == "nats-kill":
            await c.kill_nats()
            await trio.sleep(secs)
            await c.restart_nats()
        elif fault == "pg-freeze":
            c.freeze_postgres()
            await trio.sleep(secs)
            c.thaw_postgres()
        elif fault == "pg-stop":
            await c.stop_postgres()
            await trio.sleep(secs)
            await c.restart_postgres()
        else:
            raise ValueError(f"no such fault: {fault}")
        self.down -= set(names)
        self.h.add("fault", fault=fault, targets=names, phase="end")

    # -- the whole run ---------------------------------------------------------------------------

    async def run(self) -> None:
        p, c = self.plan, self.cluster
        self.h.add("meta", offline_bound=OFFLINE_BOUND, grace=GRACE, expected_failures=[],
                   plan={"faults": list(p.faults), "nodes": p.nodes, "devices": p.devices,
                         "fault_seconds": p.fault_seconds})
        async with httpx.AsyncClient() as client, trio.open_nursery() as nursery:
            try:
                await c.start(client)
                _, self.headers = await seed(c.pg.dsn, c.data_dir)
                await c.open_observer()
                await c.start_nodes(client)
                first = c.nodes[0]
                r = await self.call(client, first, "POST", "/v1/fleets", json={"name": "fault-fleet"})
                self.fleet_id = r.json()["data"]["id"]
                urls = [n.url for n in c.nodes]
                for i in range(p.devices):
                    r = await self.call(client, first, "POST", "/v1/devices",
                                        json={"name": f"fd{i}", "fleet_id": self.fleet_id})
                    data = r.json()["data"]
                    order = urls[i % len(urls):] + urls[:i % len(urls)]  # each node first for some
                    agent = await start_agent(nursery, ",".join(order), data["token"], self.root / "agents" / f"d{i}",
                                              tunnel_engine=None)
                    self.agents.append((data["id"], agent))
                await self.wait_all_online()
                self.h.add("phase", name="faults")
                nursery.start_soon(self.observe)
                for node in c.nodes:
                    nursery.start_soon(self.until_settled, self.pings, client, node, [d for d, _ in self.agents])
                nursery.start_soon(self.until_settled, self.writes, client)
                nursery.start_soon(self.until_settled, self.stream, client)
                nursery.start_soon(self.rollouts_loop, client)
                await trio.sleep(p.gap)
                for fault in p.faults:
                    await self.inject(client, fault)
                    await trio.sleep(p.gap)
                self.faulting = False
                self.h.add("phase", name="settle")
                with trio.move_on_after(p.settle):
                    while not await self.all_settled():
                        await trio.sleep(0.5)
                for scope in self.calls:
                    scope.cancel()
                await trio.sleep(3)  # the audit rows of the last calls are written behind (about a second)
                await self.final_records()
                nursery.cancel_scope.cancel()
            finally:
                with trio.CancelScope(shield=True):
                    for _, agent in self.agents:
                        agent.scope.cancel()
                    await c.close()

    async def all_settled(self) -> bool:
        states = [await self.db_state(rid) for rid in self.rollouts]
        return bool(states) and all(s in ("completed", "cancelled", "paused") for s in states)

    async def wait_all_online(self) -> None:
        with trio.fail_after(60):
            while True:
                rows = await self.cluster.db.fetch("SELECT online, architecture FROM devices")
                if len(rows) == self.plan.devices and all(r["online"] and r["architecture"] for r in rows):
                    return
                await trio.sleep(0.2)

    async def final_records(self) -> None:
        db = self.cluster.db
        for r in await db.fetch("SELECT id, state, reason FROM rollouts"):
            steps = await db.fetch("SELECT step, count(*) AS n FROM rollout_devices WHERE rollout_id = $1 GROUP BY step",
                                   r["id"])
            self.h.add("rollout", rollout=str(r["id"]), state=r["state"], reason=r["reason"],
                       counts={s["step"]: s["n"] for s in steps})
            if r["state"] not in ENDED:
                await self.unsettled(r["id"])
        for r in await db.fetch("SELECT request_id FROM audit_events WHERE request_id LIKE 'fault-%'"):
            self.h.add("audit", request_id=r["request_id"])
        for r in await db.fetch("SELECT at, rollout_id, writer, owner FROM fault_writes ORDER BY at"):
            self.h.add("write", rollout=str(r["rollout_id"]), writer=r["writer"].removeprefix("fleethub "),
                       owner=r["owner"], at=r["at"].isoformat())

    async def unsettled(self, rollout_id: uuid.UUID) -> None:
        """What a rollout that did not end was waiting on, for the checker's message: each device not
        settled (its step, and what its row says), and the rollout's lease against PostgreSQL's clock."""
        db = self.cluster.db
        lease = await db.fetchrow("SELECT owner, epoch, expires_at < now() AS expired FROM rollout_leases "
                                  "WHERE rollout_id = $1", rollout_id)
        devices = await db.fetch(
            """SELECT rd.device_id, rd.step, rd.batch, round(extract(epoch FROM now() - rd.updated_at))::int AS step_age,
                      d.online, d.link_node, d.config_status, d.config_error,
                      d.config_version_id = r.version_id AS assigned, d.applied_version_id = r.version_id AS runs
               FROM rollout_devices rd JOIN rollouts r ON r.id = rd.rollout_id JOIN devices d ON d.id = rd.device_id
               WHERE rd.rollout_id = $1 AND rd.step NOT IN ('succeeded', 'failed', 'ineligible')""", rollout_id)
        # ids go into the history as text (History writes what JSON has no type for with str)
        self.h.add("unsettled", rollout=str(rollout_id), lease=dict(lease) if lease else None,
                   devices=[dict(d) for d in devices])


async def run(plan: Plan, root: Path) -> Path:
    path = root / "history.jsonl"
    with History(path) as history:
        await Run(plan, root, history).run()
    return path
