"""CPU per MiB of the tunnel peers with webrtc/receive.py and webrtc/send.py each on or off, A/B in one run.

    python bench/tunnel_ab.py [--smoke] [--mb 8] [--rounds 8] [--no-write]
        [--records | --pmtu | --message | --sack | --reads | --sack-step | --data-in-place
         | --zero-checksum | --sack16]

With ``--records``: webrtc/records.py's direct OpenSSL calls against pyOpenSSL's methods
(``records.DIRECT``), receive.py and send.py on in both. With ``--pmtu``: the DATA chunk size the path
probe confirmed (webrtc/pmtu.py) against aiortc's 1,160 bytes, everything else on in both. With
``--message``: messages cut to whole DATA chunks (webrtc/forward.py's ``message_size``) against 32 KiB
whole, the probed chunk size in both. With ``--sack``: a SACK every 8 packets and a burst of 8 per
SACK (webrtc/sctp.py) against a SACK every 4 (whose burst of 4 packets is about aiortc's 4 x 1,160 bytes).
With ``--reads``: up to 16 datagrams per readiness of the socket while the loop is idle
(webrtc/receive.py ``read_while_idle``) against asyncio's one. With ``--sack-step``: a due SACK sent in
the callback that finds it due (webrtc/sctp.py ``STEP_SACKS``, webrtc/stepped.py) against from a task.
With ``--data-in-place``: a packet of one chunk, DATA with the next TSN in order or a SACK, handled in place
(webrtc/packets.py ``ONE_CHUNK_IN_PLACE``) against aiortc's parse and chunk dispatch. With ``--zero-checksum``:
packets sent with a checksum of zero (webrtc/checksum.py, RFC 9653) against CRC32c. With ``--sack16``:
a SACK every 16 packets (``FLEETHUB_SCTP_SACK_EVERY=16``) against the default 8.

Two peers (webrtc/peer.py, as the CLI and the agent run them) in this one process, one association on
loopback, a TCP sender and sink at its ends (tests/webrtc/peers.py). Between copies of ``--mb`` MiB,
the inline receive (receive.py: the connection's ``Inline``) and the segmented send (send.py: the
replaced ``_send_data``) are switched on or off, so every variant runs on the same association, in
interleaved rounds (the order reversed every other round, the first round a warm-up). Reported: the
process's CPU per MiB (both peers and the TCP ends) per variant, and each variant's difference from
the one with both off, paired by round. The machine is shared: a paired difference says more than
the figures themselves. webrtc/packets.py's other changes are on throughout (FLEETHUB_AIORTC_AS_IS
would turn off everything, and is not for this script).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio
from _common import (
    Verdicts,
    command_line,
    facts_line,
    loadavg,
    log,
    machine_facts,
    md_table,
    write_section,
)

VARIANTS = ("neither", "receive.py", "send.py", "both")
RECORD_VARIANTS = ("pyopenssl", "records.py")  # --records
PMTU_VARIANTS = ("1160-byte chunks", "pmtu.py")  # --pmtu
MESSAGE_VARIANTS = ("32 KiB messages", "whole chunks")  # --message
SACK_VARIANTS = ("a SACK every 4 packets", "every 8")  # --sack
READ_VARIANTS = ("a datagram per readiness", "read while idle")  # --reads
STEP_VARIANTS = ("a SACK from a task", "a SACK sent at once")  # --sack-step
SACK16_VARIANTS = ("a SACK every 8 packets", "every 16")  # --sack16
IN_PLACE_VARIANTS = ("every packet parsed by aiortc", "one DATA or SACK chunk in place")  # --data-in-place
ZERO_VARIANTS = ("CRC32c checksums", "zero checksums")  # --zero-checksum
# one change against its absence: option -> (variants, what is compared, help); its section tunnel_ab_OPTION
SINGLE = {
    "records": (RECORD_VARIANTS, "webrtc/records.py's direct OpenSSL calls against pyOpenSSL's methods",
                "A/B records.py's direct OpenSSL calls instead"),
    "pmtu": (PMTU_VARIANTS, "webrtc/pmtu.py's probed DATA chunks against aiortc's 1,160 bytes",
             "A/B pmtu.py's probed chunk size instead"),
    "message": (MESSAGE_VARIANTS, "messages of whole DATA chunks (forward.message_size) against 32 KiB",
                "A/B messages cut to whole DATA chunks (forward.message_size) against 32 KiB whole"),
    "sack": (SACK_VARIANTS, "a SACK every 8 packets and a burst of 8 per SACK against every 4",
             "A/B a SACK every 8 packets and a burst of 8 per SACK (sctp.py) against every 4"),
    "reads": (READ_VARIANTS, "up to 16 datagrams per readiness while the loop is idle against one",
              "A/B receive.py's reads of several datagrams per readiness against asyncio's one"),
    "sack_step": (STEP_VARIANTS, "a due SACK sent at once against from a task a loop turn later",
                  "A/B a due SACK sent in the callback that finds it due (sctp.py STEP_SACKS) against from a task"),
    "data_in_place": (IN_PLACE_VARIANTS, "a packet of one DATA chunk in order or one SACK handled in place against aiortc's parse",
                      "A/B packets.py's in-place handling of a packet of one DATA or SACK chunk against aiortc's _handle_data"),
    "zero_checksum": (ZERO_VARIANTS, "packets sent with a checksum of zero (RFC 9653) against CRC32c",
                      "A/B checksum.py's zero checksums (RFC 9653) against CRC32c on every packet"),
    "sack16": (SACK16_VARIANTS, "a SACK every 16 packets and a burst of 16 per SACK against every 8",
               "A/B a SACK every 16 packets (FLEETHUB_SCTP_SACK_EVERY=16) against every 8"),
}


async def measure(mb: int, rounds: int, variants: tuple[str, ...] = VARIANTS) -> dict[str, list[tuple[float, float]]]:
    from aiortc.rtcdtlstransport import RTCDtlsTransport

    from tests.webrtc.peers import connect_pair

    received, want, arrived = 0, 0, trio.Event()

    async def sink(stream: trio.SocketStream) -> None:
        nonlocal received
        async with stream:
            while data := await stream.receive_some(1 << 20):
                received += len(data)
                if received >= want:
                    arrived.set()

    from webrtc import forward, packets, receive, records, sctp

    results: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, sink, 0, host="127.0.0.1"))
        pair = await connect_pair(listeners[0].socket.getsockname()[1])
        connections = [peer.conn.pc.sctp.transport.transport._connection for peer in (pair.client, pair.device)]
        inlines = [c._fleethub_inline for c in connections]
        batched = RTCDtlsTransport._send_data
        if any(i is None for i in inlines) or not hasattr(batched, "__wrapped__"):
            raise SystemExit("receive.py or send.py is not applied (FLEETHUB_AIORTC_AS_IS set, or not Linux?)")
        if variants == READ_VARIANTS and not all(
                hasattr(c._nominated[1].protocol.transport, "_fleethub_reads") for c in connections):
            raise SystemExit("receive.py's reader is not applied (FLEETHUB_RECEIVE_ONE set?)")
        associations = [peer.conn.pc.sctp for peer in (pair.client, pair.device)]
        with trio.move_on_after(5):  # the probes started as the association was established: a round trip
            while None in (probed := [getattr(a, "_fleethub_chunk", None) for a in associations]):
                await trio.sleep(0.01)
        if variants not in (VARIANTS, RECORD_VARIANTS) and None in probed:  # they need the probed size
            raise SystemExit(f"the path probe confirmed no larger chunk ({probed}; FLEETHUB_TUNNEL_PMTU=0 set?)")

        sack_every = sctp.SACK_EVERY
        zero_agreed = all(a._fleethub_zero_out for a in associations)
        if variants == ZERO_VARIANTS and not zero_agreed:
            raise SystemExit("the peers did not agree on zero checksums (FLEETHUB_SCTP_CRC32C set?)")

        async def switch(variant: str) -> None:
            both = variant in ("both",) + RECORD_VARIANTS + PMTU_VARIANTS + MESSAGE_VARIANTS + SACK_VARIANTS + READ_VARIANTS + STEP_VARIANTS + SACK16_VARIANTS + IN_PLACE_VARIANTS + ZERO_VARIANTS
            receive.READ_MORE = variant != READ_VARIANTS[0]
            packets.ONE_CHUNK_IN_PLACE = variant != IN_PLACE_VARIANTS[0]
            sctp.STEP_SACKS = variant != STEP_VARIANTS[0]
            forward.FIT_MESSAGES = variant != MESSAGE_VARIANTS[0]
            sctp.SACK_EVERY = {SACK_VARIANTS[0]: 4, SACK16_VARIANTS[0]: 8, SACK16_VARIANTS[1]: 16}.get(variant, sack_every)
            for association, chunk in zip(associations, probed, strict=True):
                # without the in-place path a zero checksum would be filled in, then checked by aiortc
                association._fleethub_zero_out = variant not in (ZERO_VARIANTS[0], IN_PLACE_VARIANTS[0]) and zero_agreed
                association._fleethub_chunk = None if variant == PMTU_VARIANTS[0] else chunk
            for connection, inline in zip(connections, inlines, strict=True):
                connection._fleethub_inline = inline if both or variant == "receive.py" else None
            RTCDtlsTransport._send_data = batched if both or variant == "send.py" else batched.__wrapped__
            records.DIRECT = variant != "pyopenssl"

        stream = await trio.open_tcp_stream("127.0.0.1", pair.listen_port)
        block = os.urandom(1 << 20)
        try:
            for r in range(rounds + 1):
                for variant in variants if r % 2 == 0 else variants[::-1]:
                    await pair.client._thread.run(switch(variant))
                    await trio.sleep(0.2)  # what the last copy left in flight is acknowledged
                    arrived, want = trio.Event(), received + (mb << 20)
                    cpu, wall = time.process_time(), time.perf_counter()
                    with trio.fail_after(300):
                        for _ in range(mb):
                            await stream.send_all(block)
                        await arrived.wait()
                    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                    if r:
                        results[variant].append((cpu / mb * 1000, mb * (1 << 20) / wall / 1e6))
                if r:
                    log(f"round {r}: " + ", ".join(f"{v} {results[v][-1][0]:.1f}" for v in variants))
        finally:
            await pair.client._thread.run(switch("both"))
            await stream.aclose()
            await pair.client.close()
            await pair.device.close()
            nursery.cancel_scope.cancel()
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--mb", type=int, default=8)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--quiet-wait", type=float, default=30.0)
    which = p.add_mutually_exclusive_group()
    for option, (_variants, _what, help_) in SINGLE.items():
        which.add_argument(f"--{option.replace('_', '-')}", action="store_true", help=help_)
    args = p.parse_args()
    if args.smoke:
        args.mb, args.rounds = 1, 1
    single = next((option for option in SINGLE if getattr(args, option)), None)
    variants, what = SINGLE[single][:2] if single else (VARIANTS, "receive.py and send.py on and off")
    section = f"tunnel_ab_{single}" if single else "tunnel_ab"
    base = variants[0]
    facts = machine_facts(0 if args.smoke else args.quiet_wait)
    results = trio.run(measure, args.mb, args.rounds, variants)

    def cpu(v: str) -> list[float]:
        return [x[0] for x in results[v]]

    diffs = {v: [b - a for a, b in zip(cpu(base), cpu(v), strict=True)] for v in variants[1:]}
    rows = [[v, f"{median(cpu(v)):.1f}", " ".join(f"{x:.0f}" for x in cpu(v)),
             "" if v == base else f"{median(diffs[v]):+.1f}",
             f"{median(x[1] for x in results[v]):.1f}"] for v in variants]
    body = "\n\n".join([
        f"## Tunnel peers: {what} in one run (bench/tunnel_ab.py)", f"`{command_line()}`",
        facts_line(facts) + f"; load average at end {loadavg()}",
        (f"Two peers in one process, one association on loopback; copies of {args.mb} MiB one way, the "
         f"variants switched between copies, {args.rounds} interleaved round(s) after a warm-up. CPU per MiB "
         "is the whole process's (both peers and the TCP ends)."),
        md_table(["variant", "CPU ms/MiB (median)", "per round", f"paired difference from {base} (median)",
                  "MB/s (median)"], rows),
    ])
    verdicts = Verdicts(section, smoke=args.smoke)
    saved = diffs[variants[-1]]
    verdicts.at_least(f"CPU per MiB saved by {variants[-1] if single else 'both'} (paired median)",
                      round(-median(saved), 1), 0, " ms")
    body += "\n\n" + verdicts.markdown() + "\n"
    print(body)
    if not args.no_write:
        print(f"wrote {write_section(section, body, smoke=args.smoke)}")
    return verdicts.exit_code()


if __name__ == "__main__":
    sys.exit(main())
