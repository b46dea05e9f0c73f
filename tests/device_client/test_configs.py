"""config.apply on a device: real workload processes, real health checks, real files."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
from types import SimpleNamespace

import pytest
import trio

from device_client.commands import CommandError
from device_client.configs import ConfigManager
from device_client.files import SecretFileStore
from device_client.workload import Workload

PY = sys.executable

# records its pid, environment and the config file it was given; idles until stopped
APP = """
import json, os, sys, time
out = sys.argv[1]
config = json.load(open(os.environ["FLEETHUB_CONFIG_FILE"]))
json.dump({"pid": os.getpid(), "env": dict(os.environ), "config": config}, open(out + ".tmp", "w"))
os.replace(out + ".tmp", out)
while True:
    time.sleep(1)
"""


class StubDevice:
    """What the configuration manager uses of its DeviceContext (device_client/context.py): registration
    and events."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []
        self.handlers: dict = {}
        self.hello: list = []
        self.boot_hooks: list = []
        self.link_hooks: list = []
        self.shutdown_hooks: list = []
        self.linked = True

    def register(self, verb, handler):
        self.handlers[verb] = handler

    def add_hello_provider(self, provider):
        self.hello.append(provider)

    def add_boot_hook(self, hook):
        self.boot_hooks.append(hook)

    def add_link_hook(self, hook):
        self.link_hooks.append(hook)

    def add_shutdown_hook(self, hook):
        self.shutdown_hooks.append(hook)

    async def send_event(self, kind, payload):
        if not self.linked:
            return False
        self.events.append((kind, payload))
        return True


def make_device(tmp_path, device_id="dev-1"):
    data_dir = tmp_path / "dev"
    files = SecretFileStore(data_dir, data_dir / "root")
    workload = Workload(data_dir, data_dir / "root", stop_grace=0.5)
    configs = ConfigManager(data_dir, files, workload, device_id=lambda: device_id)
    agent = StubDevice()
    configs.attach(agent)
    return SimpleNamespace(data_dir=data_dir, files=files, workload=workload, configs=configs, agent=agent)


@pytest.fixture
async def device(nursery, tmp_path):
    d = make_device(tmp_path)
    await nursery.start(d.workload.run)
    return d


def file_payload(path: str, data: bytes, file_id: str, config_id: str) -> dict:
    return {"fileId": file_id, "path": path, "mode": 0o600, "uid": 0, "gid": 0,
            "contentB64": base64.b64encode(data).decode(), "sha256": hashlib.sha256(data).hexdigest(),
            "source": "configuration", "configId": config_id}


def version(tmp_path, version_id: str, *, healthy: bool = True, config_id: str = "cfg-1", files=(), n: int = 1,
            timeout: float = 2) -> dict:
    out = tmp_path / f"app-{version_id}.json"
    check = [PY, "-c", f"import sys; sys.exit({0 if healthy else 1})"]
    return {"configId": config_id, "versionId": version_id, "version": n,
            "spec": {"ports": [{"port": 8080}],
                     "workload": {"command": [PY, "-c", APP, str(out)], "env": {"VERSION": version_id},
                                  "healthCheck": {"command": check, "timeoutSeconds": timeout, "graceSeconds": 0.1}}},
            "files": list(files)}


async def seen(tmp_path, version_id: str) -> dict:
    path = tmp_path / f"app-{version_id}.json"
    with trio.fail_after(5):
        while not path.exists():
            await trio.sleep(0.01)
    return json.loads(path.read_text())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[1][0] != "Z"


async def test_a_healthy_version_is_applied_then_its_files_written(device, tmp_path):
    f = file_payload("/var/lib/fleethub/secrets/api-key", b"k1", "file-1", "cfg-1")
    with trio.fail_after(15):
        result = await device.configs.apply(version(tmp_path, "v1", files=[f]))
    assert result == {"status": "applied", "configId": "cfg-1", "versionId": "v1",
                      "files": [{"fileId": "file-1", "path": "/var/lib/fleethub/secrets/api-key", "status": "on_device",
                                 "sha256": hashlib.sha256(b"k1").hexdigest()}]}
    assert device.agent.events == [("config.result", result)]
    app = await seen(tmp_path, "v1")
    assert app["env"]["VERSION"] == "v1" and app["env"]["FLEETHUB_DEVICE_ID"] == "dev-1"
    assert app["env"]["FLEETHUB_CONFIG_FILE"] == str(device.data_dir / "configs" / "v1.json")
    # the version file is what the workload reads: the spec, never the files' contents
    assert app["config"] == {"configId": "cfg-1", "versionId": "v1", "version": 1,
                             "spec": version(tmp_path, "v1")["spec"]}
    assert b"k1" not in (device.data_dir / "configs" / "v1.json").read_bytes()
    current = json.loads((device.data_dir / "config-current.json").read_text())
    assert (current["versionId"], current["state"], current["previous"]) == ("v1", "applied", None)
    assert b"contentB64" not in (device.data_dir / "config-current.json").read_bytes()
    assert device.configs.version_applied() == "v1"
    assert {k: v for p in device.agent.hello for k, v in p().items()} == {"configVersionApplied": "v1"}
    assert (device.data_dir / "root/var/lib/fleethub/secrets/api-key").read_bytes() == b"k1"
    assert device.files.managed()["/var/lib/fleethub/secrets/api-key"]["configId"] == "cfg-1"
    assert device.workload.pid == app["pid"]


async def test_a_failing_health_check_rolls_back_and_writes_no_files(device, tmp_path):
    with trio.fail_after(20):
        await device.configs.apply(version(tmp_path, "v1"))
        v1_pid = (await seen(tmp_path, "v1"))["pid"]
        bad_file = file_payload("/etc/app/new-secret", b"n", "file-2", "cfg-1")
        result = await device.configs.apply(version(tmp_path, "v2", healthy=False, files=[bad_file], n=2))
        workload_log = result.pop("workloadLog")
        assert result == {"status": "rejected", "configId": "cfg-1", "versionId": "v2",
                          "error": "health check failed: not healthy within 2.1s: the health check exited with code 1",
                          "rolledBackTo": "v1", "files": []}
        assert "--- starting" in workload_log and "app-v2.json" in workload_log
        result["workloadLog"] = workload_log
        assert device.agent.events[-1] == ("config.result", result)
        v2 = await seen(tmp_path, "v2")  # it really ran...
        assert not alive(v2["pid"])  # ...and was stopped again
        (tmp_path / "app-v1.json").unlink()
        restored = await seen(tmp_path, "v1")  # the previous version runs again, from its own file
    assert restored["pid"] != v1_pid and not alive(v1_pid) and device.workload.pid == restored["pid"]
    assert restored["env"]["FLEETHUB_CONFIG_FILE"].endswith("/configs/v1.json")
    assert not (device.data_dir / "root/etc/app/new-secret").exists()
    assert device.files.digests() == {}
    current = json.loads((device.data_dir / "config-current.json").read_text())
    assert (current["versionId"], current["state"]) == ("v1", "applied")
    assert device.configs.version_applied() == "v1"


async def test_a_rejection_carries_the_checks_output_and_the_workload_log_bounded_and_visible(device, tmp_path):
    with trio.fail_after(20):
        await device.configs.apply(version(tmp_path, "v1"))
        await seen(tmp_path, "v1")
        secret = b"s3cret-" + os.urandom(8).hex().encode()
        v2 = version(tmp_path, "v2", n=2, files=[file_payload("/var/lib/fleethub/secrets/db", secret, "f", "cfg-1")])
        workload = v2["spec"]["workload"]
        workload["env"]["DB_PASSWORD"] = secret.decode()
        # far more than the bound, a colour code, a carriage return, a byte that is not UTF-8, then the reason
        noise = "".join(f"line {i} " + "x" * 60 + "\\n" for i in range(200))
        workload["healthCheck"]["command"] = [PY, "-c", (
            "import sys; w = sys.stdout.buffer.write; "
            f"w(b'{noise}'); w(b'\\x1b[31mred\\x1b[0m\\rover\\xff\\n'); w(b'db unreachable\\n'); sys.exit(1)")]
        result = await device.configs.apply(v2)
    assert result["status"] == "rejected" and result["rolledBackTo"] == "v1"
    assert result["error"].endswith("the health check exited with code 1: db unreachable")
    output = result["checkOutput"]
    assert output.endswith("\\x1b[31mred\\x1b[0m\\x0dover\ufffd\ndb unreachable")
    lines = output.split("\n")
    assert len(lines) == 20 and lines[0].startswith("line 182 ")  # whole lines: the last 20
    assert len(output) <= 2048  # the wire's bound
    assert result["workloadLog"].endswith("db unreachable")  # the log's end: the check's lines are in it
    # the check's output is in the workload log too, whole, as before
    assert "line 0 " in (device.data_dir / "workload.log").read_text(errors="replace")
    # nothing of ours that is secret: neither the environment nor the file
    assert secret.decode() not in json.dumps(result)


async def test_a_crashing_first_version_leaves_no_configuration(device, tmp_path):
    crash = {"configId": "c", "versionId": "v1", "version": 1, "files": [],
             "spec": {"workload": {"command": [PY, "-c", "raise SystemExit(4)"],
                                   "healthCheck": {"graceSeconds": 5}}}}
    with trio.fail_after(10):
        result = await device.configs.apply(crash)
    assert result["status"] == "rejected" and result["rolledBackTo"] is None
    assert result["error"] == "health check failed: the workload exited with code 4"
    assert not (device.data_dir / "config-current.json").exists()
    assert device.configs.version_applied() is None and not device.workload.running


async def test_applying_the_current_version_again_restarts_nothing(device, tmp_path):
    with trio.fail_after(15):
        await device.configs.apply(version(tmp_path, "v1"))
        pid = (await seen(tmp_path, "v1"))["pid"]
        added = file_payload("/etc/app/added-later", b"a", "file-3", "cfg-1")
        again = await device.configs.apply(version(tmp_path, "v1", files=[added]))
    assert again["status"] == "applied" and again["files"][0]["status"] == "on_device"
    assert device.workload.pid == pid and alive(pid)
    assert (device.data_dir / "root/etc/app/added-later").read_bytes() == b"a"


async def test_a_spec_the_device_cannot_run_is_rejected_without_a_restart(device, tmp_path):
    with trio.fail_after(15):
        await device.configs.apply(version(tmp_path, "v1"))
        pid = (await seen(tmp_path, "v1"))["pid"]
        result = await device.configs.apply({"configId": "cfg-1", "versionId": "v2", "version": 2,
                                             "spec": {"workload": {"command": "not a list"}}, "files": []})
    assert result["status"] == "rejected" and result["rolledBackTo"] == "v1"
    assert result["error"].startswith("invalid workload: workload.command")
    assert device.workload.pid == pid and device.configs.version_applied() == "v1"


async def test_a_spec_without_a_workload_is_applied_at_once(device, tmp_path):
    with trio.fail_after(5):
        result = await device.configs.apply({"configId": "c", "versionId": "v9", "version": 1,
                                             "spec": {"ports": [{"port": 80}]}, "files": []})
    assert result["status"] == "applied" and device.configs.version_applied() == "v9"
    assert not device.workload.running


@pytest.mark.parametrize("bad", [{}, {"configId": "c"}, {"configId": "c", "versionId": "../x", "spec": {}},
                                 {"configId": "c", "versionId": "v", "spec": []},
                                 {"configId": "c", "versionId": "v", "spec": {}, "files": {}},
                                 {"configId": "c", "versionId": "v", "version": "1", "spec": {}}])
async def test_malformed_payloads(device, bad):
    with pytest.raises(CommandError) as info:
        await device.configs.apply(bad)
    assert info.value.code == "invalid_payload"


async def test_no_version_is_applied_while_the_workload_is_held(device, tmp_path):
    with trio.fail_after(10):
        await device.configs.apply(version(tmp_path, "v1"))
        await device.workload.hold()
        with pytest.raises(CommandError) as info:
            await device.configs.apply(version(tmp_path, "v2"))
    assert info.value.code == "busy" and device.configs.version_applied() == "v1"


async def test_switching_configuration_removes_the_other_configurations_files(device, tmp_path):
    a = file_payload("/etc/a/only-a", b"a", "fa", "cfg-a")
    shared = file_payload("/etc/shared", b"from a", "fs", "cfg-a")
    with trio.fail_after(20):
        await device.configs.apply(version(tmp_path, "va", config_id="cfg-a", files=[a, shared]))
        await device.files.put([{**file_payload("/etc/mine", b"m", "fm", ""), "source": "device", "configId": None}])
        b = file_payload("/etc/shared", b"from b", "fs2", "cfg-b")
        result = await device.configs.apply(version(tmp_path, "vb", config_id="cfg-b", files=[b]))
    assert [(r["path"], r["status"]) for r in result["files"]] == [("/etc/shared", "on_device"),
                                                                   ("/etc/a/only-a", "removed")]
    assert set(device.files.digests()) == {"/etc/shared", "/etc/mine"}
    assert (device.data_dir / "root/etc/shared").read_bytes() == b"from b"


async def test_boot_starts_the_current_version_and_rolls_back_an_interrupted_one(nursery, tmp_path):
    first = make_device(tmp_path)
    with trio.fail_after(20):
        async with trio.open_nursery() as inner:
            await inner.start(first.workload.run)
            await first.configs.apply(version(tmp_path, "v1"))
            inner.cancel_scope.cancel()  # power off: the workload stops with the agent
        old_pid = (await seen(tmp_path, "v1"))["pid"]
        assert not alive(old_pid)
        # a power loss in the middle of applying v2: the record says it was still being verified
        current = json.loads((first.data_dir / "config-current.json").read_text())
        interrupted = {**current, "versionId": "v2", "state": "verifying", "previous": current}
        (first.data_dir / "config-current.json").write_text(json.dumps(interrupted))
        (tmp_path / "app-v1.json").unlink()

        booted = make_device(tmp_path)
        booted.agent.linked = False
        await nursery.start(booted.workload.run)
        assert booted.configs.version_applied() == "v1"  # never the unverified one
        await booted.configs.boot()
        app = await seen(tmp_path, "v1")
        assert app["env"]["FLEETHUB_DEVICE_ID"] == "dev-1" and booted.workload.pid == app["pid"]
        assert json.loads((first.data_dir / "config-current.json").read_text())["versionId"] == "v1"
        for hook in booted.agent.link_hooks:
            await hook()  # no link yet: kept for later
        booted.agent.linked = True
        for hook in booted.agent.link_hooks:
            await hook()
        for hook in booted.agent.link_hooks:
            await hook()  # sent once
    assert booted.agent.events == [("config.result", {
        "status": "rejected", "configId": "cfg-1", "versionId": "v2", "files": [], "rolledBackTo": "v1",
        "error": "the device restarted before the version's health was verified"})]


def test_registry_logins_are_checked_and_never_quoted():
    """config.apply's registryAuth: a malformed one is refused naming the registry, never the password;
    the request's repr (a log line, a traceback) leaves the logins out."""
    from device_client.commands import CommandError
    from device_client.configs import parse_apply, parse_registry_auth

    password = "pa55-never-shown"
    good = {"registry.example.com:5000": {"username": "puller", "password": password}}
    assert parse_registry_auth(good) == {"registry.example.com:5000": ("puller", password)}
    assert parse_registry_auth(None) == {}
    for bad in ({"registry.example.com": {"username": "a:b", "password": password}},
                {"registry.example.com": {"username": "puller", "password": password + "\n"}},
                {"registry.example.com": {"username": "puller", "password": password + "é"}},
                {"not a registry": {"username": "puller", "password": password}},
                {f"r{i}.example.com": {"username": "u", "password": password} for i in range(17)},
                ["registry.example.com"]):
        try:
            parse_registry_auth(bad)
        except CommandError as exc:
            assert exc.code == "invalid_payload" and password not in str(exc), exc
        else:
            raise AssertionError(f"accepted {list(bad)[:1]}")
    request = parse_apply({"configId": "c", "versionId": "v", "spec": {}, "registryAuth": good})
    assert request.registry_auth and password not in repr(request)
