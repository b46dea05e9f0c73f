"""Hardware readings: real where the machine has them, simulated (and documented as such) otherwise.

Real: the hottest /sys/class/thermal/thermal_zone*/temp, EDAC counters summed over
/sys/devices/system/edac/mc/mc*/{ce,ue}_count (-1 when there is no EDAC driver), and
HardwareCorrupted from /proc/meminfo.

Simulated (a simulated device, ``simulated=True``): the temperature is a model, not a sensor. It
starts at ``AMBIENT_C`` and approaches ``AMBIENT_C + RISE_C`` as memory work accumulates
(1 - exp(-work / heat_bytes), heat_bytes = 64 sweeps of the tested region by default); the work
cools off with time on the trio clock (time constant ``COOL_S``), so a device left alone (an idle
decay's wait, the time between runs) is cool again. The EDAC
counters count what the simulated memory did: correctable = mismatches that did not reproduce,
uncorrectable = pages confirmed bad; hardware-corrupted bytes = retired pages x page size; the
kernel's memory-error lines are one simulated "soft offline" line per retired page. A real device's
lines are read from /dev/kmsg (root) and filtered for memory errors.
"""

from __future__ import annotations

import glob
import math
import os
import re
from pathlib import Path

import trio

# The faults a simulated device's memory may have (faults.py acts them out). Named here, with the rest of
# the simulated hardware, so the CLI's --memory-fault choices need no numpy.
KINDS = ("stuck", "weak", "data_line", "address_line", "thermal", "intermittent")

AMBIENT_C = 40.0
RISE_C = 45.0
COOL_S = 120.0
KERNEL_LINES = 20
_MEMORY_ERROR = re.compile(r"EDAC|Memory failure|soft.offline|Hardware Error|MCE|memory error|HardwareCorrupted",
                           re.IGNORECASE)


def _read_int(path: str) -> int | None:
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class Hardware:
    def __init__(self, *, simulated: bool, heat_bytes: int = 64 << 20) -> None:
        self.simulated = simulated
        self.heat_bytes = max(1, heat_bytes)
        self.work = 0.0
        self.ce = 0
        self.ue = 0
        self._at: float | None = None  # trio time the work was last cooled to

    def _cool(self) -> None:
        now = trio.current_time()
        if self._at is not None and now > self._at:
            self.work *= math.exp(-(now - self._at) / COOL_S)
        self._at = now

    def heat(self, nbytes: int) -> None:
        self._cool()
        self.work += nbytes

    def temp_c(self) -> float | None:
        if self.simulated:
            self._cool()
            return AMBIENT_C + RISE_C * (1 - math.exp(-self.work / self.heat_bytes))
        temps = [t for t in (_read_int(p) for p in glob.glob("/sys/class/thermal/thermal_zone*/temp")) if t]
        return max(temps) / 1000 if temps else None

    def edac(self) -> dict[str, int]:
        if self.simulated:
            return {"correctable": self.ce, "uncorrectable": self.ue}
        out = {}
        for name, key in (("ce_count", "correctable"), ("ue_count", "uncorrectable")):
            values = [_read_int(p) for p in glob.glob(f"/sys/devices/system/edac/mc/mc*/{name}")]
            values = [v for v in values if v is not None]
            out[key] = sum(values) if values else -1
        return out

    def hardware_corrupted_bytes(self, retired_pages: int, page_size: int) -> int:
        if self.simulated:
            return retired_pages * page_size
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("HardwareCorrupted:"):
                    return int(line.split()[1]) * 1024
        except (OSError, ValueError):
            pass
        return -1

    def kernel_lines(self, retired: list[int]) -> list[str]:
        """Recent kernel lines about memory errors (the newest ``KERNEL_LINES``)."""
        if self.simulated:
            return [f"[simulated] Memory failure: {a >> 12:#x}: soft offline: page migration succeeded"
                    for a in retired[-KERNEL_LINES:]]
        lines: list[str] = []
        try:
            fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return []
        try:
            while True:
                try:
                    record = os.read(fd, 8192).decode(errors="replace")
                except BlockingIOError:
                    break
                except OSError:  # EPIPE: a record was overwritten while reading; go on
                    continue
                message = record.split(";", 1)[-1].strip()
                if _MEMORY_ERROR.search(message):
                    lines.append(message)
        finally:
            os.close(fd)
        return lines[-KERNEL_LINES:]
