"""Where a connected device's memory goes in the hub: tracemalloc and object counts per device.

    python bench/memory_profile.py [--devices 2000] [--top 25] [--reconnect] [--settle 3] [--frames 1]
    python bench/memory_profile.py --gc-pauses [--devices 15000] [--hold 30]

Not a benchmark (tracemalloc slows the hub and adds its own memory): an explanation of capacity.py's
KiB/device. The hub runs in this process (``hub.server.run_hub``, embedded PostgreSQL in a temp dir)
under tracemalloc; the devices (``device_client.agent.Agent``) run in a bench/_simworker.py process.
After they are all linked, the snapshot difference is grouped by source line and by file, divided by
the number of devices, and the live objects are counted by type (also per device), and so are the live
trio tasks by name. ``--settle`` is how long the snapshot waits after the last link (idle actors park
after a second; the background work a link starts takes longer with many devices), ``--frames N``
keeps N frames per allocation and also groups the difference by whole traceback: who allocated what
stays, not only the line that did. ``--reconnect`` then drops every link and makes it again, and shows what the first
links left behind. ``--gc-pauses`` (no tracemalloc) instead times every cyclic-GC collection of the hub
process while the devices connect and then hold: with hundreds of thousands of long-lived objects a full
(generation 2) collection stops the event loop for as long as it takes.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections import Counter
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio  # noqa: E402

from _common import (OUT_DIR, Worker, command_line, facts_line, insert_devices, log, machine_facts,  # noqa: E402
                     shm_tempdir, write_section)


def task_census() -> Counter:
    """Live trio tasks by name (walks the task tree from the root)."""
    counts: Counter = Counter()
    stack = [trio.lowlevel.current_root_task()]
    while stack:
        t = stack.pop()
        counts[t.name.rsplit(".", 2)[-2] + "." + t.name.rsplit(".", 1)[-1] if "." in t.name else t.name] += 1
        for nursery in t.child_nurseries:
            stack.extend(nursery.child_tasks)
    return counts


def type_counts() -> Counter:
    gc.collect()
    return Counter(type(o).__qualname__ for o in gc.get_objects())


async def gc_pauses(services, worker, devices, sim_root: Path, args) -> None:
    """Time every cyclic-GC collection (gc.callbacks) while the devices connect and then hold."""
    pauses: list[tuple[int, float, int]] = []
    started: dict = {}

    def cb(phase: str, info: dict) -> None:
        if phase == "start":
            started["t"] = time.perf_counter()
        elif "t" in started:
            pauses.append((info["generation"], time.perf_counter() - started.pop("t"), info["collected"]))

    gc.callbacks.append(cb)

    async def freezer() -> None:
        # the candidate fix: move what survived so far to the permanent generation, which no
        # collection scans again
        while True:
            await trio.sleep(args.gc_freeze)
            gc.freeze()

    if args.gc_freeze:
        services.nursery.start_soon(freezer)
    try:
        (sim_root / "rest.json").write_text(json.dumps(devices[1:]))
        t0 = time.monotonic()
        await trio.to_thread.run_sync(partial(worker.request, {"cmd": "add", "devices_file": str(sim_root / "rest.json")}, 900))
        with trio.fail_after(300):
            while len(services.links) < args.devices:
                await trio.sleep(0.2)
        connect_s = time.monotonic() - t0
        during_connect = list(pauses)
        await trio.sleep(args.hold)
    finally:
        gc.callbacks.remove(cb)
    objects = len(gc.get_objects())
    lines = [f"gc.freeze() every {args.gc_freeze:g} s" if args.gc_freeze else "no gc.freeze()",
             f"{args.devices} devices linked in {connect_s:.1f}s; {objects:,} objects tracked by the GC "
             f"({objects / args.devices:.0f} per device); gc thresholds {gc.get_threshold()}", ""]
    for label, ps in (("while connecting", during_connect), (f"connect + {args.hold:g} s hold", pauses)):
        for g in (0, 1, 2):
            xs = sorted(d for gen, d, _ in ps if gen == g)
            if xs:
                lines.append(f"{label}: generation {g}: {len(xs)} collections, total {sum(xs) * 1e3:.0f} ms, "
                             f"max {xs[-1] * 1e3:.1f} ms, median {xs[len(xs) // 2] * 1e3:.2f} ms")
    text = "\n".join(lines)
    print(text)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / f"gc_pauses-{args.devices}{'-freeze' if args.gc_freeze else ''}.txt").write_text(text + "\n")
    if args.write:
        name = "gc_pauses_freeze" if args.gc_freeze else "gc_pauses"
        title = ("Cyclic GC pauses with gc.freeze() every %g s (candidate fix)" % args.gc_freeze if args.gc_freeze
                 else "Cyclic GC pauses of the hub process")
        write_section(name, "\n".join([
            f"## {title} (bench/memory_profile.py --gc-pauses)", "", f"`{command_line()}`", "",
            facts_line(args.facts), "",
            "The hub in the profiling process (`run_hub`), the devices in a bench/_simworker.py process; every "
            "collection timed with `gc.callbacks` (stop-the-world for the trio loop).", "", "```", text, "```"]),
            smoke=False)


# The project's own packages: an allocation with one of their frames in its kept traceback is ours.
OUR_PACKAGES = ("hub", "actors", "storage", "device_client", "webrtc")
OURS = tuple(str(Path(__file__).resolve().parent.parent / pkg) + "/" for pkg in OUR_PACKAGES)


async def main(args) -> None:
    from hub.auth.pat import digest, new_pat
    from hub.server import run_hub
    from hub.settings import Settings

    data = Path(tempfile.mkdtemp(prefix="fleethub-bench-mem-"))
    sim_root = shm_tempdir("fleethub-bench-memsim-")
    worker = None
    try:
        async with trio.open_nursery() as nursery:
            services, base_url = await nursery.start(partial(
                run_hub, Settings(data_dir=data, port=0, heartbeat_interval=30.0, log_level="WARNING")))
            now = services.clock.now()
            org = await services.stores.orgs.create_org("mem", now)
            user = await services.stores.orgs.create_user(f"m-{uuid.uuid4().hex[:6]}@x.local", now)
            await services.stores.orgs.add_member(org["id"], user["id"], "admin", now)
            pat_id, secret = new_pat()
            await services.stores.tokens.create_pat(pat_id, user["id"], digest(secret), now)
            dsn = services.embedded_pg.dsn
            devices = await trio.to_thread.run_sync(insert_devices, dsn, str(org["id"]), args.devices)
            worker = Worker("agent", "--hub", base_url, "--data-dir", str(sim_root), name="mem-sim")
            # one device first, so that first-use caches and imports are in the baseline
            (sim_root / "d0.json").write_text(json.dumps(devices[:1]))
            await trio.to_thread.run_sync(partial(worker.request, {"cmd": "add", "devices_file": str(sim_root / "d0.json")}, 120))
            await trio.sleep(1)
            if args.gc_pauses:
                await gc_pauses(services, worker, devices, sim_root, args)
                nursery.cancel_scope.cancel()
                return
            counts0, tasks0 = type_counts(), task_census()
            snap0 = tracemalloc.take_snapshot()
            (sim_root / "d1.json").write_text(json.dumps(devices[1:]))
            t0 = time.monotonic()
            await trio.to_thread.run_sync(partial(worker.request, {"cmd": "add", "devices_file": str(sim_root / "d1.json")}, 600))
            with trio.fail_after(max(120, args.devices * 0.2)):  # slower with --frames
                while len(services.links) < args.devices:
                    await trio.sleep(0.2)
            log(f"{args.devices} linked in {time.monotonic() - t0:.1f}s; settling {args.settle:g} s")
            await trio.sleep(args.settle)
            counts1, tasks1 = type_counts(), task_census()
            snap1 = tracemalloc.take_snapshot()
            n = args.devices - 1
            flt = [tracemalloc.Filter(False, tracemalloc.__file__)]
            snap0, snap1 = snap0.filter_traces(flt), snap1.filter_traces(flt)
            by_traceback = []
            if args.frames > 1:
                stats = snap1.compare_to(snap0, "traceback")
                ours = sum(st.size_diff for st in stats if any(fr.filename.startswith(OURS) for fr in st.traceback))
                theirs = sum(st.size_diff for st in stats) - ours
                by_traceback += ["", f"made on a path through our code (a frame of {', '.join(OUR_PACKAGES)} among the "
                                 f"{args.frames} innermost): {ours / n / 1024:.1f} KiB/device; the rest (trio, "
                                 f"hypercorn, Quart, wsproto, h11 with none of ours that deep): "
                                 f"{theirs / n / 1024:.1f} KiB/device"]
                by_traceback += ["", f"by traceback (KiB/device; the {args.frames} innermost frames, outermost first):"]
                for st in stats[:args.top]:
                    by_traceback.append(f"  {st.size_diff / n / 1024:7.2f}  {st.count_diff / n:6.1f} blocks")
                    by_traceback += [f"           {fr.filename.split('site-packages/')[-1]}:{fr.lineno}"
                                     for fr in st.traceback]
            total = sum(s.size_diff for s in snap1.compare_to(snap0, "filename"))
            lines = [f"tracemalloc: +{total / n / 1024:.1f} KiB of Python allocations per device "
                     f"({n} devices)", "", "by file (KiB/device):"]
            for s in snap1.compare_to(snap0, "filename")[:args.top]:
                lines.append(f"  {s.size_diff / n / 1024:7.2f}  {s.count_diff / n:6.1f} blocks  "
                             f"{s.traceback[0].filename.split('site-packages/')[-1]}")
            lines += ["", "by line (KiB/device):"]
            for s in snap1.compare_to(snap0, "lineno")[:args.top]:
                fr = s.traceback[0]
                lines.append(f"  {s.size_diff / n / 1024:7.2f}  {s.count_diff / n:6.1f} blocks  "
                             f"{fr.filename.split('site-packages/')[-1]}:{fr.lineno}")
            lines += by_traceback
            lines += ["", "live objects per device, by type:"]
            diff = counts1 - counts0
            for name, c in diff.most_common(args.top):
                lines.append(f"  {c / n:7.2f}  {name}")
            if args.reconnect:
                # every link dropped and made again: what is still there that was not before
                await trio.to_thread.run_sync(worker.stop)
                with trio.fail_after(max(120, args.devices * 0.2)):  # slower with --frames
                    while services.links:
                        await trio.sleep(0.2)
                await trio.sleep(2)
                worker = Worker("agent", "--hub", base_url, "--data-dir", str(sim_root), name="mem-sim2")
                (sim_root / "all.json").write_text(json.dumps(devices))
                await trio.to_thread.run_sync(partial(worker.request, {"cmd": "add", "devices_file": str(sim_root / "all.json")}, 600))
                with trio.fail_after(max(120, args.devices * 0.2)):  # slower with --frames
                    while len(services.links) < args.devices:
                        await trio.sleep(0.2)
                await trio.sleep(3)
                counts2, tasks2 = type_counts(), task_census()
                snap2 = tracemalloc.take_snapshot().filter_traces(flt)
                grow = sum(s.size_diff for s in snap2.compare_to(snap1, "filename"))
                lines += ["", f"after every device disconnected and reconnected once: +{grow / n / 1024:.2f} KiB "
                              "per device still allocated compared with the first connect; by line:"]
                for s in snap2.compare_to(snap1, "lineno")[:args.top // 2]:
                    fr = s.traceback[0]
                    lines.append(f"  {s.size_diff / n / 1024:7.2f}  {s.count_diff / n:6.1f} blocks  "
                                 f"{fr.filename.split('site-packages/')[-1]}:{fr.lineno}")
                lines += ["", "objects per device gained over the reconnect, by type:"]
                for name, c in (counts2 - counts1).most_common(args.top // 2):
                    lines.append(f"  {c / n:7.2f}  {name}")
            lines += ["", "live trio tasks per device after the first connect, by name:"]
            lines += [f"  {c / n:7.2f}  {name}" for name, c in (tasks1 - tasks0).most_common(args.top)]
            if args.reconnect:
                lines += ["", "live trio tasks per device gained over the reconnect, by name:"]
                lines += [f"  {c / n:7.2f}  {name}" for name, c in (tasks2 - tasks1).most_common(args.top)]
            text = "\n".join(lines)
            print(text)
            OUT_DIR.mkdir(parents=True, exist_ok=True)
            (OUT_DIR / "memory_profile.txt").write_text(text + "\n")
            if args.write:
                write_section("memory_profile", "\n".join([
                    "## Where a device's memory goes (bench/memory_profile.py)", "", f"`{command_line()}`", "",
                    facts_line(args.facts), "",
                    "tracemalloc (1 frame) in the hub process, snapshot before/after the devices link; per device. "
                    "tracemalloc counts Python allocations only (VmRSS per device is in the capacity section).",
                    "", "```", text, "```"]), smoke=False)
            nursery.cancel_scope.cancel()
    finally:
        if worker is not None:
            worker.stop()
        shutil.rmtree(sim_root, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--devices", type=int, default=2000)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--reconnect", action="store_true", help="then drop and remake every link: what stays")
    p.add_argument("--gc-pauses", action="store_true",
                   help="no tracemalloc: time every GC collection while the devices connect and hold")
    p.add_argument("--hold", type=float, default=30.0, help="with --gc-pauses: seconds held after connecting")
    p.add_argument("--gc-freeze", type=float, default=0.0,
                   help="with --gc-pauses: call gc.freeze() in the hub every this many seconds (a candidate fix)")
    p.add_argument("--settle", type=float, default=3.0, help="seconds between the last link and the snapshot")
    p.add_argument("--frames", type=int, default=1, help="frames kept per allocation; above 1 also by traceback")
    p.add_argument("--write", action="store_true", help="write the figures into bench/RESULTS.md")
    a = p.parse_args()
    a.facts = machine_facts()
    if not a.gc_pauses:
        tracemalloc.start(max(1, a.frames))
    trio.run(main, a)
