"""The ``shell`` tunnel target with a real PTY and real aiortc peers on loopback: echo, resize seen by
``stty size``, Ctrl-C interrupting ``sleep 100``, ``exit`` closing the channel, the process group
hung up when the session closes, and the switch (off by default, shell_disabled)."""

from __future__ import annotations

import os
import re

import pytest
import trio

from device_client.commands import CommandError
from device_client.shell import ShellUser, parse_resize
from device_client.tunnel import ShellTarget, TunnelConfig
from webrtc.device_tunnel import peer_target
from tests.webrtc.peers import (
    connect_shell_pair,
    open_shell,
    shell_resize,
    shell_send,
    wait_output,
)

# a plain /bin/sh prompt-free enough to read: ENV unset, no rc files; PS1 is set by the test


async def _shell_pair():
    user = ShellUser.lookup(None)
    pair = await connect_shell_pair(peer_target(ShellTarget(ShellUser(user.name, user.uid, user.gid, user.home,
                                                                      "/bin/sh"))))
    shell = await open_shell(pair.client)
    assert not shell.closed
    return pair, shell


async def _close(pair) -> None:
    await pair.client.close()
    await pair.device.close()


async def test_echo_comes_back_through_the_pty():
    with trio.fail_after(20):
        pair, shell = await _shell_pair()
        try:
            await shell_send(pair.client, shell, b"echo hello-$((6*7))\n")
            await wait_output(shell, "hello-42")
            assert pair.device.counters.received > 0 and pair.device.counters.sent > 0
        finally:
            await _close(pair)


async def test_resize_is_seen_by_stty_size():
    with trio.fail_after(20):
        pair, shell = await _shell_pair()
        try:
            await shell_resize(pair.client, shell, 123, 45)
            mark = len(shell.output)
            await shell_send(pair.client, shell, b"stty size\n")
            await wait_output(shell, "45 123", after=mark)
        finally:
            await _close(pair)


async def test_ctrl_c_interrupts_the_foreground_job():
    with trio.fail_after(20):
        pair, shell = await _shell_pair()
        try:
            await shell_send(pair.client, shell, b"sleep 100; echo after-$((1+1))\n")
            await trio.sleep(0.5)  # the sleep is running in the foreground
            mark = len(shell.output)
            await shell_send(pair.client, shell, b"\x03")
            await shell_send(pair.client, shell, b"echo alive-$((2+3))\n")
            # SIGINT ended the whole list (the shell's own rule for an interrupted job): no "after-2"
            await wait_output(shell, "alive-5", after=mark)
            assert "after-2" not in shell.text()
        finally:
            await _close(pair)


async def test_exit_closes_the_channel():
    with trio.fail_after(20):
        pair, shell = await _shell_pair()
        try:
            await shell_send(pair.client, shell, b"exit\n")
            while not shell.closed:
                await trio.sleep(0.02)
        finally:
            await _close(pair)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_closing_the_session_hangs_up_the_shell_and_its_jobs():
    with trio.fail_after(20):
        pair, shell = await _shell_pair()
        try:
            await shell_send(pair.client, shell, b"sleep 300 & echo pid=$!\n")
            await wait_output(shell, "pid=")
            while not re.search(r"pid=(\d+)\s", shell.text()):
                await trio.sleep(0.01)
            pid = int(re.search(r"pid=(\d+)\s", shell.text())[1])
            assert _alive(pid)
        finally:
            await _close(pair)
        while _alive(pid):  # SIGHUP to the group, SIGKILL after KILL_AFTER: gone within the deadline
            await trio.sleep(0.05)


def test_the_shell_is_off_by_default_and_refused_with_its_own_code():
    config = TunnelConfig.from_flags([], [], False)
    with pytest.raises(CommandError) as refused:
        config.resolve("shell")
    assert refused.value.code == "shell_disabled"
    on = TunnelConfig.from_flags([], [], False, shell=True)
    assert isinstance(on.resolve("shell"), ShellTarget)
    assert on.resolve("shell").user.uid == os.getuid()
    with pytest.raises(ValueError):
        TunnelConfig.from_flags([], [], False, shell=False, shell_user="root")
    with pytest.raises(ValueError):
        TunnelConfig.from_flags([], [], False, shell=True, shell_user="no-such-user-here")


def test_resize_messages_are_validated():
    assert parse_resize({"resize": {"cols": 80, "rows": 24}}) == (80, 24)
    for bad in ({"resize": {"cols": 0, "rows": 24}}, {"resize": {"cols": True, "rows": 24}},
                {"resize": {"cols": 80, "rows": 5000}}, {"resize": [80, 24]}, {}):
        assert parse_resize(bad) is None


def test_the_switch_on_the_command_lines_and_in_hello():
    from device_client.agent_cli import tunnel_config
    from hub.cli import build_parser

    parser = build_parser()
    agent = ["agent", "--hub", "http://127.0.0.1:1", "--data-dir", "/nonexistent"]
    assert tunnel_config(parser.parse_args(agent)).shell is None
    on = tunnel_config(parser.parse_args([*agent, "--tunnel-shell"]))
    assert on.shell is not None and on.shell.uid == os.getuid()
    sim = ["sim", "--hub", "http://127.0.0.1:1", "--data-dir", "/nonexistent", "--tunnel-shell"]
    assert tunnel_config(parser.parse_args(sim)).shell is not None
    assert parser.parse_args(["demo", "--tunnel-shell"]).tunnel_shell is True
    assert on.hello_fields()["tunnelTargets"]["shell"] is True
    off = TunnelConfig().hello_fields()["tunnelTargets"]
    assert off["shell"] is False


@pytest.mark.skipif(os.getuid() != 0, reason="only root may start a shell as another user")
async def test_the_shell_runs_as_the_configured_user():
    with trio.fail_after(20):
        target = TunnelConfig.from_flags([], [], False, shell=True, shell_user="nobody").resolve("shell")
        assert target.user.name == "nobody"
        pair = await connect_shell_pair(peer_target(target))
        shell = await open_shell(pair.client)
        try:
            await shell_send(pair.client, shell, b"echo who-$(id -un)-$(id -u)\n")
            await wait_output(shell, f"who-nobody-{target.user.uid}")
        finally:
            await _close(pair)


async def test_without_setsid_the_trampoline_makes_the_pty_the_controlling_terminal(monkeypatch):
    import device_client.shell as shell_mod

    monkeypatch.setattr(shell_mod, "SETSID", "/nonexistent/setsid")
    with trio.fail_after(20):
        pair, shell = await _shell_pair()
        try:
            await shell_send(pair.client, shell, b"sleep 100; echo after-$((1+1))\n")
            await trio.sleep(0.5)
            mark = len(shell.output)
            await shell_send(pair.client, shell, b"\x03")  # needs the PTY as controlling terminal
            await shell_send(pair.client, shell, b"echo alive-$((2+3))\n")
            await wait_output(shell, "alive-5", after=mark)
            assert "after-2" not in shell.text()
        finally:
            await _close(pair)
