"""Secret files and configuration versions through the agent, over a real WebSocket from a fake hub."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import sys

import pytest
import trio

from device_client.agent import Agent, AgentConfig

from device_fakehub import FakeHub

FAST = dict(backoff_initial=0.01, backoff_max=0.04)
PY = sys.executable

# copies the secret it reads from the platform secrets directory to a file the test watches
MIRROR = """
import json, os, sys, time
src = os.path.join(os.environ["FLEETHUB_SECRETS_DIR"], "token")
out = sys.argv[1]
while True:
    try:
        data = open(src).read()
    except FileNotFoundError:
        data = None
    with open(out + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "token": data, "device": os.environ.get("FLEETHUB_DEVICE_ID")}, f)
    os.replace(out + ".tmp", out)
    time.sleep(0.02)
"""


@pytest.fixture
async def hub(nursery):
    return await nursery.start(FakeHub().serve)


async def start(nursery, agent: Agent) -> trio.CancelScope:
    scope = trio.CancelScope()

    async def run(task_status):
        with scope:
            await agent.run(task_status=task_status)

    await nursery.start(run)
    return scope


def file_payload(path: str, data: bytes, file_id: str = "f1", mode: int = 0o600, uid: int = 0, gid: int = 0) -> dict:
    return {"fileId": file_id, "path": path, "mode": mode, "uid": uid, "gid": gid,
            "contentB64": base64.b64encode(data).decode(), "sha256": hashlib.sha256(data).hexdigest(),
            "source": "device"}


def mirror_version(out, version_id: str = "v1", healthy: bool = True) -> dict:
    return {"configId": "cfg-1", "versionId": version_id, "version": 1, "files": [],
            "spec": {"workload": {"command": [PY, "-c", MIRROR, str(out)],
                                  "healthCheck": {"command": [PY, "-c", f"raise SystemExit({0 if healthy else 1})"],
                                                  "timeoutSeconds": 1, "graceSeconds": 0.1}}}}


async def read_mirror(out, until=lambda m: True) -> dict:
    with trio.fail_after(5):
        while True:
            try:
                mirror = json.loads(out.read_text())
            except (FileNotFoundError, ValueError):
                mirror = None
            if mirror is not None and until(mirror):
                return mirror
            await trio.sleep(0.01)


async def test_files_put_delete_and_wipe_over_the_link(hub, nursery, tmp_path):
    with trio.fail_after(10):
        agent = Agent(AgentConfig(hub.url, "tok", tmp_path / "dev", **FAST))
        scope = await start(nursery, agent)
        link = await hub.next_link()
        assert link.hello.secretFileDigests == {}
        data = b"-----BEGIN KEY-----\n\x00\xff binary ok\n"
        reply = await link.command("files.put", {"files": [
            file_payload("/etc/app/tls.key", data, "k", mode=0o640, uid=101, gid=202),
            file_payload("/etc/shadow", b"x", "s")]})
        assert reply.ok
        assert reply.payload == {"results": [
            {"fileId": "k", "path": "/etc/app/tls.key", "status": "on_device", "sha256": hashlib.sha256(data).hexdigest()},
            {"fileId": "s", "path": "/etc/shadow", "status": "failed",
             "error": "path is forbidden: /etc/shadow is a system path"}]}
        local = tmp_path / "dev/root/etc/app/tls.key"
        st = os.stat(local)
        assert local.read_bytes() == data and (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, 101, 202)
        assert not (tmp_path / "dev/root/etc/shadow").exists()

        # the same command id again is answered from memory: nothing is written twice
        before = os.stat(local).st_mtime_ns
        again = await link.command("files.put", {"files": []}, id="c1")
        assert again == reply and os.stat(local).st_mtime_ns == before

        bad = await link.command("files.put", {"files": "nope"})
        assert not bad.ok and bad.error.code == "invalid_payload"

        # the next hello (a process restart) reports what the device holds
        scope.cancel()
        await start(nursery, Agent(AgentConfig(hub.url, "tok", tmp_path / "dev", **FAST)))
        link = await hub.next_link()
        assert link.hello.secretFileDigests == {"/etc/app/tls.key": hashlib.sha256(data).hexdigest()}
        assert (await link.command("files.put", {"files": [file_payload("/opt/x", b"x", "x")]})).ok

        deleted = await link.command("files.delete", {"paths": ["/etc/app/tls.key"]})
        assert deleted.payload == {"results": [{"fileId": "k", "path": "/etc/app/tls.key", "status": "removed"}]}
        assert not local.exists()
        wiped = await link.command("files.wipe")
        assert wiped.payload == {"removed": ["/opt/x"]} and not (tmp_path / "dev/root/opt/x").exists()


async def test_config_apply_over_the_link_with_live_secret_updates(hub, nursery, tmp_path):
    out = tmp_path / "mirror.json"
    with trio.fail_after(20):
        agent = Agent(AgentConfig(hub.url, "tok", tmp_path / "dev", **FAST))
        scope = await start(nursery, agent)
        link = await hub.next_link()
        assert link.hello.configVersionApplied is None
        payload = mirror_version(out)
        payload["files"] = [{**file_payload("/var/lib/fleethub/secrets/token", b"first", "t1", mode=0o600),
                             "source": "configuration", "configId": "cfg-1"}]
        reply = await link.command("config.apply", payload)
        assert reply.ok and reply.payload["status"] == "applied"
        assert reply.payload["files"] == [{"fileId": "t1", "path": "/var/lib/fleethub/secrets/token",
                                           "status": "on_device", "sha256": hashlib.sha256(b"first").hexdigest()}]
        event = await link.next_event("config.result")
        assert event.payload == reply.payload
        mirror = await read_mirror(out, lambda m: m["token"] == "first")
        pid = mirror["pid"]
        assert mirror["device"] == "dev-1"
        secret = tmp_path / "dev/root/var/lib/fleethub/secrets/token"
        assert stat.S_IMODE(os.stat(secret).st_mode) == 0o400  # read-only for the workload

        # a new secret reaches the running workload without a restart
        put = await link.command("files.put", {"files": [{**file_payload("/var/lib/fleethub/secrets/token", b"second",
                                                                         "t1"), "source": "configuration",
                                                          "configId": "cfg-1"}]})
        assert put.payload["results"][0]["status"] == "on_device"
        mirror = await read_mirror(out, lambda m: m["token"] == "second")
        assert mirror["pid"] == pid

        # a version whose health check fails is rejected and the running one stays
        rejected = await link.command("config.apply", mirror_version(out, "v2", healthy=False))
        assert rejected.ok and rejected.payload["status"] == "rejected"
        assert rejected.payload["rolledBackTo"] == "v1" and rejected.payload["files"] == []
        assert "health check failed" in rejected.payload["error"]
        assert (await link.next_event("config.result")).payload == rejected.payload

        # a process restart: the hello names the applied version and the workload comes back
        workload_pid = agent.workload.pid
        scope.cancel()
        await link.closed.wait()
    assert workload_pid is not None
    with trio.fail_after(10):
        while os.path.exists(f"/proc/{workload_pid}") and open(f"/proc/{workload_pid}/stat").read().split(") ")[1][0] != "Z":
            await trio.sleep(0.01)  # the agent stopped its workload when it stopped
        out.unlink()
        agent2 = Agent(AgentConfig(hub.url, "tok", tmp_path / "dev", **FAST))
        await start(nursery, agent2)
        link = await hub.next_link()
        assert link.hello.configVersionApplied == "v1"
        mirror = await read_mirror(out)
        assert mirror["token"] == "second" and mirror["pid"] != pid
        again = await link.command("config.apply", mirror_version(out))
        assert again.payload["status"] == "applied" and agent2.workload.pid == mirror["pid"]


async def test_an_in_process_reboot_restarts_the_workload(hub, nursery, tmp_path):
    out = tmp_path / "mirror.json"
    with trio.fail_after(20):
        agent = Agent(AgentConfig(hub.url, "tok", tmp_path / "dev", **FAST))
        await start(nursery, agent)
        link = await hub.next_link()
        assert (await link.command("config.apply", mirror_version(out))).payload["status"] == "applied"
        pid = (await read_mirror(out))["pid"]
        assert (await link.command("reboot")).ok
        link2 = await hub.next_link()
        assert link2.hello.bootReason == "reboot" and link2.hello.configVersionApplied == "v1"
        mirror = await read_mirror(out, lambda m: m["pid"] != pid)
        assert agent.workload.pid == mirror["pid"] and agent.boot_count == 2


async def test_drift_found_at_boot_is_reported_once_linked(hub, nursery, tmp_path):
    with trio.fail_after(10):
        scope = await start(nursery, Agent(AgentConfig(hub.url, "tok", tmp_path / "dev", **FAST)))
        link = await hub.next_link()
        reply = await link.command("files.put", {"files": [file_payload("/etc/a", b"a", "fa"),
                                                           file_payload("/etc/b", b"b", "fb"),
                                                           file_payload("/etc/c", b"c", "fc")]})
        assert [r["status"] for r in reply.payload["results"]] == ["on_device"] * 3
        scope.cancel()
        await link.closed.wait()
        root = tmp_path / "dev/root"
        os.chmod(root / "etc/a", 0o644)
        os.unlink(root / "etc/b")
        (root / "etc/c").write_bytes(b"tampered")

        await start(nursery, Agent(AgentConfig(hub.url, "tok", tmp_path / "dev", **FAST)))
        link = await hub.next_link()
        assert link.hello.secretFileDigests == {"/etc/a": hashlib.sha256(b"a").hexdigest(),
                                                "/etc/c": hashlib.sha256(b"tampered").hexdigest()}
        event = await link.next_event("files.result")
    assert event.payload == {"results": [
        {"fileId": "fa", "path": "/etc/a", "status": "on_device", "sha256": hashlib.sha256(b"a").hexdigest()},
        {"fileId": "fb", "path": "/etc/b", "status": "failed", "error": "missing on device"},
        {"fileId": "fc", "path": "/etc/c", "status": "failed", "error": "changed on device"}]}
    assert stat.S_IMODE(os.stat(root / "etc/a").st_mode) == 0o600
