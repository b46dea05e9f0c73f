"""What the agent loads on first use is imported in a worker thread, not on its trio thread, where it
stalled the link's heartbeats (device_client/imports.py): the first tunnel's pyjwt, cryptography and
data path (webrtc/device_tunnel.py ``load_engine``), a first memory test's numpy, httpx for page maps.

Checked in fresh interpreters, where none of them is loaded yet: an import hook notes the thread each
module is first looked up on; ``tunnel.open`` is called as the agent's command table calls it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = r"""
import json, sys, threading
seen = {}

class Spy:
    def find_spec(self, name, path=None, target=None):
        if name in ("aiortc", "jwt", "cryptography"):
            seen.setdefault(name, threading.get_ident())
        return None

sys.meta_path.insert(0, Spy())
import trio
from device_client.commands import CommandError
from device_client.tunnel import TunnelConfig
from webrtc.device_tunnel import TunnelService

async def main():
    service = TunnelService(object(), TunnelConfig())
    codes = []
    for _ in range(2):  # the second open finds everything loaded
        try:
            await service.open({"grant": "x"})
        except CommandError as exc:
            codes.append(exc.code)
    return codes

main_thread = threading.get_ident()
codes = trio.run(main)
print(json.dumps({"codes": codes, "on_main": sorted(n for n, t in seen.items() if t == main_thread),
                  "elsewhere": sorted(n for n, t in seen.items() if t != main_thread),
                  "loaded": sorted(m for m in ("webrtc.peer", "webrtc.grant") if m in sys.modules)}))
"""


def test_the_first_tunnel_open_imports_aiortc_and_pyjwt_off_the_agents_trio_thread():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                          cwd=os.getcwd())
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    # the open went on to check its payload (no SDP offer here) once the engine was loaded, both times
    assert found["codes"] == ["rejected", "rejected"]
    assert found["loaded"] == ["webrtc.grant", "webrtc.peer"]
    assert found["on_main"] == [], found
    # aiortc is not needed to check a payload: when it loads (an offer answered), it is on the asyncio thread
    assert {"jwt", "cryptography"} <= set(found["elsewhere"]), found


LOAD = r"""
import json, sys, threading
seen = []

class Spy:
    def find_spec(self, name, path=None, target=None):
        if name in ("numpy", "httpx"):
            seen.append([name, threading.get_ident()])
        return None

sys.meta_path.insert(0, Spy())
import trio
from device_client.imports import load

async def main():
    await load("device_client.memtest.runner", "httpx")
    await load("device_client.memtest.runner", "httpx")  # loaded: no second import, no lookup

trio.run(main)
print(json.dumps({"seen": [[n, t == threading.get_ident()] for n, t in seen],
                  "loaded": [m in sys.modules for m in ("device_client.memtest.runner", "numpy", "httpx")]}))
"""


def test_load_imports_in_a_worker_thread_once():
    done = subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True, timeout=120, cwd=os.getcwd())
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["loaded"] == [True, True, True]
    # each looked up once (the second load found them in sys.modules), and not on the trio thread
    assert found["seen"] == [["numpy", False], ["httpx", False]], found
