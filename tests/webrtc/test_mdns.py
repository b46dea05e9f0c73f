"""aioice's mDNS resolver loads on first use (webrtc/mdns.py): a tunnel session runs without dnspython,
and a peer that sends an mDNS candidate (as browsers do) still connects, the resolver loaded for it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from webrtc import mdns

ROOT = Path(__file__).resolve().parents[2]

# In a fresh interpreter: a pair of tunnel peers moving bytes, then two ICE agents where one's host
# candidate reaches the other as <uuid>.local, published over mDNS by another process, as a browser's is.
_SCRIPT = r'''
import asyncio, copy, json, sys, uuid, trio
import webrtc  # installs the stand-ins before aiortc and aioice load
from webrtc import mdns

from tests.webrtc.peers import move_through_pair

moved = trio.run(move_through_pair, 1 << 18)
after_session = {"moved": moved, "dns": "dns" in sys.modules, "loaded": mdns.loaded()}

# the name's owner: another process, with aioice's own mDNS module, answering for b's address
RESPONDER = """
import asyncio, sys, aioice.mdns as m
async def main():
    protocol = await m.create_mdns_protocol()
    await protocol.publish(sys.argv[1], "127.0.0.1")
    print("ready", flush=True)
    await asyncio.sleep(60)
asyncio.run(main())
"""

async def mdns_peer():
    import subprocess
    import aioice
    a = aioice.Connection(ice_controlling=True, components=1)
    b = aioice.Connection(ice_controlling=False, components=1)
    await a.gather_candidates()
    await b.gather_candidates()
    name = f"{uuid.uuid4()}.local"
    responder = subprocess.Popen([sys.executable, "-c", RESPONDER, name], stdout=subprocess.PIPE, text=True)
    try:
        assert responder.stdout.readline().strip() == "ready"
        host = next(c for c in b.local_candidates if c.host == "127.0.0.1")
        hidden = copy.copy(host)
        hidden.host = name
        a.remote_username, a.remote_password = b.local_username, b.local_password
        b.remote_username, b.remote_password = a.local_username, a.local_password
        before = mdns.loaded()
        await a.add_remote_candidate(hidden)  # resolved through the stand-in: the real module loads now
        await a.add_remote_candidate(None)
        for c in a.local_candidates:
            await b.add_remote_candidate(c)
        await b.add_remote_candidate(None)
        await asyncio.wait_for(asyncio.gather(a.connect(), b.connect()), 20)
        await a.sendto(b"through", 1)
        data, _ = await asyncio.wait_for(b.recvfrom(), 5)
        pair = a._nominated.get(1)
        await a.close()
        await b.close()
        return before, data == b"through", pair.remote_candidate.host if pair else None
    finally:
        responder.kill()
        responder.wait()

before, ok, remote = asyncio.run(mdns_peer())
print(json.dumps({"after_session": after_session, "before": before, "mdns_connected": ok, "remote": remote,
                  "loaded": mdns.loaded(), "dns": "dns" in sys.modules}))
'''


def test_a_session_runs_without_dnspython_and_an_mdns_candidate_loads_it():
    done = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["after_session"] == {"moved": True, "dns": False, "loaded": False}
    assert found["before"] is False  # nothing had loaded it until the mDNS candidate came
    assert found["mdns_connected"] is True and found["loaded"] is True and found["dns"] is True
    assert found["remote"].endswith(".local")


def test_the_stand_in_names_mdns_hosts_as_aioice_does():
    names = ["3f1e7a2c-aaaa-bbbb-cccc-1234567890ab.local", "a.local", "x" * 63 + ".local", "x" * 64 + ".local",
             "host.local.", "a.b.local", "10.0.0.1", "fe80::1", "", ".local", "UPPER-Case.local", "ünï.local"]
    script = ("import json, sys; sys.path.insert(0, '.'); import aioice.mdns as real\n"
              f"print(json.dumps([real.is_mdns_hostname(n) for n in {names!r}]))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    stand_in = mdns._stand_in()
    assert [stand_in.is_mdns_hostname(n) for n in names] == json.loads(done.stdout)
    assert not stand_in.__dict__["_real"]  # naming is answered without loading anything
