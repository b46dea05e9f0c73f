"""Taking bad pages out of use.

A real device whose agent runs as root soft-offlines each page through
/sys/devices/system/memory/soft_offline_page (the kernel migrates the page's data and never hands
the frame out again); that needs physical addresses, CONFIG_MEMORY_FAILURE and root. It is never
done on a simulated device (``real=False``): those pages belong to the host running the simulation.
The retired list (store.py) is kept either way and re-applied at every boot before the workload
starts (soft offlining does not survive a reboot). On a simulated device "out of use" means the
tester ignores those pages of its memory from then on.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("fleethub.agent.memtest")

# More retired pages than this is a memory fault, not a few weak cells: the health report says so and
# a run's verdict counts it. Here, beside the retiring, because the tester's health needs it at start
# and runner.py (numpy) is imported only when a run starts.
FAULT_PAGES = 32
SOFT_OFFLINE = Path("/sys/devices/system/memory/soft_offline_page")


def can_soft_offline(real: bool, address_kind: str) -> bool:
    return real and address_kind == "physical" and os.geteuid() == 0 and SOFT_OFFLINE.exists()


def soft_offline(addresses: list[int], *, real: bool, address_kind: str = "physical") -> list[int]:
    """Offline what can be; the addresses the kernel accepted."""
    if not can_soft_offline(real, address_kind):
        return []
    done = []
    for address in addresses:
        try:
            SOFT_OFFLINE.write_text(f"{address:#x}\n")
            done.append(address)
        except OSError as exc:
            log.warning("memtest: the kernel refused to soft-offline page %#x: %s", address, exc)
    return done
