"""The device's system facts (device_client/shared/systemfacts.py) read from /proc and statvfs: no
dependency, since the agent must stay light (bench/agent_footprint.py).

``SystemSampler.sample()`` is what the hello's ``system`` and each telemetry sample carry. CPU use
is the share of busy time between two samples, so the sampler keeps the previous counters; the
first sample is the average since boot. Whatever cannot be read (no /proc, a root that vanished) is
left out rather than guessed: the hub shows what is missing as unknown.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
from pathlib import Path
from typing import Any

from .shared.systemfacts import MAX_IP_ADDRESSES

PROC = Path("/proc")


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def uptime_seconds(proc: Path = PROC) -> float | None:
    text = _read(proc / "uptime")
    try:
        return round(float(text.split()[0]), 1) if text else None
    except (ValueError, IndexError):
        return None


def cpu_counters(proc: Path = PROC) -> tuple[int, int] | None:
    """(idle, total) jiffies of all CPUs since boot; idle counts iowait too."""
    text = _read(proc / "stat")
    if not text or not text.startswith("cpu "):
        return None
    try:
        values = [int(v) for v in text.split("\n", 1)[0].split()[1:]]
    except ValueError:
        return None
    # guest time is already inside user and nice: the first eight columns are the whole
    values = values[:8]
    if len(values) < 4:
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return idle, sum(values)


def busy_percent(before: tuple[int, int] | None, after: tuple[int, int]) -> float | None:
    idle0, total0 = before or (0, 0)
    elapsed = after[1] - total0
    if elapsed <= 0:
        return None
    return round(min(max(100.0 * (1 - (after[0] - idle0) / elapsed), 0.0), 100.0), 1)


def memory(proc: Path = PROC) -> dict[str, Any]:
    text = _read(proc / "meminfo") or ""
    info = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("MemTotal", "MemAvailable") and rest.split():
            info[name] = int(rest.split()[0]) * 1024
    total, available = info.get("MemTotal"), info.get("MemAvailable")
    if not total or available is None:
        return {}
    return {"memoryTotalBytes": total, "memoryPercent": round(min(max(100.0 * (1 - available / total), 0.0), 100.0), 1)}


def disk(path: Path) -> dict[str, Any]:
    try:
        st = os.statvfs(path)
    except OSError:
        return {}
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    usable = used + st.f_bavail * st.f_frsize  # what df counts: the root-reserved blocks are not usable
    if not st.f_blocks or usable <= 0:
        return {}
    return {"diskTotalBytes": st.f_blocks * st.f_frsize, "diskPercent": round(min(100.0 * used / usable, 100.0), 1)}


def ip_addresses(proc: Path = PROC) -> list[str]:
    """The machine's own addresses, IPv4 from the routing trie's local entries and IPv6 from
    if_inet6; loopback and link-local left out (nobody reaches a device by them), at most
    MAX_IP_ADDRESSES, in the kernel's order."""
    found: list[str] = []
    trie = _read(proc / "net" / "fib_trie") or ""
    lines = trie.splitlines()
    for previous, line in itertools.pairwise(lines):
        # "|-- 192.0.2.7" followed by "/32 host LOCAL": an address of this machine
        if line.strip().startswith("/32 host LOCAL") and previous.strip().startswith("|--"):
            found.append(previous.strip()[3:].strip())
    for line in (_read(proc / "net" / "if_inet6") or "").splitlines():
        hexed = line.split()[0] if line.split() else ""
        if len(hexed) == 32:
            found.append(":".join(hexed[i:i + 4] for i in range(0, 32, 4)))
    out: list[str] = []
    for text in found:
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            continue
        shown = str(address)
        if address.is_loopback or address.is_link_local or shown in out:
            continue
        out.append(shown)
    return out[:MAX_IP_ADDRESSES]


class SystemSampler:
    """Samples of one device; ``disk_path`` is the filesystem whose use is reported (the device root)."""

    def __init__(self, disk_path: Path, proc: Path = PROC) -> None:
        self.disk_path = Path(disk_path)
        self.proc = proc
        self._cpu: tuple[int, int] | None = None

    def sample(self) -> dict[str, Any]:
        facts: dict[str, Any] = {"ipAddresses": ip_addresses(self.proc)}
        uptime = uptime_seconds(self.proc)
        if uptime is not None:
            facts["uptimeSeconds"] = uptime
        counters = cpu_counters(self.proc)
        if counters is not None:
            busy = busy_percent(self._cpu, counters)
            if busy is not None:
                facts["cpuPercent"] = busy
            self._cpu = counters
        facts.update(memory(self.proc))
        facts.update(disk(self.disk_path))
        return facts
