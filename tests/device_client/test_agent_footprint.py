"""What an idle agent holds: `fleethub agent` as a process, tunnel targets configured and memory tests
on, maps no native library of numpy, aiortc (pylibsrtp, google-crc32c; never av) or cryptography until a
memory test or a tunnel asks for them (bench/agent_footprint.py measures the RSS this saves), and its
hello says what it can do all the same. Then a memory test runs and a tunnel opens and carries bytes
in that same process: the loads deferred to them work.

Read from outside, as the bench does: the site-packages directories of the shared objects in
/proc/PID/maps; and the modules it imported (``-X importtime`` on its stderr): once idle, nothing
third-party beyond what importing its entry point imports (trio.testing, and pytest with it, cost the
agent 6 MiB of RSS until 2026-11-29).
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import re
import subprocess
import sys
from functools import partial
from pathlib import Path

import trio
from device_fakehub import FakeHub
from nacl.signing import SigningKey

from device_client.shared.clock import rfc3339
from webrtc.grant import GRANT_VERSION, sign_grant
from webrtc.loop import restrict_host_addresses
from webrtc.peer import TunnelPeer
from webrtc.sdp import fingerprint

MEMTEST = {"numpy", "numpy.libs"}
TUNNEL = {"av", "av.libs", "cryptography", "pylibsrtp", "google_crc32c", "aiortc"}
OURS = {"device_client", "webrtc"}  # the agent's own packages: what they import is checked by name


def native_libraries(pid: int) -> set[str]:
    found = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        m = re.search(r"site-packages/([^/]+)/", line)
        if m and re.search(r"\.so(\.|$)", line):
            found.add(m.group(1))
    return found


def imported(log: Path) -> set[str]:
    """The modules a process started with ``-X importtime`` has imported so far (its stderr in ``log``)."""
    names = set()
    for line in log.read_text(errors="replace").splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+\d+ \| ( *)(\S+)$", line)
        if m:
            names.add(m.group(2))
    return names


def imported_by_start(tmp_path: Path) -> set[str]:
    """What importing the agent's entry point imports, in a fresh interpreter."""
    out = tmp_path / "start.log"
    with out.open("wb") as f:
        subprocess.run([sys.executable, "-X", "importtime", "-c", "import hub.cli, device_client.agent"],
                       stderr=f, check=True, cwd=os.getcwd())
    return imported(out)


async def echo(stream: trio.SocketStream) -> None:
    async with stream:
        while data := await stream.receive_some(65536):
            await stream.send_all(data)


def grant(key: SigningKey, link, offer: dict) -> str:
    now = dt.datetime.now(dt.timezone.utc)
    return sign_grant({"v": GRANT_VERSION, "kid": "k1", "sid": "fp-1", "orgId": "org-1", "deviceId": link.device_id,
                       "principal": "user:test", "target": "echo", "notBefore": rfc3339(now),
                       "expiresAt": rfc3339(now + dt.timedelta(seconds=60)), "relay": False, "bandwidthBps": None,
                       "clientFingerprint": fingerprint(offer["sdp"]), "deviceKey": link.hello.tunnelPublicKey}, key)


def plan() -> dict:
    return {"mode": "live_quick", "impact": "running", "placement": "online", "quick": True, "passes": 1,
            "kernelPasses": 2, "bitFade": False, "holdOnFailure": False, "timeBudgetSeconds": 600}


async def test_an_idle_agent_loads_neither_numpy_nor_aiortc_and_still_tests_and_tunnels(tmp_path):
    log = (tmp_path / "agent.log").open("ab")
    with trio.fail_after(90), log:
        async with trio.open_nursery() as nursery:
            restrict_host_addresses(["127.0.0.1"])
            echo_port = (await nursery.start(partial(trio.serve_tcp, echo, 0, host="127.0.0.1")))[0].socket.getsockname()[1]
            key = SigningKey.generate()
            hub = await nursery.start(FakeHub().serve)
            hub.hub_keys = {"k1": base64.b64encode(bytes(key.verify_key)).decode()}
            proc = subprocess.Popen(
                [sys.executable, "-X", "importtime", "-m", "hub.cli", "agent", "--hub", hub.url, "--token", "tok", "--data-dir",
                 str(tmp_path / "dev"), "--memory-budget", "256K", "--tunnel-target", f"echo=127.0.0.1:{echo_port}", "--ssh"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=os.getcwd(),
                env={**os.environ, "FLEETHUB_LOG_LEVEL": "INFO", "FLEETHUB_ICE_ADDRESSES": "127.0.0.1"})
            try:
                link = await hub.next_link()
                caps = link.hello.capabilities
                assert caps.memoryTest.online is True and caps.tunnel is True
                assert link.hello.tunnelTargets.names == ["echo"] and link.hello.tunnelTargets.ssh is True
                idle = native_libraries(proc.pid)
                assert not idle & (MEMTEST | TUNNEL), idle
                # the idle agent imported nothing third-party beyond its own start: trio.testing was one
                # (6 MiB, device_client/shared/loopwatch.py's _virtual_clock), numpy or aiortc would be others
                late = {m for m in imported(tmp_path / "agent.log") - imported_by_start(tmp_path)
                        if m.partition(".")[0] not in OURS | set(sys.stdlib_module_names)}
                assert not late, late

                reply = await link.command("memtest.start", {"runId": "fp1", "plan": plan()})
                assert reply.ok, reply.error
                result = (await link.next_event("memtest.result")).payload["result"]
                assert result["runId"] == "fp1" and result["outcome"] == "pass", result
                assert "numpy" in native_libraries(proc.pid)

                peer = TunnelPeer()
                try:
                    offer = await peer.create_offer()
                    reply = await link.command("tunnel.open", {"grant": grant(key, link, offer), "offer": offer,
                                                               "iceServers": []})
                    assert reply.ok, reply.error
                    await peer.set_answer(reply.payload["answer"])
                    await peer.wait_control_open()
                    _, port = await peer.listen("127.0.0.1", 0)
                    stream = await trio.open_tcp_stream("127.0.0.1", port)
                    async with stream:
                        await stream.send_all(b"through the tunnel")
                        got = b""
                        while len(got) < 18:
                            got += await stream.receive_some(64)
                    assert got == b"through the tunnel"
                    loaded = native_libraries(proc.pid)
                    # the tunnel's own libraries, and not PyAV's: aiortc runs without it (webrtc/mediafree.py)
                    assert {"cryptography", "pylibsrtp"} <= loaded and not {"av", "av.libs"} & loaded
                finally:
                    await peer.close()
            finally:
                proc.kill()
                proc.wait()
            nursery.cancel_scope.cancel()
