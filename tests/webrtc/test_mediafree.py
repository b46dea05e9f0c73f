"""aiortc without PyAV (webrtc/mediafree.py): a tunnel's peers load no media library, still connect and
move bytes, and a media path says why it cannot run instead of misbehaving."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from webrtc.sdp import data_channels_only, media_kinds

ROOT = Path(__file__).resolve().parents[2]

# In a fresh interpreter: the tunnel's own imports, then a pair of peers moving 1 MiB through a channel.
_SCRIPT = r'''
import json, trio
import webrtc  # installs the stand-in before aiortc loads
from webrtc import mediafree

async def main():
    from tests.webrtc.peers import move_through_pair
    moved = await move_through_pair(1 << 20)
    from aiortc.codecs.opus import OpusDecoder
    try:
        OpusDecoder()
        media = "ran"
    except mediafree.MediaUnavailable as exc:
        media = str(exc)
    maps = open("/proc/self/maps").read()
    print(json.dumps({"moved": moved, "stand_in": mediafree.active(),
                      "libav_mapped": "libavcodec" in maps or "/av.libs/" in maps, "media": media}))

trio.run(main)
'''


def test_a_tunnel_runs_without_pyav_loaded():
    done = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["moved"] is True and found["stand_in"] is True
    assert found["libav_mapped"] is False
    assert "without PyAV" in found["media"]


def test_with_av_asked_for_the_real_library_loads():
    script = "import webrtc, aiortc, av; from webrtc import mediafree; print(mediafree.active(), hasattr(av, 'open'))"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "FLEETHUB_AIORTC_WITH_AV": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True"]


def test_only_data_channels_make_a_tunnel_offer():
    data = "v=0\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\na=sctp-port:5000\r\n"
    assert media_kinds(data) == ["application"] and data_channels_only(data)
    assert not data_channels_only(data + "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\n")
    assert not data_channels_only("m=video 9 UDP/TLS/RTP/SAVPF 96\r\n" + data)
    assert not data_channels_only("v=0\r\n")  # no section at all is not an offer of a channel
