"""What the kit does to the device under test, in order, and which rule each observation proves.

One device, several links: the first carries the handshake, heartbeats, commands, secret files,
configurations (applied, rejected, interrupted by a link drop and by a reboot), key rotation and a
short memory test; then two reboots (with a reason and without), a drain, an oversized frame and
the hub's closes (4002, 4004, 4408, 4409, 4003 with a 401 after it, 4426, 4001) each end a link and
the device must come back as the document says. The kit answers the handshake with the hub's own
link side (device_client/shared/link/hubside.py): a first frame the hub would refuse is closed with the
hub's code and reason, and every link the kit ends gets a close code (never a dropped socket,
1006). Timings are read off the kit's own clock. The kit writes only under
/var/lib/fleethub/secrets/qualify/ and wipes what it put at the end; its configurations run at most
``sleep`` as the workload and it ends on an empty one, so run it against a device under test, not
one in service.

The steps are grouped by subject: commands.py, files.py (secret files and configurations),
memtests.py, reboots.py, closes.py (drain, limits, the hub's closes) and refusals.py (revoked
token, 401, out of order, unknown version); run.py holds what they share.
"""

from __future__ import annotations

from . import closes, commands, files, memtests, reboots, refusals
from .run import Options, Run, Verdict

__all__ = ["Options", "Qualification", "Run", "Verdict"]

# In order; each takes the run and the live link and returns the link to go on with (None: the
# device did not come back, and the rules not yet observed are NOT RUN).
STEPS = (commands.commands, files.files, commands.idempotency, files.configuration, files.config_rejected,
         commands.keys, commands.heartbeats, memtests.memory_test, files.interrupted_apply, reboots.reboot,
         closes.drain, reboots.reboot_without_reason, closes.oversized, closes.heartbeat_timeout_close,
         closes.draining_close, closes.hello_timeout_close, refusals.out_of_order, refusals.revoked,
         refusals.unknown_version, closes.superseded_close)


class Qualification(Run):
    async def run(self) -> dict[str, Verdict]:
        conn = await self.listener.next_conn(self.o.first_timeout)
        if conn is None:
            if self.listener.refused:  # it tried: say why it was turned away, not just "not run"
                self.check("T1", False, f"handshake refused {len(self.listener.refused)}x, last: "
                                        f"{self.listener.refused[-1]}")
            self.not_run(f"no device connected within {self.o.first_timeout:.0f} s")
            return self.verdicts
        hello = await self.handshake(conn)
        if hello is None:
            self.not_run("the handshake failed")
            return self.verdicts
        for step in STEPS:
            nxt = await step(self, conn)
            if nxt is None:
                self.not_run(f"the device did not come back after {step.__name__.replace('_', ' ')}")
                return self.verdicts
            conn = nxt
        await self.cmd(conn, "files.wipe", {})  # leave nothing of ours on the device
        await self.end(conn)
        return self.verdicts

