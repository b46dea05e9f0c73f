"""No CRC32c on SCTP packets that DTLS already protects, when both ends agree (RFC 9653, Zero Checksum).

Every SCTP packet carries a CRC32c of the whole packet (RFC 9260 6.8), which aiortc computes for each
packet it sends (``serialize_packet``) and checks for each it receives (``parse_packet``). In WebRTC
each SCTP packet travels inside a DTLS record whose AEAD tag already proves it arrived as it was sent,
so the CRC protects nothing more. It was 4-6 % of a peer's CPU under a bulk copy (py-spy, GIL held:
about 4 µs per 1,432-byte packet received on the slow host, the copies of the packet the check makes
included). RFC 9653 lets an endpoint say it accepts packets with a checksum of zero when another
method detects errors (here Error Detection Method 1, "SCTP over DTLS"), and lets its peer then send
them so. dcSCTP (Chromium's SCTP) implements it, though the Chromium of these tests did not announce it
(tests/browser/test_terminal.py passes either way); aiortc does not.

What this end does:
- it announces the Zero Checksum Acceptable parameter (type 0x8001, EDMID 1) in its INIT or
  INIT-ACK (aiortc's ``_set_extensions``), and from then on takes a packet whose checksum is zero as
  checked (packets.py's ``_handle_data``: the in-place path for a DATA or SACK packet skips the CRC,
  any other packet has its CRC filled in before aiortc's parse, which still checks every non-zero
  checksum);
- if the peer announced it with EDMID 1 (aiortc's ``_get_extensions``), it sends every packet but
  one carrying an INIT with a checksum of zero (an INIT always carries a CRC32c, as RFC 9653 asks:
  the peer's support is not known yet when it leaves).
A peer that does not announce it (aiortc as it is, an older fleethub, a browser without it) gets
CRC32c checksums, and its own are checked as before. ``FLEETHUB_SCTP_CRC32C=1`` (and
``FLEETHUB_SCTP_PARSE_EVERY_PACKET=1``, which turns off the path that skips the check) neither announces
the parameter nor sends checksums of zero (the A/B's "before" across processes; bench/tunnel_ab.py
--zero-checksum switches what an association sends). Applied with packets.py's changes, on whose
receive path it relies (FLEETHUB_AIORTC_AS_IS=1 leaves aiortc's own and announces nothing).
"""

from __future__ import annotations

import os
from struct import pack, unpack_from
from typing import Any

ZERO_CHECKSUM_ACCEPTABLE = 0x8001  # the chunk parameter's type (RFC 9653)
SCTP_OVER_DTLS = 1  # its Error Detection Method Identifier for SCTP over DTLS (RFC 9653)
ZERO = bytes(4)

_applied = False


def announce(params: list[tuple[int, bytes]]) -> bool:
    """Add the parameter that says this end accepts checksums of zero to an INIT's or INIT-ACK's
    parameters; True, as it did."""
    params.append((ZERO_CHECKSUM_ACCEPTABLE, pack("!L", SCTP_OVER_DTLS)))
    return True


def announced(params: list[tuple[int, bytes]]) -> bool:
    """Whether an INIT's or INIT-ACK's parameters say the peer accepts checksums of zero for DTLS."""
    return any(kind == ZERO_CHECKSUM_ACCEPTABLE and len(value) >= 4 and unpack_from("!L", value)[0] == SCTP_OVER_DTLS
               for kind, value in params)


def crc_of(data: bytes) -> int:
    """The CRC32c of SCTP packet ``data`` as RFC 9260 computes it: over the packet, its checksum zero."""
    from aiortc.rtcsctptransport import crc32c

    return crc32c(data[:8] + ZERO + data[12:])


def with_crc(data: bytes) -> bytes:
    """``data`` (a packet whose checksum is zero) with its CRC32c filled in, for aiortc's parse."""
    return data[:8] + pack("<L", crc_of(data)) + data[12:]


def zero_checksums() -> None:
    global _applied
    if _applied or os.environ.get("FLEETHUB_AIORTC_AS_IS"):
        return
    from aiortc.rtcsctptransport import InitChunk, RTCSctpTransport

    # packets.py's in-place path is what skips the check; without it a zero is filled in for aiortc's
    # parse, which costs more than the CRC32c it saved the sender
    send_both = not (os.environ.get("FLEETHUB_SCTP_CRC32C") or os.environ.get("FLEETHUB_SCTP_PARSE_EVERY_PACKET"))
    set_extensions, get_extensions, send_chunk = (RTCSctpTransport._set_extensions,
                                                  RTCSctpTransport._get_extensions, RTCSctpTransport._send_chunk)
    # what packets.py's receive path reads: set per association once it announced, or heard, the parameter
    RTCSctpTransport._fleethub_zero_in = False
    RTCSctpTransport._fleethub_zero_out = False

    def set_ours(self: Any, params: list[tuple[int, bytes]]) -> None:
        set_extensions(self, params)
        if send_both:
            self._fleethub_zero_in = announce(params)

    def get_theirs(self: Any, params: list[tuple[int, bytes]]) -> None:
        get_extensions(self, params)
        self._fleethub_zero_out = send_both and announced(params)

    async def send(self: Any, chunk: Any) -> None:
        # aiortc's _send_chunk with serialize_packet's checksum left at zero
        if not self._fleethub_zero_out or type(chunk) is InitChunk:
            await send_chunk(self, chunk)
            return
        self._RTCSctpTransport__log_debug("> %s", chunk)
        await self._RTCSctpTransport__transport._send_data(
            pack("!HHL", self._local_port, self._remote_port, self._remote_verification_tag) + ZERO + bytes(chunk))

    for name, fn, wrapped in (("_set_extensions", set_ours, set_extensions),
                              ("_get_extensions", get_theirs, get_extensions), ("_send_chunk", send, send_chunk)):
        fn.__wrapped__ = wrapped  # type: ignore[attr-defined]
        setattr(RTCSctpTransport, name, fn)
    _applied = True
