"""The agent against a real WebSocket server on 127.0.0.1 playing the hub.

These tests use real sockets, so they run on trio's real clock with short intervals: under
autojump_clock a task blocked on a socket counts as idle and the clock would jump past the agent's
connect and handshake timeouts.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import functools
import json
import os
import stat
import subprocess
import sys

import pytest
import trio
from nacl.signing import SigningKey

from device_client import agent as agent_mod
from device_client.shared import protocol
from device_client.agent import Agent, AgentConfig, CommandError, link_url
from device_client.shared.clock import TestClock
from device_client.state import StateFile

from device_fakehub import FakeHub
from tests.ports import free_port

FAST = dict(backoff_initial=0.01, backoff_max=0.04)


def parse(rfc3339: str) -> dt.datetime:
    return dt.datetime.fromisoformat(rfc3339.replace("Z", "+00:00"))


@pytest.fixture
async def hub(nursery):
    return await nursery.start(FakeHub().serve)


def make_agent(hub: FakeHub, data_dir, **kw) -> Agent:
    return Agent(AgentConfig(hub.url, kw.pop("token", "tok"), data_dir, **{**FAST, **kw}))


async def start(nursery, agent: Agent) -> trio.CancelScope:
    """Start an agent in its own cancel scope, so a test can stop it like a process exit."""
    scope = trio.CancelScope()

    async def run(task_status):
        with scope:
            await agent.run(task_status=task_status)

    await nursery.start(run)
    return scope


async def test_hello_on_first_start(hub, nursery, tmp_path):
    with trio.fail_after(5):
        clock = TestClock()
        agent = make_agent(hub, tmp_path / "dev", token="s3cret", clock=clock,
                           facts={"firmware": "fw-1.2.3", "architecture": "armv7l"})
        await start(nursery, agent)
        link = await hub.next_link()
        hello = link.hello
        assert link.authorization == "Bearer s3cret"
        assert hello.firmware == "fw-1.2.3" and hello.architecture == "armv7l"
        assert hello.bootReason == "power_on"
        assert hello.capabilities.reboot is True
        assert hello.capabilities.memoryTest.online is True  # device_client/memtest
        assert hello.capabilities.memoryTest.offline is True
        assert hello.capabilities.memoryTest.offlineReason is None
        # the device clock comes from the injected clock, never from the OS
        assert hello.deviceClock.endswith("Z")
        assert abs(parse(hello.deviceClock) - clock.now()) < dt.timedelta(seconds=1)
        key = (tmp_path / "dev" / "identity.key").read_bytes()
        assert hello.tunnelPublicKey == base64.b64encode(bytes(SigningKey(key).verify_key)).decode()
        assert hello.protocol == protocol.PROTOCOL_VERSION
        assert agent.device_id == "dev-1" and agent.connected and agent.boot_count == 1
        assert (tmp_path / "dev" / "root").is_dir()
        state = json.loads((tmp_path / "dev" / "state.json").read_text())
        assert state == {"bootCount": 1}


async def test_default_architecture_is_the_machine(hub, nursery, tmp_path):
    import platform

    with trio.fail_after(5):
        await start(nursery, make_agent(hub, tmp_path / "dev"))
        link = await hub.next_link()
        assert link.hello.architecture == platform.machine()
        assert link.hello.firmware


async def test_ping_unknown_verb_and_failing_handlers(hub, nursery, tmp_path):
    with trio.fail_after(5):
        clock = TestClock()
        agent = make_agent(hub, tmp_path / "dev", clock=clock)

        async def broken(payload):
            raise RuntimeError("disk on fire")

        async def refuses(payload):
            raise CommandError("busy", "a memory test is running")

        agent.context.register("broken", broken)
        agent.context.register("refuses", refuses)
        with pytest.raises(ValueError):
            agent.context.register("ping", broken)
        agent.context.register("refuses", refuses, replace=True)
        await start(nursery, agent)
        link = await hub.next_link()

        pong = await link.command("ping")
        assert pong.ok and pong.payload["pong"] is True
        assert abs(parse(pong.payload["deviceClock"]) - clock.now()) < dt.timedelta(seconds=1)

        unknown = await link.command("self_destruct")
        assert not unknown.ok and unknown.error.code == "unknown_command"
        assert "self_destruct" in unknown.error.message

        failed = await link.command("broken")
        assert not failed.ok and failed.error.code == "internal"
        assert "disk on fire" in failed.error.message

        refused = await link.command("refuses")
        assert (refused.ok, refused.error.code, refused.error.message) == (False, "busy", "a memory test is running")

        # a command addressed to another device is a hub routing bug, not something to run
        await link.ws.send_message(protocol.encode(protocol.Command(id="w", subject="cmd.other.ping")))
        wrong = await link.next_reply("w")
        assert not wrong.ok and wrong.error.code == "wrong_device"

        # the link survives all of that
        assert (await link.command("ping")).ok
        assert agent.statistics().links == 1


async def test_repeated_command_id_gets_the_stored_reply(hub, nursery, tmp_path):
    with trio.fail_after(5):
        agent = make_agent(hub, tmp_path / "dev")
        runs = []
        release = trio.Event()

        async def count(payload):
            runs.append(payload["n"])
            return {"runs": len(runs)}

        async def slow(payload):
            runs.append("slow")
            await release.wait()
            return {"slow": True}

        agent.context.register("count", count)
        agent.context.register("slow", slow)
        await start(nursery, agent)
        link = await hub.next_link()

        first = await link.command("count", {"n": 1}, id="same")
        again = await link.command("count", {"n": 2}, id="same")
        assert first == again and first.payload == {"runs": 1}
        assert runs == [1]

        # a duplicate that arrives while the first is still running waits for its reply
        await link.send_command("slow", id="s")
        await link.send_command("slow", id="s")
        await trio.sleep(0.05)
        release.set()
        replies = [await link.next_reply("s"), await link.next_reply("s")]
        assert replies[0] == replies[1] and replies[0].payload == {"slow": True}
        assert runs == [1, "slow"]
        assert agent.statistics().duplicate_commands == 2


async def test_reboot_reconnects_with_boot_reason_reboot(hub, nursery, tmp_path):
    with trio.fail_after(10):
        agent = make_agent(hub, tmp_path / "dev")
        scope = await start(nursery, agent)
        link = await hub.next_link()
        key = link.hello.tunnelPublicKey

        reply = await link.command("reboot", id="r1")
        assert reply.ok and reply.payload == {"rebooting": True}
        await link.closed.wait()
        rebooted_at = trio.current_time()

        link2 = await hub.next_link()
        assert trio.current_time() - rebooted_at >= agent_mod.REBOOT_PAUSE * 0.9
        assert link2.hello.bootReason == "reboot"
        assert link2.hello.tunnelPublicKey == key
        assert agent.boot_count == 2

        # the hub resending the same reboot command must not reboot the device again
        again = await link2.command("reboot", id="r1")
        assert again == reply
        assert (await link2.command("ping")).ok
        assert not link2.closed.is_set() and agent.boot_count == 2

        # a process restart after that is a power loss again, with the same identity
        scope.cancel()
        await link2.closed.wait()
        agent3 = make_agent(hub, tmp_path / "dev")
        await start(nursery, agent3)
        link3 = await hub.next_link()
        assert link3.hello.bootReason == "power_on"
        assert link3.hello.tunnelPublicKey == key
        assert agent3.boot_count == 3


async def test_reboot_reason_from_payload(hub, nursery, tmp_path):
    with trio.fail_after(5):
        await start(nursery, make_agent(hub, tmp_path / "dev"))
        link = await hub.next_link()
        bad = await link.command("reboot", {"reason": "../etc"})
        assert not bad.ok and bad.error.code == "invalid_payload"
        assert (await link.command("reboot", {"reason": "memory_test"})).ok
        link2 = await hub.next_link()
        assert link2.hello.bootReason == "memory_test"


async def test_reboot_in_exec_mode_persists_then_execs(hub, nursery, tmp_path, monkeypatch):
    class Execed(Exception):
        pass

    calls = []

    def fake_execv(path, argv):
        calls.append((path, argv))
        raise Execed

    monkeypatch.setattr(agent_mod.os, "execv", fake_execv)
    with trio.fail_after(5):
        agent = make_agent(hub, tmp_path / "dev", reboot_mode="exec")
        try:
            async with trio.open_nursery() as inner:
                await inner.start(agent.run)
                link = await hub.next_link()
                assert (await link.command("reboot")).ok
                await link.closed.wait()
        except* Execed:
            pass
        assert calls and calls[0][0] == agent_mod.sys.executable
        state = json.loads((tmp_path / "dev" / "state.json").read_text())
        assert state["pendingBootReason"] == "reboot"
        # the re-executed process
        await start(nursery, make_agent(hub, tmp_path / "dev"))
        assert (await hub.next_link()).hello.bootReason == "reboot"


async def test_reconnects_after_the_hub_drops_the_link(hub, nursery, tmp_path):
    with trio.fail_after(5):
        agent = make_agent(hub, tmp_path / "dev")
        await start(nursery, agent)
        link = await hub.next_link()
        await link.ws.aclose()
        link2 = await hub.next_link()
        # same boot, so the same boot reason; the link is new
        assert link2.hello.bootReason == "power_on" and agent.boot_count == 1
        await agent.wait_connected()
        stats = agent.statistics()
        assert stats.links == 2 and stats.link_failures == 1 and stats.connected
        assert (await link2.command("ping")).ok


async def test_unreachable_hub_backs_off(nursery, tmp_path):
    with trio.fail_after(5):
        port = free_port()  # nothing listens there: connection refused
        agent = Agent(AgentConfig(f"http://127.0.0.1:{port}", "tok", tmp_path / "dev", **FAST))
        nursery.start_soon(agent.run)
        while agent.statistics().link_failures < 3:
            await trio.sleep(0.005)
        assert "HandshakeError" in agent.statistics().last_error


async def test_send_event_and_hello_providers(hub, nursery, tmp_path):
    with trio.fail_after(5):
        agent = make_agent(hub, tmp_path / "dev")
        assert await agent.send_event("health", {"ok": True}) is False  # no link yet
        agent.context.add_hello_provider(lambda: {"secretFileDigests": {"/etc/x": "ab" * 32}, "retiredPages": [7]})
        await start(nursery, agent)
        link = await hub.next_link()
        assert link.hello.secretFileDigests == {"/etc/x": "ab" * 32} and link.hello.retiredPages == [7]
        assert await agent.send_event("health", {"ok": True}) is True
        assert (await link.next_event("health")).payload == {"ok": True}


async def test_identity_key_is_0600_and_reused(hub, nursery, tmp_path):
    with trio.fail_after(5):
        first = make_agent(hub, tmp_path / "dev")
        scope = await start(nursery, first)
        key1 = (await hub.next_link()).hello.tunnelPublicKey
        path = tmp_path / "dev" / "identity.key"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE((tmp_path / "dev").stat().st_mode) == 0o700
        scope.cancel()
        second = make_agent(hub, tmp_path / "dev")
        await start(nursery, second)
        assert (await hub.next_link()).hello.tunnelPublicKey == key1 == first.public_key_b64


def test_link_url():
    assert link_url("http://127.0.0.1:8080") == "ws://127.0.0.1:8080/v1/device/link"
    assert link_url("https://hub.example/") == "wss://hub.example/v1/device/link"
    with pytest.raises(ValueError):
        link_url("ftp://x")
    with pytest.raises(ValueError):
        Agent(AgentConfig("http://h", "t", "/nonexistent", reboot_mode="shutdown"))


def test_the_config_keeps_the_token_out_of_its_repr_and_cannot_change(tmp_path):
    # a launcher may log its config; the token must not go with it
    config = AgentConfig("http://h", "dev_s3cr3t-token", tmp_path, facts={"firmware": "fw 1"})
    assert "s3cr3t" not in repr(config) and "s3cr3t" not in str(config)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.backoff_max = 1.0  # type: ignore[misc]
    with pytest.raises(ValueError):
        AgentConfig("http://h,ftp://typo", "t", tmp_path)  # every URL of a list is checked at start


async def test_state_is_consumed_at_boot(tmp_path):
    # a pending boot reason left by a reboot is reported once, then cleared on disk
    StateFile(tmp_path / "state.json").update(pendingBootReason="reboot", bootCount=4)
    agent = Agent(AgentConfig("http://127.0.0.1:9", "t", tmp_path))
    await agent._boot()
    assert (agent.boot_reason, agent.boot_count) == ("reboot", 5)
    assert json.loads((tmp_path / "state.json").read_text()) == {"bootCount": 5}
    assert os.path.isdir(tmp_path / "root")


async def test_fleethub_agent_process_reexecs_itself_on_reboot(hub, nursery, tmp_path):
    # the real thing: `fleethub agent` (hub/cli.py) as a process, rebooted by command
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    cmd = [sys.executable, "-m", "hub.cli", "agent", "--hub", hub.url, "--token", "tok",
           "--data-dir", str(tmp_path / "dev")]
    with trio.fail_after(15):
        proc = await nursery.start(functools.partial(trio.run_process, cmd, env=env, check=False,
                                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        try:
            link = await hub.next_link()
            assert link.hello.bootReason == "power_on" and link.authorization == "Bearer tok"
            assert (await link.command("reboot", id="r")).ok
            await link.closed.wait()
            link2 = await hub.next_link()
            # execv keeps the pid: the same process, booted again
            assert proc.returncode is None
            assert link2.hello.bootReason == "reboot"
            assert link2.hello.tunnelPublicKey == link.hello.tunnelPublicKey
            assert (await link2.command("reboot", id="r")).payload == {"rebooting": True}
            assert (await link2.command("ping")).ok  # the repeated reboot id did not reboot again
        finally:
            proc.kill()
