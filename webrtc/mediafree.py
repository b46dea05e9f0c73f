"""aiortc without PyAV: a tunnel carries data channels only, so the media library is not loaded.

aiortc imports PyAV (``av``, FFmpeg's libraries) at module level for its audio and video codecs, and
``from aiortc import RTCPeerConnection`` loads all of it. A tunnel never encodes or decodes media (the
CLI offers data channels only, and the device refuses an offer with any other m-line, peer.py), yet
loading av cost every ``fleethub tunnel`` start 80-150 ms and every agent that opened a tunnel about
20 MiB of resident memory it kept for the rest of its life (measured in ``python -X importtime -c
"import aiortc"`` and VmRSS after ``import aiortc`` with and without this, 2026-11-28; docs/tunnel-performance.md).

``install()`` puts a stand-in ``av`` in ``sys.modules`` with the names aiortc 1.16 imports at module
level (classes and modules only: aiortc calls none of them while importing). Anything that reaches a
media path anyway gets ``MediaUnavailable`` naming this module, not a wrong result. It does nothing when
av is already imported (a process that uses it gets the real one), or with FLEETHUB_AIORTC_WITH_AV=1.
tests/webrtc/test_mediafree.py checks that aiortc imports and a session runs without av loaded, and
that a media path says why it cannot run.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

# module -> the names aiortc 1.16 takes from it (aiortc/codecs, mediastreams.py, rtp.py, rtcrtpreceiver.py,
# rtcrtpsender.py); the stand-in gives exactly these
_NAMES: dict[str, tuple[str, ...]] = {
    "av": ("AudioFrame", "VideoFrame", "AudioResampler", "CodecContext", "Packet", "FFmpegError"),
    "av.frame": ("Frame",),
    "av.packet": ("Packet",),
    "av.video": (),
    "av.video.codeccontext": ("VideoCodecContext",),
}


class MediaUnavailable(RuntimeError):
    """A media path of aiortc was reached in a process that loaded it without PyAV."""


class _Absent(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):  # what typing and inspect probe for: absent, as on any class
            raise AttributeError(name)
        raise MediaUnavailable(f"av.{cls.__name__}.{name}: this process loaded aiortc without PyAV "
                               "(webrtc/mediafree.py); tunnels carry no media")

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise MediaUnavailable(f"av.{cls.__name__}(): this process loaded aiortc without PyAV "
                               "(webrtc/mediafree.py); tunnels carry no media")


class FFmpegError(Exception):
    """Never raised: only so that aiortc's ``except av.FFmpegError`` clauses evaluate."""


def _stand_in(name: str) -> types.ModuleType:
    module = types.ModuleType(name, "A stand-in for PyAV: see webrtc/mediafree.py.")
    module.__path__ = []  # a package, so that its submodules import
    module.__fleethub_stand_in__ = True  # type: ignore[attr-defined]
    for attr in _NAMES[name]:
        setattr(module, attr, FFmpegError if attr == "FFmpegError" else _Absent(attr, (), {}))
    return module


def install() -> bool:
    """Put the stand-in in place, before aiortc is imported; whether it is (now or already) in place."""
    if os.environ.get("FLEETHUB_AIORTC_WITH_AV"):
        return False
    current = sys.modules.get("av")
    if current is not None:
        return bool(getattr(current, "__fleethub_stand_in__", False))
    if "aiortc" in sys.modules:
        return False  # aiortc is loaded already, with whatever av it found
    modules = {name: _stand_in(name) for name in _NAMES}
    for name, module in modules.items():
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(modules[parent], child, module)
    sys.modules.update(modules)
    return True


def active() -> bool:
    """Whether this process runs aiortc on the stand-in."""
    return bool(getattr(sys.modules.get("av"), "__fleethub_stand_in__", False))
