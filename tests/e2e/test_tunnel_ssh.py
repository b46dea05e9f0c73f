"""ssh and scp through fleethub as an operator uses them (issue 21): a real sshd, the real agent
offering ssh, and ``fleethub tunnel`` as OpenSSH's ProxyCommand or as a local listener.

Sizes stay modest (5 MiB each way); bench/tunnel.py measures 100 MiB.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import socket
import subprocess
import uuid

import trio

from tests.e2e.clitools import fleethub_exe, free_port
from tests.e2e.sshtools import SshWorld, ssh_world
from tests.hubtools import device, wait_for
from webrtc.marks import parse as parse_marks

MIB = 1024 * 1024


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_clean_agent_log(world: SshWorld) -> None:
    text = world.agent.log()
    assert "Task exception was never retrieved" not in text, text[-4000:]
    assert "Traceback" not in text, text[-4000:]
    # ICE chatter is DEBUG: the agent's INFO log carries no aioice check lines
    assert "aioice" not in text and "CandidatePair" not in text, text[-4000:]


async def test_ssh_and_scp_through_the_proxycommand(nursery, db_url, tmp_path):
    with trio.fail_after(240):
        async with ssh_world(nursery, db_url, tmp_path) as world:
            # the agent said what it offers, and the hub shows it on the device
            assert f"tunnel targets: ssh on (127.0.0.1:{world.sshd.port})" in world.agent.log()
            shown = (await device(world.hub, world.device_id))["tunnel_targets"]
            assert shown == {"names": ["ssh"], "ports": [], "ssh": True, "shell": False}

            # a command over ssh, with the CLI's closing line (--verbose) on ssh's stderr
            done = await world.ssh("echo hello-from-$(hostname) && cat /proc/sys/kernel/hostname", "--verbose")
            assert done.returncode == 0, done.stderr.decode()
            host = socket.gethostname()
            assert done.stdout.decode().split() == [f"hello-from-{host}", host]
            closed = re.search(r"tunnel closed: (?:done|stopped); (\d+) bytes sent .*?, (\d+) bytes received .* direct "
                               r"\(host/host candidates\)", done.stderr.decode())
            assert closed and int(closed[1]) > 1000 and int(closed[2]) > 1000, done.stderr.decode()
            # and where the time to a usable tunnel went (webrtc/marks.py), each step after the one before
            marks = parse_marks(done.stderr.decode())
            steps = ["parsed", "imported", "lookup", "offer", "token", "session", "ice", "dtls", "sctp", "ready",
                     "closed"]
            assert marks is not None and all(k in marks for k in steps), done.stderr.decode()
            assert [marks[k] for k in steps] == sorted(marks[k] for k in steps), marks

            # scp both ways, 5 MiB, same hashes
            up = tmp_path / "up.bin"
            up.write_bytes(os.urandom(5 * MIB))
            remote = tmp_path / "remote.bin"
            back = tmp_path / "back.bin"
            r = await world.scp(str(up), f":{remote}")
            assert r.returncode == 0, r.stderr.decode()
            assert sha256(remote) == sha256(up)
            r = await world.scp(f":{remote}", str(back))
            assert r.returncode == 0, r.stderr.decode()
            assert sha256(back) == sha256(up)

            # two sessions at once: a copy down while another session runs commands
            results: dict[str, subprocess.CompletedProcess] = {}
            other = tmp_path / "other.bin"

            async def copy() -> None:
                results["scp"] = await world.scp(f":{remote}", str(other))

            async def commands() -> None:
                results["ssh"] = await world.ssh("sha256sum " + str(remote))

            async with trio.open_nursery() as both:
                both.start_soon(copy)
                both.start_soon(commands)
            assert results["scp"].returncode == 0, results["scp"].stderr.decode()
            assert results["ssh"].returncode == 0, results["ssh"].stderr.decode()
            assert sha256(other) == sha256(up)
            assert results["ssh"].stdout.decode().split()[0] == sha256(up)
            # quiet by default: what the ProxyCommand prints lands in the user's terminal
            assert results["ssh"].stderr.decode() == ""

            # every session ended: ssh's SIGHUP or EOF made each CLI delete its session
            async def all_closed() -> bool:
                return await world.open_sessions() == []
            await wait_for(all_closed, timeout=20, interval=0.1)
            n = await world.hub.services.db.fetchval("SELECT count(*) FROM tunnel_sessions WHERE device_id = $1",
                                                     uuid.UUID(world.device_id))
            assert n == 5

            # the device by its name (issue 37 item 8): %n keeps its case, so the offline decoy whose
            # name is the lowercased one (what %h would give) is not the device reached
            hub = world.hub
            r = await hub.call("PATCH", f"/v1/devices/{world.device_id}", json={"name": "Kiosk-7"})
            assert r.status_code == 200, r.text
            await hub.provision("kiosk-7")
            named = await world.ssh("echo by-name", host="Kiosk-7")
            assert named.returncode == 0, named.stderr.decode()
            assert named.stdout.decode().split() == ["by-name"]
            await wait_for(all_closed, timeout=20, interval=0.1)
            n = await hub.services.db.fetchval("SELECT count(*) FROM tunnel_sessions WHERE device_id = $1",
                                               uuid.UUID(world.device_id))
            assert n == 6
            assert_clean_agent_log(world)


async def test_listen_default_picks_a_free_port_and_the_close_prints_totals(nursery, db_url, tmp_path):
    with trio.fail_after(180):
        async with ssh_world(nursery, db_url, tmp_path) as world:
            out = tmp_path / "cli.out"
            err = tmp_path / "cli.err"
            with out.open("wb") as o, err.open("wb") as e:
                cli = subprocess.Popen([fleethub_exe(), "tunnel", "--device", world.device_id, "--target", "ssh"],
                                       stdout=o, stderr=e, stdin=subprocess.DEVNULL, env=world.cli_env(),
                                       start_new_session=True)
            try:
                await wait_for(lambda: "tunnel ready" in out.read_text() or cli.poll() is not None, timeout=60)
                ready = re.search(r"tunnel ready: 127\.0\.0\.1:(\d+) -> ", out.read_text())
                assert ready, out.read_text() + err.read_text()
                port = int(ready[1])
                assert port != 0
                with trio.fail_after(60):
                    done = await trio.run_process(
                        ["ssh", *world.sshd.ssh_options(), "-p", str(port), f"{world.sshd.user}@127.0.0.1",
                         "head -c 300000 /dev/zero"], capture_stdout=True, capture_stderr=True, check=False,
                        stdin=subprocess.DEVNULL)
                assert done.returncode == 0 and len(done.stdout) == 300000, done.stderr.decode()
                cli.send_signal(signal.SIGINT)
                await wait_for(lambda: cli.poll() is not None, timeout=20)
                assert cli.returncode == 0, err.read_text()
                lines = [line for line in err.read_text().splitlines() if line.startswith("tunnel closed")]
                assert len(lines) == 1, err.read_text()
                closed = re.match(r"tunnel closed: stopped; (\d+) bytes sent \(.*\), (\d+) bytes received \(.*\) "
                                  r"in (\d+\.\d)s, direct \(host/host candidates\)$", lines[0])
                assert closed, lines[0]
                assert int(closed[2]) > 300000 > int(closed[1]) > 0 and float(closed[3]) > 0
                assert "Traceback" not in err.read_text()
            finally:
                if cli.poll() is None:
                    cli.kill()
                    cli.wait(10)
            assert_clean_agent_log(world)


def _run_cli(args: list[str], env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([fleethub_exe(), "tunnel", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _one_line_failure(result: subprocess.CompletedProcess, *expected: str) -> str:
    text = result.stdout + result.stderr
    assert result.returncode == 2, text
    assert "Traceback" not in text and "ExceptionGroup" not in text, text
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("fleethub tunnel: "), text
    for part in expected:
        assert part in lines[0], lines[0]
    return lines[0]


async def test_every_cli_failure_is_one_line_saying_what_to_do(nursery, db_url, tmp_path):
    with trio.fail_after(240):
        async with ssh_world(nursery, db_url, tmp_path, ssh=False) as world:
            env = world.cli_env()
            s = world.hub.services
            base = ["--device", world.device_id, "--target", "ssh"]

            async def cli(args: list[str], env: dict[str, str] = env) -> subprocess.CompletedProcess:
                return await trio.to_thread.run_sync(lambda: _run_cli(args, env))

            # a listen port in use: refused before any session is opened on the hub
            with socket.socket() as taken:
                taken.bind(("127.0.0.1", 0))
                taken.listen(1)
                port = taken.getsockname()[1]
                line = _one_line_failure(await cli([*base, "--listen", f"127.0.0.1:{port}"]),
                                         f"127.0.0.1:{port} is in use", "choose another --listen port")
            assert await s.db.fetchval("SELECT count(*) FROM tunnel_sessions") == 0
            # a hub it cannot reach
            _one_line_failure(await cli([*base, "--hub", f"http://127.0.0.1:{free_port()}"]),
                              "cannot reach the hub", "check --hub")
            # no credentials, wrong credentials (the secret never printed)
            bare = {k: v for k, v in env.items() if not k.startswith("FLEETHUB_PAT")}
            _one_line_failure(await cli(base, bare), "FLEETHUB_PAT_ID")
            wrong = {**env, "FLEETHUB_PAT_SECRET": "not-the-secret-" + uuid.uuid4().hex}
            line = _one_line_failure(await cli(base, wrong), "401", "create a new PAT")
            assert wrong["FLEETHUB_PAT_SECRET"] not in line
            # the target is missing on the device; ssh is off on the device
            _one_line_failure(await cli(["--device", world.device_id, "--target", "web"]),
                              "target_not_configured", "--tunnel-target NAME=HOST:PORT")
            _one_line_failure(await cli(base), "ssh_disabled", "--ssh")
            # the organisation is not entitled
            await s.tunnels.store.set_entitlement(uuid.UUID(world.hub.org_id), {"enabled": False}, s.clock.now())
            _one_line_failure(await cli(base), "tunnel_not_entitled", "fleethub admin tunnel-entitle")
            await s.tunnels.store.set_entitlement(uuid.UUID(world.hub.org_id), {"enabled": True}, s.clock.now())
            # the device is offline
            world.agent.stop()
            await wait_for(lambda: _offline(world), timeout=30, interval=0.2)
            _one_line_failure(await cli(["--device", world.device_id, "--target", "ssh", "--stdio"]),
                              "device_unreachable", "check that its agent runs")
            # a name no device has, and one two devices share: refused with their ids, never a pick
            _one_line_failure(await cli(["--device", "no-such-device", "--target", "ssh"]),
                              "no device you can see is named 'no-such-device'", "%n")
            twins = [(await world.hub.provision("twin"))[0], (await world.hub.provision("twin"))[0]]
            _one_line_failure(await cli(["--device", "twin", "--target", "ssh"]),
                              "2 devices are named 'twin' (", *twins, "); use the id")
            # a --listen that is not HOST:PORT
            _one_line_failure(await cli([*base, "--listen", "nonsense"]), "--listen", "HOST:PORT")
            assert "Task exception was never retrieved" not in world.agent.log()


async def _offline(world: SshWorld) -> bool:
    return not (await device(world.hub, world.device_id)).get("online")
