"""The hub killed with SIGKILL in the middle of a rollout, secret-file uploads, a memory test and a
tunnel session, then started again on the same data dir and port (issue 10, item 3).

Everything is a real process: ``fleethub serve`` (its embedded PostgreSQL is in its own session and
survives the kill, as it would on a real machine; the new hub attaches to it), ``fleethub sim`` for
the fleet being rolled out, ``fleethub agent`` for the device running a memory test and offering a
tunnel target, and ``fleethub tunnel`` for the tunnel's client. One kill, then the proofs:

- every write answered 201 before the kill is there (fleets, devices, configurations, secret files,
  and a service account whose access token still works);
- the rollout goes on and completes: every device runs the version and started its workload for it
  exactly once (the workload logs each start; killtools.COUNTING_WORKLOAD);
- each upload that raced the kill is either absent or whole and delivered; every device file on disk
  has its sha256 and no temporary file is left;
- the memory test ran on through the outage: the hub shows the same run live after the restart, then
  exactly the result the device recorded;
- the tunnel session, whose client is frozen so nobody renews it, is closed by the device when its
  last grant ends, and the hub's record ends as expired with the bytes the device counted.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import os
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from device_client.sim import SimError, load_registry
from tests.e2e.clitools import api, free_port, run_cli_json, stop_leftover_postgres, wait_until
from tests.e2e.killtools import (
    COUNTING_WORKLOAD,
    EchoServer,
    EnvProc,
    echo_roundtrip,
    file_sha256,
    manifest,
    memtest_history,
    memtest_unacked,
    temp_files,
    workload_starts,
)
from tests.proctools import sigstop

FLEET_SIZE = 4
RACERS = 8
RACE_SPACING = 0.01
GRANT_SECONDS = 4
ICE = {"FLEETHUB_ICE_ADDRESSES": "127.0.0.1"}  # peers find each other on loopback only
HUB_ENV = {"FLEETHUB_HEARTBEAT_INTERVAL": "1", "FLEETHUB_DRAIN_WINDOW": "1",
           "FLEETHUB_TUNNEL_GRANT_SECONDS": str(GRANT_SECONDS), **ICE}
DEVICE_ENV = {"FLEETHUB_AGENT_IGNORE_OWNER": "1", **ICE}  # unprivileged runs keep their own uid
# Each device's update takes at least its health grace, so from "one succeeded, one updating" the
# rollout has 2+ graces (8+ s) to go: room for the steps before the kill on a loaded machine. With
# 1.5 s the rollout once finished first under 4 test workers, and the test proved nothing.
SLOW_COUNTING_WORKLOAD = {**COUNTING_WORKLOAD,
                          "healthCheck": {**COUNTING_WORKLOAD["healthCheck"], "graceSeconds": 4}}


@pytest.fixture
def kill_procs(tmp_path):
    """Like the ``procs`` fixture, with an environment for each process."""
    started: list[EnvProc] = []

    def start(name: str, args: list[str], env: dict[str, str]) -> EnvProc:
        proc = EnvProc(name, args, tmp_path / "logs", env)
        started.append(proc)
        return proc

    yield start
    for proc in reversed(started):
        proc.kill()
    stop_leftover_postgres(tmp_path)


def ready(base_url: str) -> bool:
    return httpx.get(base_url + "/readyz", timeout=2).status_code == 200


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class Hub:
    """The hub's address, credentials and the ids of what it acknowledged."""

    def __init__(self, base_url: str, pat: dict, org_id: str) -> None:
        self.base_url, self.pat, self.org_id = base_url, pat, org_id
        self.acked: dict[str, list[str]] = {"fleets": [], "devices": [], "configurations": []}
        self.acked_files: dict[str, dict] = {}  # file id → {owner path, path, sha256}

    def client(self) -> httpx.Client:
        return api(self.base_url, self.pat, self.org_id)

    def get(self, path: str) -> dict:
        with self.client() as c:
            r = c.get(path)
        assert r.status_code == 200, f"GET {path} -> {r.status_code} {r.text}"
        return r.json()["data"]

    def create(self, kind: str, body: dict) -> dict:
        with self.client() as c:
            r = c.post(f"/v1/{kind}", json=body)
        assert r.status_code == 201, f"POST /v1/{kind} -> {r.status_code} {r.text}"
        data = r.json()["data"]
        self.acked[kind].append(data["id"])
        return data

    def upload(self, owner: str, path: str, content: bytes) -> dict:
        with self.client() as c:
            r = c.post(f"{owner}/secret-files", json={"path": path, "content_base64": b64(content)})
        assert r.status_code == 201, f"upload {path} -> {r.status_code} {r.text}"
        data = r.json()["data"]
        self.acked_files[data["id"]] = {"owner": owner, "path": path, "sha256": hashlib.sha256(content).hexdigest()}
        return data

    def rollout(self, rid: str) -> dict:
        return self.get(f"/v1/rollouts/{rid}")

    def billing_token(self) -> None:
        """A service account's access token for the billing records (they take a Bearer token); the
        same token is used after the restart: the hub's signing key survives it."""
        with self.client() as c:
            r = c.post("/v1/service-accounts", json={"name": "billing", "policies": [
                {"relation": "billing_viewer", "object_type": "organization"}]})
            assert r.status_code == 201, r.text
            sa = r.json()["data"]
            r = c.post("/v1/oauth/token", data={"grant_type": "client_credentials", "client_id": sa["client_id"],
                                                "client_secret": sa["client_secret"]})
            assert r.status_code == 200, r.text
        self.bearer = r.json()["access_token"]

    def tunnel_session(self, device_id: str) -> dict | None:
        """The hub's record of the device's tunnel session."""
        r = httpx.get(self.base_url + "/v1/billing/tunnel/usage/records", timeout=10,
                      headers={"Authorization": f"Bearer {self.bearer}", "X-Organization-ID": self.org_id})
        assert r.status_code == 200, r.text
        return next((x for x in r.json()["data"]["records"] if x["device_id"] == device_id), None)


def start_hub(procs, name: str, data: Path, port: int) -> EnvProc:
    proc = procs(name, ["serve", "--port", str(port), "--data-dir", str(data)], env=HUB_ENV)
    wait_until(lambda: ready(f"http://127.0.0.1:{port}"), timeout=60, what=f"{name} ready", proc=proc)
    return proc


def all_online(hub: Hub, ids: list[str]) -> bool:
    return all(hub.get(f"/v1/devices/{d}")["online"] for d in ids)


def test_sigkill_mid_rollout_upload_memory_test_and_tunnel(tmp_path, kill_procs, request):
    procs = kill_procs
    data = tmp_path / "hub"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    serve = start_hub(procs, "serve", data, port)  # admin needs the data dir serve makes
    org = run_cli_json(["admin", "--data-dir", str(data), "create-org", "Kill Org"])
    run_cli_json(["admin", "--data-dir", str(data), "create-user", "ops@kill.test", "--org", org["id"],
                  "--role", "admin"])
    pat = run_cli_json(["admin", "--data-dir", str(data), "create-pat", "ops@kill.test"])
    hub = Hub(base, pat, org["id"])

    # ---- acknowledged writes, and the fleet the rollout will update ----
    fleet = hub.create("fleets", {"name": "line-1"})
    for i in range(3):
        hub.create("fleets", {"name": f"spare-{i}"})
        hub.create("devices", {"name": f"shelf-{i}"})
    cfg = hub.create("configurations", {"name": "app", "spec": {"workload": SLOW_COUNTING_WORKLOAD}})
    cid, vid = cfg["id"], cfg["version"]["id"]
    hub.upload(f"/v1/configurations/{cid}", "/etc/app/config-key", os.urandom(3000))
    hub.upload(f"/v1/configurations/{cid}", "/etc/app/ca.pem", os.urandom(40_000))

    echo = EchoServer()
    request.addfinalizer(echo.close)
    sim_dir = tmp_path / "sim"
    # --pat-secret=VALUE: a secret may begin with "-", which argparse takes for an option otherwise
    sim = procs("sim", ["sim", "--hub", base, "--devices", str(FLEET_SIZE), "--data-dir", str(sim_dir),
                        "--pat-id", pat["id"], f"--pat-secret={pat['secret']}", "--org", org["id"],
                        "--fleet", fleet["id"]], env=DEVICE_ENV)
    wait_until(lambda: (sim_dir / "sim.json").exists() and len(_sim_ids(sim_dir)) == FLEET_SIZE, timeout=30,
               what="the simulator's devices provisioned", proc=sim)
    fleet_ids = _sim_ids(sim_dir)
    hub.acked["devices"] += fleet_ids
    wait_until(lambda: all_online(hub, fleet_ids), timeout=30, what="the fleet online", proc=sim)

    mem_dev = hub.create("devices", {"name": "mem-1"})
    mem_dir = tmp_path / "mem-1"
    agent = procs("agent", ["agent", "--hub", base, "--data-dir", str(mem_dir), "--memory-budget", "128M",
                            "--tunnel-target", f"echo=127.0.0.1:{echo.port}"],
                  env={**DEVICE_ENV, "FLEETHUB_DEVICE_TOKEN": mem_dev["token"]})
    wait_until(lambda: all_online(hub, [mem_dev["id"]]), timeout=30, what="mem-1 online", proc=agent)

    # ---- a tunnel session to mem-1, open and carrying bytes ----
    run_cli_json(["admin", "--data-dir", str(data), "tunnel-entitle", org["id"], "--enabled"])
    listen_port = free_port()
    cli = procs("tunnel", ["tunnel", "--hub", base, "--device", mem_dev["id"], "--target", "echo",
                           "--listen", f"127.0.0.1:{listen_port}"],
                env={**ICE, "FLEETHUB_PAT_ID": pat["id"], "FLEETHUB_PAT_SECRET": pat["secret"],
                     "FLEETHUB_ORG_ID": org["id"]})
    wait_until(lambda: "tunnel ready" in cli.log_path.read_text(), timeout=40, what="the tunnel ready", proc=cli)
    assert echo_roundtrip(listen_port, b"before the kill") == b"before the kill"
    hub.billing_token()
    session = hub.tunnel_session(mem_dev["id"])
    assert session is not None and session["state"] == "open", session
    # a device's own file, acknowledged: pushed at once, or after the restart at the latest
    own_target = fleet_ids[0]
    hub.upload(f"/v1/devices/{own_target}", "/etc/app/device-cert", os.urandom(2000))

    # ---- a rollout under way, held at its canary while the rest is set up, then a memory test ----
    with hub.client() as c:
        r = c.post("/v1/rollouts", json={"fleet_ids": [fleet["id"]], "configuration_id": cid, "batch_size": 1})
        assert r.status_code == 201, r.text
        rid = r.json()["data"]["id"]
    assert [sum(b["counts"].values()) for b in r.json()["data"]["batches"]] == [1] * FLEET_SIZE

    def canary_started() -> bool:
        ro = hub.rollout(rid)
        assert ro["state"] == "running" and ro["counts"]["succeeded"] == 0, ro
        return ro["counts"]["updating"] + ro["counts"]["verifying"] >= 1

    # Paused once the canary has started (it finishes; no later batch starts) and resumed just before
    # the kill, so the kill comes mid-rollout however slow the machine: timed by health graces alone,
    # the steps before the kill outlasted the rollout under 4 test workers (CI58, and 4 copies at once).
    wait_until(canary_started, timeout=40, interval=0.05, what="the rollout's canary started", proc=serve)
    with hub.client() as c:
        r = c.post(f"/v1/rollouts/{rid}/pause")
        assert r.status_code == 200 and r.json()["data"]["state"] == "paused", r.text
    with hub.client() as c:
        r = c.post(f"/v1/devices/{mem_dev['id']}/memory-test", json={"quick": True})
        assert r.status_code == 202, r.text
        run_id = r.json()["data"]["runId"]
    status = hub.get(f"/v1/devices/{mem_dev['id']}/memory-test")["status"]
    assert status["runId"] == run_id and status["phase"] not in ("done", None), status

    # ---- uploads racing the kill (a few, staggered, so some land before, during and after it) ----
    race_target = fleet_ids[1]
    race_dir = sim_dir / "devices" / race_target
    races = [{"path": f"/etc/app/raced-{i}", "content": os.urandom(5000 + i)} for i in range(RACERS)]

    clients = [hub.client() for _ in races]
    for c in clients:  # connected and warm, so each POST leaves at its own moment
        assert c.get(f"/v1/devices/{race_target}").status_code == 200
    go = threading.Barrier(RACERS + 1)

    def upload_racing(race: dict, c: httpx.Client, delay: float) -> None:
        go.wait()
        time.sleep(delay)
        try:
            r = c.post(f"/v1/devices/{race_target}/secret-files",
                       json={"path": race["path"], "content_base64": b64(race["content"])})
            race["status"] = r.status_code
        except httpx.HTTPError as exc:
            race["error"] = repr(exc)
        finally:
            c.close()

    def canary_done() -> bool:
        ro = hub.rollout(rid)
        assert ro["state"] == "paused" and ro["counts"]["pending"] == FLEET_SIZE - 1, ro
        return ro["counts"]["succeeded"] == 1

    wait_until(canary_done, timeout=40, interval=0.05, what="the canary succeeded", proc=serve)
    with hub.client() as c:
        r = c.post(f"/v1/rollouts/{rid}/resume")
        assert r.status_code == 200 and r.json()["data"]["state"] == "running", r.text
    # the tunnel's client is frozen across the kill, so nobody renews the grant from here on
    sigstop(cli.popen.pid)  # returns once it has stopped
    # a device still pending has a dispatch and a whole health grace (4 s) to go after this look, which
    # comes a few tenths of a second before the kill
    before_kill = hub.rollout(rid)["counts"]
    assert before_kill["pending"] >= 1, ("the rollout was not half way at the kill", before_kill)
    racers = [threading.Thread(target=upload_racing, args=(race, c, i * RACE_SPACING))
              for i, (race, c) in enumerate(zip(races, clients))]
    for racer in racers:
        racer.start()
    go.wait()
    time.sleep(RACERS / 2 * RACE_SPACING)
    serve.kill()
    for racer in racers:
        racer.join(15)
        assert not racer.is_alive()
    for race in races:
        assert race.get("status") in (None, 201), race  # acknowledged, or no answer at all
    assert nothing_answers(base)

    # the device ends the tunnel session when its grant runs out, hub or no hub
    sid = session["id"]
    wait_until(lambda: f"tunnel {sid} closed" in agent.log_path.read_text(), timeout=GRANT_SECONDS + 10,
               what="the device to close the tunnel session", proc=agent)
    closed_at, grant_end = device_closed_at(agent.log_path.read_text(), sid)
    assert grant_end - dt.timedelta(seconds=0.05) <= closed_at <= grant_end + dt.timedelta(seconds=2), \
        ("the device closes the session when its last grant ends", closed_at, grant_end)

    # ---- the hub again, same data dir and port ----
    serve = start_hub(procs, "serve-again", data, port)
    assert hub.rollout(rid)["counts"]["succeeded"] >= before_kill["succeeded"], "a success acknowledged was lost"

    # every acknowledged write is there
    for kind, ids in hub.acked.items():
        for obj_id in ids:
            hub.get(f"/v1/{kind}/{obj_id}")
    for file_id, f in hub.acked_files.items():
        listed = {x["id"]: x for x in hub.get(f"{f['owner']}/secret-files")}
        assert file_id in listed and listed[file_id]["path"] == f["path"], (f, listed)
        assert f["sha256"].startswith(listed[file_id]["sha256Prefix"])

    # the rollout goes on and completes
    wait_until(lambda: all_online(hub, fleet_ids + [mem_dev["id"]]), timeout=40,
               what="every device back after the restart", proc=serve)
    # the memory test, as the device reports it now: the same run, still testing or done
    after = hub.get(f"/v1/devices/{mem_dev['id']}/memory-test")
    assert after["source"] == "live" and after["status"]["runId"] == run_id, after
    wait_until(lambda: hub.rollout(rid)["state"] != "running", timeout=60, interval=0.2,
               what="the rollout to settle after the restart", proc=serve)
    final = hub.rollout(rid)
    assert final["state"] == "completed" and final["counts"]["succeeded"] == FLEET_SIZE, final
    for dev in fleet_ids:
        assert hub.get(f"/v1/devices/{dev}")["configuration"]["applied_version_id"] == vid
        # applied exactly once: the workload was started for the version once and for nothing else
        assert workload_starts(sim_dir / "devices" / dev) == [vid], (dev, workload_starts(sim_dir / "devices" / dev))

    # each raced upload: absent, or complete and delivered — never half there
    listed = {f["path"]: f for f in hub.get(f"/v1/devices/{race_target}/secret-files")}
    for race in races:
        sha = hashlib.sha256(race["content"]).hexdigest()
        if race.get("status") == 201:
            assert race["path"] in listed, ("an acknowledged upload is kept", race["path"])
        f = listed.get(race["path"])
        if f is None:
            assert not (race_dir / "root" / race["path"].lstrip("/")).exists(), race["path"]
            continue
        assert f["size"] == len(race["content"]) and sha.startswith(f["sha256Prefix"]), (race["path"], f)
        hub.acked_files[f["id"]] = {"owner": f"/v1/devices/{race_target}", "path": race["path"], "sha256": sha}

    # every file reaches On device, whole, with no temporary file beside it
    def delivered() -> bool:
        return all(x["status"] == "on_device" for f in hub.acked_files.values()
                   for x in hub.get(f"{f['owner']}/secret-files") if x["id"] in hub.acked_files)

    wait_until(delivered, timeout=30, interval=0.2, what="every secret file on its devices", proc=serve)
    expected: dict[str, dict[str, str]] = {dev: {} for dev in fleet_ids}
    for f in hub.acked_files.values():
        owners = fleet_ids if f["owner"].startswith("/v1/configurations/") else [f["owner"].rsplit("/", 1)[1]]
        for dev in owners:
            expected[dev][f["path"]] = f["sha256"]
    for dev, files in expected.items():
        ddir = sim_dir / "devices" / dev
        assert {p: e["sha256"] for p, e in manifest(ddir).items()} == files, dev
        for path, sha in files.items():
            assert file_sha256(ddir / "root" / path.lstrip("/")) == sha, (dev, path)
    assert temp_files(sim_dir) == [] and temp_files(mem_dir) == []

    # the memory test ran on: the hub shows the run, then the result the device recorded
    def finished() -> dict | None:
        results = hub.get(f"/v1/devices/{mem_dev['id']}/memory-test/results")["results"]
        mine = [x for x in results if x["runId"] == run_id]
        assert len(mine) <= 1, mine  # one run, one result: never an extra "interrupted" for it
        return mine[0] if mine else None

    stored = wait_until(finished, timeout=90, interval=0.3, what="the memory test's result", proc=agent)
    [on_device] = [x for x in memtest_history(mem_dir) if x["runId"] == run_id]
    for key in ("outcome", "verdict", "errorCount", "testedBytes", "plan"):
        assert stored[key] == on_device[key], (key, stored, on_device)
    assert on_device["outcome"] == "pass", on_device
    live = hub.get(f"/v1/devices/{mem_dev['id']}/memory-test")
    assert live["status"]["runId"] == run_id and live["status"]["phase"] == "done", live
    assert run_id in [h["runId"] for h in live["history"]]
    wait_until(lambda: memtest_unacked(mem_dir) == [], timeout=10, what="the hub to acknowledge the result")

    # the hub's record of the tunnel session ended, with the bytes the device counted (its final
    # report, made while the hub was down, is sent when the link is back)
    def session_ended() -> dict | None:
        record = hub.tunnel_session(mem_dev["id"])
        return record if record and record["state"] != "open" and record["bytes_in"] > 0 else None

    ended = wait_until(session_ended, timeout=30, interval=0.3, what="the hub's record of the session to end",
                       proc=serve)
    assert ended["id"] == sid and ended["state"] in ("closed", "expired") and ended["closed_at"], ended
    assert ended["close_reason"] == "expired", ended
    assert ended["bytes_in"] == ended["bytes_out"] == len(b"before the kill"), ended
    # the thawed client learns that its session is over
    cli.popen.send_signal(signal.SIGCONT)
    wait_until(lambda: cli.popen.poll() is not None, timeout=40, what="the tunnel client to exit")
    assert cli.popen.returncode == 1 and "tunnel closed" in cli.log_path.read_text(), cli.log_tail()

    assert sim.interrupt(timeout=30) == 0, sim.log_tail()
    assert agent.interrupt(timeout=30) == 0, agent.log_tail()
    assert serve.interrupt(timeout=30) == 0, serve.log_tail()


def parse_time(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


def device_closed_at(agent_log: str, sid: str) -> tuple[dt.datetime, dt.datetime]:
    """When the device closed the session because its grant expired, and when its last grant (from
    the agent's log of its renewals) ended."""
    renewals = re.findall(rf"tunnel {sid}: renewed until (\S+)", agent_log)
    assert renewals, "the session was renewed at least once before the kill"
    closed = re.search(rf"^(\S+ \S+) INFO fleethub.agent.tunnel: tunnel {sid} closed \(expired\)$", agent_log,
                       re.MULTILINE)
    assert closed, "the device closed the session as expired"
    logged = dt.datetime.strptime(closed.group(1), "%Y-%m-%d %H:%M:%S,%f").astimezone()  # local time
    return logged, parse_time(renewals[-1])


def nothing_answers(base: str) -> bool:
    """Nothing answers on the hub's port once it was killed (the kill really took the hub down)."""
    try:
        httpx.get(base + "/readyz", timeout=1)
    except httpx.HTTPError:
        return True
    return False


def _sim_ids(sim_dir: Path) -> list[str]:
    try:
        return [d["id"] for d in load_registry(sim_dir)]
    except SimError:  # written atomically; this is only a guard
        return []
