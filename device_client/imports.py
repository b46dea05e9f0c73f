"""Modules the agent loads on first use, imported in a worker thread.

An agent defers what it may never need: numpy until a memory test runs, httpx until a page map goes
up, pyjwt and cryptography until a tunnel opens (bench/agent_footprint.py measures the memory this
saves). Importing runs the modules' code, 150-200 ms of CPU for each of these and up to a second of
wall time on a busy 2-core machine (2026-11-29). Done on the agent's trio thread, that stalls
everything the agent does meanwhile: the link's heartbeats, other commands, a workload's supervision.
A hub that expects a heartbeat every 0.5 s (the tests' settings) then closes the link after 1.5 s
without one, and the command being answered fails with 504 device_unreachable.

In a worker thread an import holds the GIL only in slices (sys.getswitchinterval), so the trio thread
keeps running. Python's per-module import locks make a second caller arriving during an import wait
for it rather than run its own, and a module already loaded costs a dict lookup, not a thread.
"""

from __future__ import annotations

import importlib
import sys

import trio


async def load(*names: str) -> None:
    """Import ``names`` (absolute module names) off the trio thread, unless all are loaded."""
    missing = [name for name in names if name not in sys.modules]
    if missing:
        await trio.to_thread.run_sync(_import_all, missing)


def _import_all(names: list[str]) -> None:
    for name in names:
        importlib.import_module(name)
