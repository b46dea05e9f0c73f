"""ContainerSet over the fake engine (no podman): the switch, the rollback, boot recovery, the image
budget, and the device's own check of the spec. tests/device_client/test_containers_podman.py runs
the same paths with podman."""

from __future__ import annotations

import pytest
import trio

from device_client.containers import LABEL_MANAGED, ContainerSet, engine_name, parse_containers
from device_client.engine.fake import FakeEngine

D1, D2, D3 = ("sha256:" + c * 64 for c in "123")


def image(digest: str) -> str:
    return f"registry.example:5000/app/web@{digest}"


def spec(*containers: dict) -> list:
    return parse_containers({"containers": list(containers)})


def web(name: str, digest: str, port: int, **extra) -> dict:
    return {"name": name, "image": image(digest), "ports": [{"port": port}],
            "healthCheck": {"http": {"port": port}, "timeoutSeconds": 1, "graceSeconds": 0.1}, **extra}


async def running(engine: FakeEngine) -> dict[str, bool]:
    return {c.name: c.running for c in await engine.containers(LABEL_MANAGED)}


async def test_switch_after_health_and_roll_back_on_failure(tmp_path, autojump_clock):
    engine = FakeEngine()
    events = []

    async def on_event(kind, payload):
        events.append(kind)

    cs = ContainerSet(engine, tmp_path / "root", on_event=on_event)
    health, _ = await cs.apply("v1", spec(web("web", D1, 8080), web("db", D1, 5432)))
    assert health.healthy and events == ["container.pulled"] * 2
    assert await running(engine) == {engine_name("v1", "web"): True, engine_name("v1", "db"): True}

    engine.unhealthy[D2] = "boom"
    health, _ = await cs.apply("v2", spec(web("web", D2, 8080), web("db", D1, 5432)))
    assert not health.healthy and "answered 500" in health.detail
    # both v1 containers run again: web was stopped for its port and restarted, db shared its port too
    assert await running(engine) == {engine_name("v1", "web"): True, engine_name("v1", "db"): True}

    # a v2 container on a new port: v1's other containers keep running while v2 is checked
    engine.exits[D3] = 1
    health, _ = await cs.apply("v3", spec(web("web", D3, 9090)))
    assert not health.healthy and "exited with code 1" in health.detail
    assert await running(engine) == {engine_name("v1", "web"): True, engine_name("v1", "db"): True}

    engine.fail_pull[D3] = "manifest unknown"
    health, _ = await cs.apply("v3", spec(web("web", D3, 9090)))
    assert not health.healthy and "manifest unknown" in health.detail

    health, _ = await cs.apply("v4", spec(web("web", D1, 8080)))
    assert health.healthy
    assert await running(engine) == {engine_name("v4", "web"): True}


async def test_an_exec_check_that_fails_reports_its_output(tmp_path, autojump_clock):
    engine = FakeEngine(unhealthy={D1: "database not reachable"})
    cs = ContainerSet(engine, tmp_path / "root")
    check = {"command": ["/bin/check"], "timeoutSeconds": 2, "graceSeconds": 0}
    health, _ = await cs.apply("v1", spec({"name": "app", "image": image(D1), "healthCheck": check}))
    assert not health.healthy and health.output == "database not reachable"
    assert "not healthy within 2s" in health.detail and await running(engine) == {}


async def test_a_check_the_engine_is_slower_to_start_than_the_deadline_still_gives_the_verdict(tmp_path,
                                                                                               autojump_clock):
    """Why: under a full test suite `podman exec` took longer than a 2.2 s deadline, and the version was
    rolled back as "not healthy within 2.2s" with no check completed. A verdict needs a check that ran."""
    engine = FakeEngine(unhealthy={D1: "not ready"}, exec_seconds=3)
    cs = ContainerSet(engine, tmp_path / "root")
    check = {"command": ["/bin/check"], "timeoutSeconds": 2, "graceSeconds": 0.2}
    health, _ = await cs.apply("v1", spec({"name": "app", "image": image(D1), "healthCheck": check}))
    assert not health.healthy and health.output == "not ready", health
    assert "not healthy within 2.2s" in health.detail and "exited with code 1" in health.detail
    health, _ = await cs.apply("v2", spec({"name": "app", "image": image(D2), "healthCheck": check}))
    assert health.healthy, health  # a slow engine does not fail a good version
    assert await running(engine) == {engine_name("v2", "app"): True}


async def test_boot_keeps_only_the_wanted_version_and_starts_it(tmp_path, autojump_clock):
    """A power loss mid-apply leaves both versions' containers; the record rolled back to v1 decides."""
    engine = FakeEngine()
    cs = ContainerSet(engine, tmp_path / "root")
    v1 = spec(web("web", D1, 8080))
    assert (await cs.apply("v1", v1))[0].healthy
    await engine.pull(image(D2))
    for s in spec(web("web", D2, 8081)):
        await engine.create(cs._run_spec("v2", s))
        await engine.start(engine_name("v2", "web"))
    await engine.stop(engine_name("v1", "web"), 1)
    await cs.reconcile("v1", v1)
    assert await running(engine) == {engine_name("v1", "web"): True}
    # the device's engine lost everything (a new disk): the containers are made again
    await engine.remove(engine_name("v1", "web"))
    await cs.reconcile("v1", v1)
    assert await running(engine) == {engine_name("v1", "web"): True}
    await cs.reconcile(None, [])
    assert await running(engine) == {}


async def test_unused_images_are_pruned_oldest_first_past_the_budget(tmp_path, autojump_clock):
    engine = FakeEngine(image_size=100)
    cs = ContainerSet(engine, tmp_path / "root", image_budget=250)
    for i, digest in enumerate((D1, D2, D3)):
        await engine.pull(image(digest))
        await trio.sleep(1)
    assert (await cs.apply("v1", spec(web("web", D3, 8080))))[0].healthy  # prunes after the switch
    assert {i.digests[0] for i in await engine.images()} == {D2, D3}  # 300 > 250: the oldest unused goes
    cs.image_budget = 0
    await cs.prune()
    assert {i.digests[0] for i in await engine.images()} == {D3}  # in use: never pruned


@pytest.mark.parametrize("containers, problem", [
    ([{"name": "web", "image": "registry.example/app:1"}], "pinned by digest"),
    ([{"name": "web", "image": "registry.example/app\0@" + D1}], "control characters"),
    ([{"name": "web", "image": "x" * 600}], "at most 512"),
    ([{"name": "Web", "image": image(D1)}], "name"),
    ([{"name": "web", "image": image(D1), "env": {"A": "1\n2"}}], "one-line"),
    ([{"name": "web", "image": image(D1), "volumes": [{"name": "../etc", "mountPath": "/x"}]}], "plain directory"),
    ([{"name": "web", "image": image(D1), "volumes": [{"name": "d", "mountPath": "/a/../b"}]}], "mountPath"),
    ([{"name": "web", "image": image(D1), "resources": {"memoryMiB": 10 ** 12}}], "memoryMiB"),
    ([{"name": "web", "image": image(D1), "restartPolicy": "sometimes"}], "restartPolicy"),
    ([web("a", D1, 80), web("b", D1, 80)], "same port"),
    ([{"name": "a", "image": image(D1)}] * 2, "same name"),
    ([{"name": f"c{i}", "image": image(D1)} for i in range(17)], "at most 16"),
])
def test_the_device_checks_the_spec_again(containers, problem):
    with pytest.raises(ValueError, match=problem):
        parse_containers({"containers": containers})


# ---- through config.apply (configs.py), as the hub sends a version ----

def make_configs(tmp_path, engine: FakeEngine | None):
    from device_client.configs import ConfigManager
    from device_client.files import SecretFileStore
    from device_client.workload import Workload
    from tests.device_client.test_configs import StubDevice

    data_dir = tmp_path / "dev"
    root = data_dir / "root"
    cs = ContainerSet(engine, root, stop_grace=0.1) if engine is not None else None
    configs = ConfigManager(data_dir, SecretFileStore(data_dir, root), Workload(data_dir, root),
                            device_id=lambda: "dev-1", containers=cs)
    configs.attach(StubDevice())
    return configs


def payload(version_id: str, *containers: dict) -> dict:
    return {"configId": "cfg-1", "versionId": version_id, "version": 1, "spec": {"containers": list(containers)},
            "files": []}


async def test_a_rejected_container_version_says_why_and_the_device_keeps_the_old(tmp_path, autojump_clock):
    engine = FakeEngine(unhealthy={D2: "no database"})
    configs = make_configs(tmp_path, engine)
    assert (await configs.apply(payload("v1", web("web", D1, 8080))))["status"] == "applied"
    check = {"command": ["/bin/check"], "timeoutSeconds": 1, "graceSeconds": 0}
    result = await configs.apply(payload("v2", {"name": "web", "image": image(D2), "healthCheck": check}))
    assert result["status"] == "rejected" and result["rolledBackTo"] == "v1"
    assert result["error"].startswith("health check failed: not healthy within 1s: container web: the health check "
                                      "exited with code 1") and result["checkOutput"] == "no database"
    assert configs.version_applied() == "v1"
    assert await running(engine) == {engine_name("v1", "web"): True}


async def test_a_device_without_an_engine_rejects_containers_clearly(tmp_path):
    configs = make_configs(tmp_path, None)
    with trio.fail_after(10):
        result = await configs.apply(payload("v1", web("web", D1, 8080)))
    assert result["status"] == "rejected" and "no container engine" in result["error"]


async def test_a_power_loss_mid_apply_comes_back_to_the_old_containers(tmp_path, autojump_clock):
    """What the disk holds when the power goes during v2's health check: the record says verifying,
    v2's containers exist beside v1's, v1's web was stopped for its port. The next boot rolls back."""
    engine = FakeEngine()
    configs = make_configs(tmp_path, engine)
    assert (await configs.apply(payload("v1", web("web", D1, 8080))))["status"] == "applied"
    cs = configs.containers
    await engine.pull(image(D2))
    await engine.create(cs._run_spec("v2", spec(web("web", D2, 8080))[0]))
    await engine.stop(engine_name("v1", "web"), 0)
    await engine.start(engine_name("v2", "web"))
    record = {**configs.current, "versionId": "v2", "state": "verifying", "previous": configs.current,
              "spec": payload("v2", web("web", D2, 8080))["spec"]}
    configs._save_current(record)

    rebooted = make_configs(tmp_path, engine)
    await rebooted.boot()
    assert rebooted.version_applied() == "v1"
    assert await running(engine) == {engine_name("v1", "web"): True}
    assert rebooted._boot_report["status"] == "rejected" and rebooted._boot_report["rolledBackTo"] == "v1"


async def test_a_volume_that_is_a_symlink_is_refused_and_nothing_is_left(tmp_path, autojump_clock):
    """The workload's account may own the volumes directory: a volume swapped for a link to elsewhere
    must not become a mount of elsewhere."""
    engine = FakeEngine()
    root = tmp_path / "root"
    volumes = root / "var/lib/fleethub/volumes"
    volumes.mkdir(parents=True)
    (volumes / "data").symlink_to(tmp_path)
    cs = ContainerSet(engine, root)
    health, _ = await cs.apply("v1", spec({**web("web", D1, 8080), "volumes": [{"name": "data", "mountPath": "/d"}]}))
    assert not health.healthy and "mount cannot be made" in health.detail
    assert await running(engine) == {}


def test_fleethub_agent_containers_flags(tmp_path):
    from device_client.agent_cli import build_agent
    from device_client.engine.podman import Podman
    from hub import cli
    from webrtc.device_tunnel import attach

    base = ["agent", "--hub", "http://127.0.0.1:9", "--token", "t", "--data-dir", str(tmp_path / "agent")]
    agent = build_agent(cli.build_parser().parse_args(base), attach)
    assert agent.containers is None and agent.configs.containers is None
    conf = tmp_path / "containers.conf"
    args = cli.build_parser().parse_args(base + ["--containers", "podman", "--containers-conf", str(conf),
                                                 "--image-budget-mib", "100"])
    agent = build_agent(args, attach)
    engine = agent.containers.engine
    assert isinstance(engine, Podman) and agent.configs.containers is agent.containers
    assert engine.environment()["CONTAINERS_CONF"] == str(conf) and engine.scratch == tmp_path / "agent"
    assert agent.containers.image_budget == 100 << 20


async def test_a_container_that_stops_after_the_switch_is_reported_and_so_is_its_return(nursery, tmp_path,
                                                                                         autojump_clock):
    engine = FakeEngine()
    cs = ContainerSet(engine, tmp_path / "root")
    said = []

    async def on_health(health):
        said.append((health.healthy, health.detail))

    assert (await cs.apply("v1", spec(web("web", D1, 8080), web("db", D1, 5432))))[0].healthy
    nursery.start_soon(lambda: cs.watch(on_health, interval=1))
    await trio.sleep(3)
    assert said == []  # healthy since the apply: nothing new to say
    await engine.stop(engine_name("v1", "db"), 0)
    await trio.sleep(1.5)
    assert said == [(False, "containers not running: db (exited with code 143)")]
    await engine.start(engine_name("v1", "db"))
    await trio.sleep(1.5)
    assert said[1:] == [(True, "2 container(s) running")]
    await engine.remove(engine_name("v1", "web"))
    await trio.sleep(1.5)
    assert said[2:] == [(False, "containers not running: web (missing)")]


async def test_a_pull_reports_its_progress_before_it_ends(tmp_path, autojump_clock):
    engine = FakeEngine(image_size=8 << 20, pull_seconds=4.0)
    events = []

    async def on_event(kind, payload):
        events.append((kind, payload))

    cs = ContainerSet(engine, tmp_path / "root", on_event=on_event)
    health, _ = await cs.apply("v1", spec(web("web", D1, 8080)))
    assert health.healthy
    assert [kind for kind, _ in events] == ["container.pull_progress", "container.pulled"]
    progress = events[0][1]
    assert progress["container"] == "web" and progress["image"] == image(D1)
    # seconds are the device's own (time.monotonic, not the test's virtual clock): only their use is checked
    assert progress["bytes"] == 4 << 20 and progress["seconds"] > 0
    assert progress["rateBps"] == pytest.approx(progress["bytes"] / progress["seconds"], rel=0.01)


def job(name: str, digest: str, **extra) -> dict:
    return {"name": name, "image": image(digest), "kind": "job", "healthCheck": {"timeoutSeconds": 5}, **extra}


async def test_a_job_runs_to_completion_and_its_exit_code_is_the_verdict(tmp_path, autojump_clock):
    """A job (kind "job") beside a service: exit 0 within its timeout passes the version; a non-zero
    exit or a job still running at its timeout rejects it and the old containers run again. A job that
    finished is not reported down, and a boot does not run it again."""
    engine = FakeEngine(exits={D2: 0})
    healths = []
    cs = ContainerSet(engine, tmp_path / "root")
    health, _ = await cs.apply("v1", spec(web("web", D1, 8080), job("migrate", D2)))
    assert health.healthy, health
    found = {c.name: (c.running, c.exit_code) for c in await engine.containers(LABEL_MANAGED)}
    assert found == {engine_name("v1", "web"): (True, None), engine_name("v1", "migrate"): (False, 0)}
    assert cs.running_version == ("v1", ("web",))

    engine.exits[D3] = 3
    health, failed = await cs.apply("v2", spec(web("web", D1, 8080), job("migrate", D3)))
    assert not health.healthy and "job migrate exited with code 3" in health.detail
    assert await running(engine) == {engine_name("v1", "web"): True, engine_name("v1", "migrate"): False}

    del engine.exits[D3]  # runs on past its timeout
    health, _ = await cs.apply("v2", spec(web("web", D1, 8080), job("migrate", D3)))
    assert not health.healthy and "job migrate is still running" in health.detail
    assert engine_name("v2", "migrate") not in await running(engine)

    async def on_health(h):
        healths.append(h)

    with trio.move_on_after(65):
        await cs.watch(on_health, interval=30)
    assert healths == []  # the finished job is not a container down

    engine.exits[D2] = 5  # were the job started again, it would exit 5 now
    await cs.reconcile("v1", spec(web("web", D1, 8080), job("migrate", D2)))
    found = {c.name: (c.running, c.exit_code) for c in await engine.containers(LABEL_MANAGED)}
    assert found[engine_name("v1", "migrate")] == (False, 0), "a boot ran the job again"


@pytest.mark.parametrize("extra", [{"ports": [{"port": 80}]}, {"restartPolicy": "always"},
                                   {"healthCheck": {"command": ["/bin/true"]}}, {"kind": "cron"}])
def test_a_job_has_no_ports_checks_or_restarts(extra):
    with pytest.raises(ValueError, match="job|kind"):
        spec({**job("migrate", D1), **extra})
