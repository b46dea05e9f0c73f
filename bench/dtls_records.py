"""What one DTLS record of a tunnel chunk costs through pyOpenSSL's methods and through OpenSSL's calls directly.

    python bench/dtls_records.py [--smoke] [--records 20000] [--rounds 3] [--no-write]

Two real DTLS connections in this process on memory BIOs (tests/webrtc/dtls.py), handshake done; a record
of 1,200 random bytes is sealed on one (send, bio_read) and opened on the other (bio_write, recv), as a
tunnel's sender and receiver do per SCTP chunk. Per record, µs of this process's CPU, the two ways
alternating by round: pyOpenSSL's ``Connection`` methods (``records.DIRECT = False``) and webrtc/records.py's
direct calls. No IO and no aiortc: only the four calls' cost, which bench/tunnel_ab.py --records measures
in the peers.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import Verdicts, command_line, facts_line, loadavg, machine_facts, md_table, write_section  # noqa: E402


def per_record(count: int, direct: bool) -> float:
    from tests.webrtc.dtls import dtls_pair
    from webrtc import records

    a, b = dtls_pair()
    data = os.urandom(1200)
    records.DIRECT = direct
    try:
        started = time.process_time()
        for _ in range(count):
            out = records.open_record(b, records.seal(a, data))
        spent = time.process_time() - started
    finally:
        records.DIRECT = True
    assert out == data
    return spent / count * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--records", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--quiet-wait", type=float, default=10.0)
    args = p.parse_args()
    if args.smoke:
        args.records, args.rounds = 500, 1
    facts = machine_facts(0 if args.smoke else args.quiet_wait)
    wrapped, direct = [], []
    for r in range(args.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        for way in order:
            (direct if way else wrapped).append(per_record(args.records, way))
    rows = [["pyOpenSSL's methods (send, bio_read, bio_write, recv)", f"{median(wrapped):.2f}",
             " ".join(f"{x:.2f}" for x in wrapped)],
            ["webrtc/records.py (SSL_write, BIO_read, BIO_write, SSL_read)", f"{median(direct):.2f}",
             " ".join(f"{x:.2f}" for x in direct)]]
    body = "\n\n".join([
        "## A DTLS record of a tunnel chunk: pyOpenSSL's methods against OpenSSL's calls (bench/dtls_records.py)",
        f"`{command_line()}`", facts_line(facts) + f"; load average at end {loadavg()}",
        (f"Two DTLS connections on memory BIOs in one process; {args.records} records of 1,200 bytes sealed on "
         f"one and opened on the other per round, {args.rounds} round(s), the two ways alternating. µs of "
         "CPU per record (both ends)."),
        md_table(["way", "µs per record (median)", "per round"], rows),
    ])
    verdicts = Verdicts("dtls_records", smoke=args.smoke)
    verdicts.at_least("µs per record saved by records.py (median)", round(median(wrapped) - median(direct), 2), 0,
                      " µs")
    body += "\n\n" + verdicts.markdown() + "\n"
    print(body)
    if not args.no_write:
        print(f"wrote {write_section('dtls_records', body, smoke=args.smoke)}")
    return verdicts.exit_code()


if __name__ == "__main__":
    sys.exit(main())
