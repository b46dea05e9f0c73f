"""What an idle agent holds: `fleethub agent` as a process, tunnel targets configured and memory tests
on, maps no native library of numpy, aiortc (pylibsrtp, google-crc32c; never av) or cryptography until a
memory test or a tunnel asks for them (bench/agent_footprint.py measures the RSS this saves), and its
hello says what it can do all the same. Then a memory test runs and a tunnel opens and carries bytes
in that same process: the loads deferred to them work.

Read from outside, as the bench does: the site-packages directories of the shared objects in
/proc/PID/maps.
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


def native_libraries(pid: int) -> set[str]:
    found = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        m = re.search(r"site-packages/([^/]+)/", line)
        if m and re.search(r"\.so(\.|$)", line):
            found.add(m.group(1))
    return found


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
                [sys.executable, "-m", "hub.cli", "agent", "--hub", hub.url, "--token", "tok", "--data-dir",
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
