"""What the tunnel reads out of an SDP: the DTLS certificate fingerprints.

The grant binds a session to the CLI's DTLS certificate (``clientFingerprint``); DTLS itself then
refuses a peer whose certificate does not match the fingerprint in the SDP it was given, so checking
the offer's fingerprint against the grant is what keeps a stolen grant from being used with
another offer. Fingerprints are compared as ``"<algorithm> <HEX:HEX:...>"`` with the algorithm in
lower case and the hex in upper case; a bare hex string means sha-256.
"""

from __future__ import annotations

import re

_LINE = re.compile(r"^a=fingerprint:(\S+)\s+([0-9A-Fa-f:]+)\s*$", re.MULTILINE)
_MEDIA = re.compile(r"^m=(\S*)", re.MULTILINE)


def normalise_fingerprint(text: str) -> str:
    parts = text.strip().split()
    if len(parts) == 1:
        return "sha-256 " + parts[0].upper()
    if len(parts) == 2:
        return parts[0].lower() + " " + parts[1].upper()
    return text.strip()


def fingerprints(sdp: str) -> list[str]:
    """Every ``a=fingerprint`` of ``sdp``, normalised, in order (aiortc lists sha-256 first)."""
    return [normalise_fingerprint(f"{alg} {value}") for alg, value in _LINE.findall(sdp or "")]


def fingerprint(sdp: str) -> str:
    """The one fingerprint a grant carries: sha-256 when the SDP has it, else the first one."""
    found = fingerprints(sdp)
    if not found:
        raise ValueError("the SDP has no DTLS fingerprint")
    return next((f for f in found if f.startswith("sha-256 ")), found[0])


def media_kinds(sdp: str) -> list[str]:
    """The kind of every ``m=`` section of ``sdp``, in order (``application`` for data channels)."""
    return _MEDIA.findall(sdp or "")


def data_channels_only(sdp: str) -> bool:
    """Whether ``sdp`` asks for data channels and nothing else: what a tunnel's offer is. A device
    answers nothing else: it would otherwise decode audio and video a caller sends it (and runs aiortc
    without PyAV, webrtc/mediafree.py)."""
    kinds = media_kinds(sdp)
    return bool(kinds) and all(kind == "application" for kind in kinds)
