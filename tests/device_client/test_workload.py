"""The workload: a real subprocess started, health-checked, stopped, held and supervised."""

from __future__ import annotations

import json
import os
import sys

import pytest
import trio

from device_client.workload import Workload
from device_client.workload_spec import Health, WorkloadSpec, parse_spec

PY = sys.executable

# writes its pid and environment, then idles; SIGTERM ends it
SLEEPER = """
import json, os, sys, time
out = sys.argv[1]
print("workload up", flush=True)  # before the file the test waits for: it may stop the workload at once
json.dump({"pid": os.getpid(), "env": dict(os.environ)}, open(out + ".tmp", "w"))
os.replace(out + ".tmp", out)
while True:
    time.sleep(1)
"""

STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
with open(sys.argv[1] + ".tmp", "w") as f:  # whole or absent: the test reads it as soon as it exists
    f.write(f"{os.getpid()} {child.pid}")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    time.sleep(1)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[1][0] != "Z"


async def wait_for_file(path, timeout: float = 5.0) -> str:
    with trio.fail_after(timeout):
        while not os.path.exists(path):
            await trio.sleep(0.01)
        return open(path).read()


def sleeper(out, **health) -> WorkloadSpec:
    spec = {"workload": {"command": [PY, "-c", SLEEPER, str(out)], "env": {"APP_MODE": "test"}}}
    if health:
        spec["workload"]["healthCheck"] = health
    return parse_spec(spec)


@pytest.fixture
async def workload(nursery, tmp_path):
    reports: list[Health] = []

    async def on_health(health: Health) -> None:
        reports.append(health)

    w = Workload(tmp_path / "dev", tmp_path / "dev" / "root", stop_grace=0.5, restart_backoff=(0.05, 0.2),
                 on_health=on_health)
    w.reports = reports
    await nursery.start(w.run)
    return w


def test_parse_spec():
    assert parse_spec({}) is None and parse_spec({"ports": [{"port": 80}]}) is None
    spec = parse_spec({"workload": {"command": ["app", "--serve"], "env": {"A": "1"},
                                    "healthCheck": {"command": ["check"], "timeoutSeconds": 3, "graceSeconds": 0.5}}})
    assert spec == WorkloadSpec(("app", "--serve"), {"A": "1"}, ("check",), 3.0, 0.5)
    assert parse_spec({"workload": {"command": ["app"]}}) == WorkloadSpec(("app",), {}, None, 10.0, 1.0)
    # a top-level healthCheck is read leniently: other tools may use that key their own way
    lenient = parse_spec({"workload": {"command": ["app"]}, "healthCheck": {"timeoutSeconds": 4, "path": "/h",
                                                                            "command": "curl localhost"}})
    assert (lenient.timeout, lenient.health_command) == (4.0, None)
    assert parse_spec({"workload": {"command": ["app"]}, "healthCheck": "http"}).timeout == 10.0
    for bad in ({"workload": "nginx"}, {"workload": {"command": []}}, {"workload": {"command": "app"}},
                {"workload": {"command": ["app", 1]}}, {"workload": {"command": [""]}},
                {"workload": {"command": ["a"], "env": {"A": 1}}}, {"workload": {"command": ["a"], "env": {"A=B": "1"}}},
                {"workload": {"command": ["a"], "healthCheck": {"timeoutSeconds": 0}}},
                {"workload": {"command": ["a"], "healthCheck": {"timeoutSeconds": "10"}}},
                {"workload": {"command": ["a"], "healthCheck": {"graceSeconds": -1}}},
                {"workload": {"command": ["a"], "healthCheck": {"command": []}}},
                {"workload": {"command": ["a"], "healthCheck": []}}):
        with pytest.raises(ValueError):
            parse_spec(bad)


async def test_no_workload_is_always_healthy(workload):
    with trio.fail_after(5):
        await workload.start(None)
        assert not workload.running and workload.pid is None
        assert await workload.check_health() == Health(True, "no workload configured")


async def test_start_stop_restart_with_the_platform_environment(workload, tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETHUB_DEVICE_TOKEN", "must-not-leak")
    out = tmp_path / "seen.json"
    with trio.fail_after(10):
        await workload.start(sleeper(out), {"FLEETHUB_CONFIG_FILE": "/cfg.json", "FLEETHUB_DEVICE_ID": "dev-9"})
        seen = json.loads(await wait_for_file(out))
        pid = seen["pid"]
        assert workload.running and workload.pid == pid and alive(pid)
        env = seen["env"]
        assert env["FLEETHUB_SECRETS_DIR"] == str(tmp_path / "dev/root/var/lib/fleethub/secrets")
        assert env["FLEETHUB_VOLUMES_DIR"] == str(tmp_path / "dev/root/var/lib/fleethub/volumes")
        assert (env["FLEETHUB_CONFIG_FILE"], env["FLEETHUB_DEVICE_ID"], env["APP_MODE"]) == ("/cfg.json", "dev-9", "test")
        assert "FLEETHUB_DEVICE_TOKEN" not in env and env["PATH"]
        # start() again is a no-op while it runs
        await workload.start()
        assert workload.pid == pid

        out.unlink()
        await workload.restart()
        new_pid = json.loads(await wait_for_file(out))["pid"]
        assert new_pid != pid and not alive(pid) and workload.pid == new_pid

        await workload.stop()
        assert not workload.running and not alive(new_pid)
    log = (tmp_path / "dev" / "workload.log").read_text()
    assert log.splitlines().count("workload up") == 2 and log.count("--- starting") == 2
    assert workload.reports == [] and workload.crashes == 0  # stops on purpose are not crashes


async def test_a_workload_ignoring_sigterm_is_killed_with_its_children(workload, tmp_path):
    out = tmp_path / "pids"
    with trio.fail_after(10):
        await workload.start(parse_spec({"workload": {"command": [PY, "-c", STUBBORN, str(out)]}}))
        pid, child = map(int, (await wait_for_file(out)).split())
        while not (await trio.to_thread.run_sync(lambda: alive(child))):
            await trio.sleep(0.01)
        t0 = trio.current_time()
        await workload.stop()
        assert trio.current_time() - t0 >= 0.45  # waited the grace for SIGTERM first
    assert not alive(pid)
    with trio.fail_after(5):
        while alive(child):  # SIGKILLed with its session; reaped by init
            await trio.sleep(0.01)


async def test_hold_keeps_it_stopped_until_released(workload, tmp_path):
    out = tmp_path / "seen.json"
    with trio.fail_after(10):
        await workload.start(sleeper(out))
        pid = json.loads(await wait_for_file(out))["pid"]
        await workload.hold()
        assert not alive(pid) and not workload.running and workload.held
        out.unlink()
        await workload.start()
        await workload.restart()
        await trio.sleep(0.3)  # longer than the restart backoff: nothing brings it back
        assert not out.exists() and not workload.running
        assert (await workload.check_health()) == Health(False, "the workload is held")
        await workload.release()
        new_pid = json.loads(await wait_for_file(out))["pid"]
        assert workload.pid == new_pid and not workload.held
    assert workload.reports == [] and workload.crashes == 0  # a hold is not a crash


async def test_release_after_a_stop_does_not_start_it(workload, tmp_path):
    with trio.fail_after(10):
        await workload.start(sleeper(tmp_path / "seen.json"))
        await workload.hold()
        await workload.stop()
        await workload.release()
        assert not workload.running


async def test_health_check_command_pass_fail_and_timeout(workload, tmp_path):
    out = tmp_path / "seen.json"
    with trio.fail_after(20):
        await workload.start(sleeper(out, command=[PY, "-c", "import os, sys; sys.exit(0 if os.environ['APP_MODE'] == 'test' else 1)"],
                                     graceSeconds=0.2))
        t0 = trio.current_time()
        assert await workload.check_health() == Health(True, "running; the health check passed")
        assert trio.current_time() - t0 >= 0.15  # waited out the grace first
        assert await workload.is_healthy()

        await workload.restart(sleeper(out, command=[PY, "-c", "import sys; sys.exit(3)"], graceSeconds=0))
        assert await workload.check_health() == Health(False, "the health check exited with code 3")

        await workload.restart(sleeper(out, command=[PY, "-c", "import time; time.sleep(30)"],
                                       timeoutSeconds=0.3, graceSeconds=0))
        t0 = trio.current_time()
        assert await workload.check_health() == Health(False, "the health check did not finish within 0.3s")
        assert trio.current_time() - t0 < 2

        await workload.restart(sleeper(out, command=["/nonexistent/check"], graceSeconds=0))
        health = await workload.check_health()
        assert not health.healthy and "could not start" in health.detail


async def test_a_crashing_workload_is_unhealthy_reported_and_restarted(workload, tmp_path):
    counter = tmp_path / "starts"
    crash = f"open({str(counter)!r}, 'a').write('x'); import sys; sys.exit(1)"
    with trio.fail_after(10):
        await workload.start(parse_spec({"workload": {"command": [PY, "-c", crash],
                                                      "healthCheck": {"graceSeconds": 5}}}))
        health = await workload.check_health()
        assert health == Health(False, "the workload exited with code 1")
        while len(workload.reports) < 2 or not counter.exists() or len(counter.read_text()) < 3:
            await trio.sleep(0.01)
        assert workload.reports[0] == Health(False, "the workload exited with code 1")
        assert workload.crashes >= 2
        await workload.stop()
        n = len(counter.read_text())
        await trio.sleep(0.4)
        assert len(counter.read_text()) == n  # a stopped workload is not restarted


async def test_a_command_that_cannot_start(workload):
    with trio.fail_after(5):
        await workload.start(parse_spec({"workload": {"command": ["/nonexistent/app"]}}))
        assert not workload.running
        health = await workload.check_health()
        assert not health.healthy and "could not start" in health.detail and "No such file" in health.detail


async def test_wait_healthy_retries_until_the_deadline(workload, tmp_path):
    ready = tmp_path / "ready"
    becomes_ready = f"import time, pathlib; time.sleep(0.3); pathlib.Path({str(ready)!r}).touch(); time.sleep(300)"
    check = [PY, "-c", f"import os, sys; sys.exit(0 if os.path.exists({str(ready)!r}) else 1)"]
    with trio.fail_after(15):
        await workload.start(parse_spec({"workload": {"command": [PY, "-c", becomes_ready],
                                                      "healthCheck": {"command": check, "graceSeconds": 0}}}))
        assert (await workload.wait_healthy(5)).healthy
        ready.unlink()
        await workload.restart(parse_spec({"workload": {"command": [PY, "-c", "import time; time.sleep(300)"],
                                                        "healthCheck": {"command": check, "graceSeconds": 0}}}))
        t0 = trio.current_time()
        health = await workload.wait_healthy(0.5)
        assert not health.healthy and health.detail.startswith("not healthy within 0.5s")
        assert trio.current_time() - t0 < 2
        # a process that dies is not waited for until the deadline
        await workload.restart(parse_spec({"workload": {"command": [PY, "-c", "raise SystemExit(2)"],
                                                        "healthCheck": {"graceSeconds": 5}}}))
        t0 = trio.current_time()
        assert await workload.wait_healthy(10) == Health(False, "the workload exited with code 2")
        assert trio.current_time() - t0 < 4  # the exit ends the wait, not the 5 s grace


async def test_a_deadline_before_any_check_completed_still_gives_the_checks_verdict(workload):
    """Why: on a loaded device starting the health command can take longer than the deadline; the verdict
    then named no check at all. A check that has not completed once is run to its end."""
    check = [PY, "-c", "import sys, time; time.sleep(0.4); print('not ready'); sys.exit(3)"]
    with trio.fail_after(15):
        await workload.start(parse_spec({"workload": {"command": [PY, "-c", "import time; time.sleep(300)"],
                                                      "healthCheck": {"command": check, "graceSeconds": 0,
                                                                      "timeoutSeconds": 5}}}))
        health = await workload.wait_healthy(0.1)  # shorter than one check
        assert not health.healthy and health.detail.startswith("not healthy within 0.1s: "), health
        assert "3" in health.detail and "not ready" in (health.output or ""), health


async def test_the_workload_stops_when_its_supervisor_stops(tmp_path):
    out = tmp_path / "seen.json"
    w = Workload(tmp_path / "dev", tmp_path / "dev" / "root", stop_grace=0.5)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            await w.start(sleeper(out))
            pid = json.loads(await wait_for_file(out))["pid"]
            nursery.cancel_scope.cancel()
    assert not alive(pid) and not w.running
