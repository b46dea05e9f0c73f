"""The secret-file writer against a workload that attacks it (issue 30's HIGH finding).

The workload's account owns ``/var/lib/fleethub/volumes``, so it can turn any directory below into a
symbolic link at any instant. These tests play that workload for real: a separate process swaps a
directory and a link to a root-owned directory outside the device root with ``renameat2(...,
RENAME_EXCHANGE)`` in a tight loop, while the agent's store writes and deletes through the directory
again and again. Nothing outside the root may ever be created, replaced or removed. On the writer that
checked the resolved path and then wrote by name, the first test put a file outside within a few
hundred writes; the plain-link test created a directory outside before it refused.
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import os
import subprocess
import sys
import time

import pytest
import trio

from device_client.files import SecretFileStore

VOLUMES = "/var/lib/fleethub/volumes"
ATTEMPTS = 1500  # puts (or put+delete rounds) per test; the race was won within a few hundred before
RACE_SECONDS = 8.0  # and never longer than this, whatever the machine's speed

_HAS_RENAMEAT2 = hasattr(ctypes.CDLL(None, use_errno=True), "renameat2")

# The workload: exchange <volumes>/x (a directory) and <volumes>/y (a link to the outside) until
# told to stop or out of time. Prints "ready" once it has swapped at least once.
_EXCHANGER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
a, b, seconds = sys.argv[1].encode(), sys.argv[2].encode(), float(sys.argv[3])
end, swaps = time.monotonic() + seconds, 0
while time.monotonic() < end:
    if libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0:
        sys.exit(f"renameat2: {os.strerror(ctypes.get_errno())}")
    swaps += 1
    if swaps == 1:
        print("ready", flush=True)
print(swaps, flush=True)
"""


def payload(path: str, data: bytes) -> dict:
    return {"fileId": "f", "path": path, "mode": 0o600, "uid": 0, "gid": 0, "source": "device",
            "contentB64": base64.b64encode(data).decode(), "sha256": hashlib.sha256(data).hexdigest()}


@pytest.fixture
def arena(tmp_path):
    """A store, its volumes directory with x (a directory) and y (a link to ``outside``), and the
    root-owned 0700 directory ``outside`` beside the device root."""
    store = SecretFileStore(tmp_path / "dev", tmp_path / "dev" / "root")
    volumes = store.local_path(VOLUMES)
    (volumes / "x").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    (outside / "victim").write_bytes(b"root's own file")
    os.symlink(outside, volumes / "y")
    return store, volumes, outside


def _everything_under(directory) -> set[str]:
    return {os.path.relpath(os.path.join(d, n), directory)
            for d, dirs, files in os.walk(directory) for n in dirs + files}


class Exchanger:
    """The hostile workload, a process of its own, exchanging x and y until the test ends."""

    def __init__(self, volumes) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _EXCHANGER, str(volumes / "x"), str(volumes / "y"), str(RACE_SECONDS + 5)],
            stdout=subprocess.PIPE, text=True)
        assert self.process.stdout.readline().strip() == "ready"
        self.volumes = volumes

    def stop(self) -> int:
        self.process.terminate()
        self.process.wait(timeout=10)
        # leave x a directory again, whichever way the last swap left it
        if os.path.islink(self.volumes / "x"):
            os.rename(self.volumes / "x", self.volumes / "z")
            os.rename(self.volumes / "y", self.volumes / "x")
            os.rename(self.volumes / "z", self.volumes / "y")
        return self.process.returncode


async def _rounds(body) -> int:
    """Run ``body()`` up to ATTEMPTS times within RACE_SECONDS; how many ran."""
    end, done = time.monotonic() + RACE_SECONDS, 0
    while done < ATTEMPTS and time.monotonic() < end:
        await body()
        done += 1
    return done


@pytest.mark.skipif(not _HAS_RENAMEAT2, reason="needs renameat2 in the C library (glibc 2.28+)")
async def test_a_workload_swapping_a_directory_for_a_link_cannot_get_a_write_outside(arena):
    store, volumes, outside = arena
    before = _everything_under(outside)
    written = 0

    async def put() -> None:
        nonlocal written
        results = await store.put([payload(f"{VOLUMES}/x/pwned", b"hub's bytes"),
                                   payload(f"{VOLUMES}/x/newdir/pwned", b"hub's bytes")])
        written += sum(r["status"] == "on_device" for r in results)
        assert _everything_under(outside) == before, f"a write landed outside the root: {results}"

    exchanger = Exchanger(volumes)
    try:
        with trio.fail_after(RACE_SECONDS + 20):
            rounds = await _rounds(put)
    finally:
        exchanger.stop()
    assert _everything_under(outside) == before and (outside / "victim").read_bytes() == b"root's own file"
    # the race was really run: writes went through whenever x was the directory, and others were refused
    assert rounds > 50 and written > 0
    assert (volumes / "x" / "pwned").read_bytes() == b"hub's bytes"


@pytest.mark.skipif(not _HAS_RENAMEAT2, reason="needs renameat2 in the C library (glibc 2.28+)")
async def test_a_workload_swapping_a_directory_for_a_link_cannot_get_a_delete_outside(arena):
    store, volumes, outside = arena
    removed = 0

    async def put_then_delete() -> None:
        nonlocal removed
        await store.put([payload(f"{VOLUMES}/x/victim", b"the hub's victim")])
        if f"{VOLUMES}/x/victim" not in store.managed():
            return  # refused this time: x was the link
        [result] = await store.delete([f"{VOLUMES}/x/victim"])
        removed += result["status"] == "removed"
        assert (outside / "victim").read_bytes() == b"root's own file", "a delete removed a file outside"

    exchanger = Exchanger(volumes)
    try:
        with trio.fail_after(RACE_SECONDS + 20):
            rounds = await _rounds(put_then_delete)
    finally:
        exchanger.stop()
    assert (outside / "victim").read_bytes() == b"root's own file"
    assert _everything_under(outside) == {"victim"}
    assert rounds > 50 and removed > 0


async def test_a_plain_link_creates_nothing_outside(arena):
    store, volumes, outside = arena
    os.rename(volumes / "x", volumes / "x-dir")
    os.symlink(outside, volumes / "x")
    with trio.fail_after(5):
        results = await store.put([payload(f"{VOLUMES}/x/newdir/f", b"1"), payload(f"{VOLUMES}/x/f", b"2")])
    assert _everything_under(outside) == {"victim"}  # the old writer made newdir here, then refused
    for result in results:
        assert result["status"] == "failed" and f"{VOLUMES}/x is a symbolic link" in result["error"], result
    assert store.digests() == {}


async def test_delete_and_the_boot_check_never_act_through_a_link(arena):
    """A managed file whose directory became a link: delete refuses (the file outside of the same
    name stays), and the boot check neither reads nor chmods nor chowns through the link."""
    store, volumes, outside = arena
    with trio.fail_after(5):
        await store.put([payload(f"{VOLUMES}/x/victim", b"ours"), payload(f"{VOLUMES}/x/other", b"ours")])
    os.rename(volumes / "x", volumes / "x-dir")
    os.symlink(outside, volumes / "x")
    os.chmod(outside / "victim", 0o640)
    with trio.fail_after(5):
        checked = await store.verify()
        [deleted] = await store.delete([f"{VOLUMES}/x/victim"])
    assert {r["status"] for r in checked} == {"failed"}
    assert all("is a symbolic link" in r["error"] for r in checked)
    assert deleted["status"] == "failed" and "is a symbolic link" in deleted["error"]
    assert (outside / "victim").read_bytes() == b"root's own file"
    assert os.stat(outside / "victim").st_mode & 0o777 == 0o640
    assert f"{VOLUMES}/x/victim" in store.managed()  # still ours: the hub may ask again


async def test_a_fifo_at_a_managed_path_does_not_block_the_agent(arena):
    store, volumes, _ = arena
    with trio.fail_after(5):
        await store.put([payload(f"{VOLUMES}/x/f", b"same")])
    os.unlink(volumes / "x" / "f")
    os.mkfifo(volumes / "x" / "f")
    with trio.fail_after(5):
        checked = await store.verify()
        [again] = await store.put([payload(f"{VOLUMES}/x/f", b"same")])
    assert checked[0]["status"] == "failed" and checked[0]["error"] == "changed on device"
    assert again["status"] == "on_device" and (volumes / "x" / "f").read_bytes() == b"same"
