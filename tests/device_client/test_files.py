"""The device's secret-file store on a real file system.

The tests run as root, where chmod cannot make a directory unwritable. Failing writes are therefore
produced three real ways: a regular file where a parent directory should be (in process), a child
process without CAP_DAC_OVERRIDE/CAP_CHOWN (setpriv) for permission errors, and a child process
with RLIMIT_FSIZE for a write that fails half way through the bytes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import shutil
import stat
import sys

import pytest
import trio

from device_client.files import IGNORE_OWNER_ENV, SecretFileStore

ROOT_USER = os.geteuid() == 0
SETPRIV = shutil.which("setpriv")


def payload(path: str, data: bytes, mode: int = 0o600, uid: int = 0, gid: int = 0, file_id: str = "f1",
            **extra) -> dict:
    return {"fileId": file_id, "path": path, "mode": mode, "uid": uid, "gid": gid,
            "contentB64": base64.b64encode(data).decode(), "sha256": hashlib.sha256(data).hexdigest(),
            "source": "device", **extra}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def store(tmp_path):
    return SecretFileStore(tmp_path / "dev", tmp_path / "dev" / "root")


def on_disk(store: SecretFileStore, path: str):
    local = store.local_path(path)
    st = os.lstat(local)
    return local.read_bytes(), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


def leftovers(directory) -> list[str]:
    return [n for n in os.listdir(directory) if n.endswith(".tmp")]


_CHILD = """
import json, resource, signal, sys, trio
from pathlib import Path
from device_client.files import SecretFileStore
args = json.loads(sys.argv[1])
if args.get("fsize"):
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (args["fsize"], args["fsize"]))
store = SecretFileStore(Path(args["data_dir"]), Path(args["root"]))
print(json.dumps(trio.run(store.put, args["files"])))
"""


async def put_in_child(store: SecretFileStore, files: list[dict], *, unprivileged: bool = False,
                       fsize: int | None = None, env: dict | None = None) -> list[dict]:
    """Run ``store.put`` in a child process, optionally without the capabilities that let root ignore
    permissions and chown (so permission errors are real), or with a file size limit."""
    args = json.dumps({"data_dir": str(store.data_dir), "root": str(store.root), "files": files, "fsize": fsize})
    cmd = [sys.executable, "-c", _CHILD, args]
    if unprivileged and ROOT_USER:
        cmd = [SETPRIV, "--bounding-set=-dac_override,-dac_read_search,-chown,-fowner", "--inh-caps=-all", "--", *cmd]
    result = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True,
                                    env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **(env or {})})
    return json.loads(result.stdout)


async def test_put_writes_exact_bytes_mode_and_owner(store):
    data = bytes(range(256)) * 3 + b"\x00tail"
    with trio.fail_after(5):
        results = await store.put([payload("/etc/app/token", data, mode=0o640, uid=1234, gid=5678, file_id="a")])
    assert results == [{"fileId": "a", "path": "/etc/app/token", "status": "on_device", "sha256": sha(data)}]
    assert on_disk(store, "/etc/app/token") == (data, 0o640, 1234, 5678)
    assert stat.S_IMODE(os.stat(store.root / "etc" / "app").st_mode) == 0o755
    assert store.digests() == {"/etc/app/token": sha(data)}
    manifest = json.loads((store.data_dir / "secret-files.json").read_text())
    assert manifest == {"/etc/app/token": {"fileId": "a", "sha256": sha(data), "mode": 0o640, "uid": 1234,
                                           "gid": 5678, "source": "device", "configId": None}}
    assert stat.S_IMODE(os.stat(store.data_dir / "secret-files.json").st_mode) == 0o600
    assert leftovers(store.root / "etc" / "app") == []
    # a new store (the next boot) knows the same files
    assert SecretFileStore(store.data_dir, store.root).digests() == store.digests()


async def test_secrets_directory_files_are_read_only_for_the_workload(store):
    with trio.fail_after(5):
        results = await store.put([payload("/var/lib/fleethub/secrets/db/password", b"pw", mode=0o640),
                                   payload("/var/lib/fleethub/secrets/run.sh", b"#!/bin/sh", mode=0o755, file_id="b"),
                                   payload("/var/lib/fleethub/volumes/data/seed", b"s", mode=0o644, file_id="c")])
    assert [r["status"] for r in results] == ["on_device"] * 3
    assert on_disk(store, "/var/lib/fleethub/secrets/db/password")[1] == 0o440
    assert on_disk(store, "/var/lib/fleethub/secrets/run.sh")[1] == 0o444  # no execute bit
    assert on_disk(store, "/var/lib/fleethub/volumes/data/seed")[1] == 0o644  # volumes keep their mode
    secrets = store.root / "var/lib/fleethub/secrets"
    os.chmod(secrets, 0o700)
    with trio.fail_after(5):
        await store.put([payload("/var/lib/fleethub/secrets/db/password", b"pw2", mode=0o600)])
    for directory in (secrets, secrets / "db"):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o755
    # the mode the file really has is what the store remembers, so it is not "drift" next time
    assert store.managed()["/var/lib/fleethub/secrets/db/password"]["mode"] == 0o400


async def test_unchanged_contents_are_not_rewritten_but_drift_is_corrected(store):
    data = b"same bytes"
    with trio.fail_after(5):
        await store.put([payload("/etc/app/key", data, mode=0o600, uid=10, gid=20)])
        local = store.local_path("/etc/app/key")
        before = os.stat(local)
        os.chmod(local, 0o644)
        os.chown(local, 0, 0)
        results = await store.put([payload("/etc/app/key", data, mode=0o600, uid=10, gid=20)])
    after = os.stat(local)
    assert results[0]["status"] == "on_device"
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # not rewritten
    assert (stat.S_IMODE(after.st_mode), after.st_uid, after.st_gid) == (0o600, 10, 20)
    # a new mode alone is applied in place as well
    with trio.fail_after(5):
        await store.put([payload("/etc/app/key", data, mode=0o400, uid=10, gid=20)])
    assert os.stat(local).st_ino == before.st_ino and on_disk(store, "/etc/app/key")[1] == 0o400


async def test_new_contents_replace_the_file_atomically(store):
    with trio.fail_after(5):
        await store.put([payload("/etc/app/key", b"old contents")])
        local = store.local_path("/etc/app/key")
        old_inode = os.stat(local).st_ino
        with open(local, "rb") as reader:  # a reader that opened the old file keeps reading it
            results = await store.put([payload("/etc/app/key", b"new contents", file_id="f2")])
            assert reader.read() == b"old contents"
    assert results == [{"fileId": "f2", "path": "/etc/app/key", "status": "on_device", "sha256": sha(b"new contents")}]
    assert local.read_bytes() == b"new contents" and os.stat(local).st_ino != old_inode
    assert leftovers(local.parent) == []
    assert store.managed()["/etc/app/key"]["fileId"] == "f2"


async def test_a_file_where_a_directory_should_be_fails_and_keeps_the_old_file(store):
    old = b"the old file at /srv/app/conf"
    with trio.fail_after(5):
        await store.put([payload("/srv/app/conf", old, mode=0o640, uid=7, gid=8, file_id="old")])
        before = os.stat(store.local_path("/srv/app/conf"))
        results = await store.put([payload("/srv/app/conf/inner", b"new", file_id="new"),
                                   payload("/srv/app/conf/a/b", b"new", file_id="deeper")])
    for result, file_id in zip(results, ("new", "deeper")):
        assert result["status"] == "failed" and result["fileId"] == file_id
        assert "Not a directory" in result["error"] and "/srv/app/conf" in result["error"]
        assert str(store.root) not in result["error"]  # device paths only, not the simulation's
    after = os.stat(store.local_path("/srv/app/conf"))
    assert on_disk(store, "/srv/app/conf") == (old, 0o640, 7, 8)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert set(store.digests()) == {"/srv/app/conf"}
    assert leftovers(store.root / "srv" / "app") == []


async def test_a_directory_in_the_way_fails(store):
    (store.root / "etc/app/key").mkdir(parents=True)
    (store.root / "etc/app/key/keep").write_bytes(b"k")
    with trio.fail_after(5):
        [result] = await store.put([payload("/etc/app/key", b"x")])
    assert result["status"] == "failed" and "directory" in result["error"]
    assert (store.root / "etc/app/key/keep").read_bytes() == b"k"
    assert store.digests() == {}


@pytest.mark.skipif(ROOT_USER and not SETPRIV, reason="needs setpriv to drop root's capabilities")
async def test_an_unwritable_directory_fails_with_the_os_error_and_keeps_the_old_file(store):
    with trio.fail_after(20):
        await store.put([payload("/etc/app/key", b"old", mode=0o640)])
        directory = store.local_path("/etc/app/key").parent
        before = os.stat(store.local_path("/etc/app/key"))
        os.chmod(directory, 0o555)
        try:
            results = await put_in_child(store, [payload("/etc/app/key", b"new", file_id="f2")], unprivileged=True)
        finally:
            os.chmod(directory, 0o755)
    assert results == [{"fileId": "f2", "path": "/etc/app/key", "status": "failed",
                        "error": "cannot write /etc/app/key: Permission denied (/etc/app)"}]
    after = os.stat(store.local_path("/etc/app/key"))
    assert on_disk(store, "/etc/app/key") == (b"old", 0o640, 0, 0)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert leftovers(directory) == []
    assert SecretFileStore(store.data_dir, store.root).digests() == {"/etc/app/key": sha(b"old")}


async def test_a_write_that_fails_half_way_leaves_the_old_file(store):
    old, new = b"o" * 1000, b"n" * 50_000
    with trio.fail_after(20):
        await store.put([payload("/etc/app/big", old)])
        # the child may not write any file beyond 4 KiB: the temporary file hits the limit mid-write
        results = await put_in_child(store, [payload("/etc/app/big", new, file_id="f2")], fsize=4096)
    assert results[0]["status"] == "failed" and "File too large" in results[0]["error"]
    assert store.local_path("/etc/app/big").read_bytes() == old
    assert leftovers(store.local_path("/etc/app/big").parent) == []
    assert SecretFileStore(store.data_dir, store.root).digests() == {"/etc/app/big": sha(old)}


@pytest.mark.skipif(not ROOT_USER or not SETPRIV, reason="needs root and setpriv")
async def test_an_owner_that_cannot_be_set_fails_unless_told_to_record_it(store):
    with trio.fail_after(20):
        [failed] = await put_in_child(store, [payload("/etc/app/a", b"x", uid=1234, gid=1234)], unprivileged=True)
        [recorded] = await put_in_child(store, [payload("/etc/app/b", b"y", uid=1234, gid=1234)],
                                        unprivileged=True, env={IGNORE_OWNER_ENV: "1"})
        # an owner the agent already is needs no privilege
        [own] = await put_in_child(store, [payload("/etc/app/c", b"z", uid=0, gid=0)], unprivileged=True)
    assert failed["status"] == "failed"
    assert failed["error"].startswith("cannot set owner 1234:1234 on /etc/app/a: Operation not permitted")
    assert IGNORE_OWNER_ENV in failed["error"]
    assert not store.local_path("/etc/app/a").exists()
    assert recorded["status"] == "on_device" and own["status"] == "on_device"
    assert on_disk(store, "/etc/app/b") == (b"y", 0o600, 0, 0)
    manifest = SecretFileStore(store.data_dir, store.root).managed()
    assert (manifest["/etc/app/b"]["uid"], manifest["/etc/app/b"]["gid"]) == (1234, 1234)
    assert set(manifest) == {"/etc/app/b", "/etc/app/c"}


async def test_every_file_is_reported_on_its_own(store):
    good = payload("/etc/app/ok", b"fine", file_id="ok")
    bad = [
        ({**payload("/etc/app/x", b"x"), "path": "/etc/../x"}, "no . or .. segment"),
        ({**payload("/etc/app/x", b"x"), "mode": 0o666}, "group- or world-writable"),
        ({**payload("/etc/app/x", b"x"), "mode": 0o4600}, "setuid"),
        ({**payload("/etc/app/x", b"x"), "contentB64": "***"}, "not valid base64"),
        ({**payload("/etc/app/x", b"x"), "contentB64": ""}, "content is empty"),
        ({**payload("/etc/app/x", b"x"), "sha256": "0" * 64}, "does not match its sha256"),
        (payload("/etc/app/x", b"x" * (64 * 1024 + 1)), "at most 65536"),
        ({**payload("/etc/app/x", b"x"), "uid": -1}, "uid must be"),
        ({**payload("/etc/app/x", b"x"), "gid": "0"}, "gid must be"),
        ({**payload("/etc/app/x", b"x"), "source": "other"}, "source must be"),
        ("not an object", "must be an object"),
    ]
    with trio.fail_after(5):
        results = await store.put([b for b, _ in bad[:5]] + [good] + [b for b, _ in bad[5:]])
    assert results[5] == {"fileId": "ok", "path": "/etc/app/ok", "status": "on_device", "sha256": sha(b"fine")}
    for result, (_, reason) in zip(results[:5] + results[6:], bad):
        assert result["status"] == "failed" and reason in result["error"], result
    assert store.digests() == {"/etc/app/ok": sha(b"fine")}
    assert sorted(os.listdir(store.root / "etc" / "app")) == ["ok"]
    # a mode given as an octal string, and the 64 KiB limit itself, are fine
    with trio.fail_after(5):
        [r1, r2] = await store.put([{**payload("/etc/app/s", b"s"), "mode": "0640"},
                                    payload("/etc/app/max", b"m" * 64 * 1024)])
    assert (r1["status"], r2["status"]) == ("on_device", "on_device")
    assert on_disk(store, "/etc/app/s")[1] == 0o640


@pytest.mark.parametrize("path", ["/etc/passwd", "/etc/shadow", "/etc/sudoers.d/app", "/usr/bin/x",
                                  "/etc/ld.so.preload", "/var/lib/fleethub/state", "/proc/sys/x", "/boot/x"])
async def test_the_device_refuses_forbidden_paths_itself(store, path):
    with trio.fail_after(5):
        [result] = await store.put([payload(path, b"evil")])
    assert result["status"] == "failed" and "forbidden" in result["error"]
    assert not store.local_path(path).exists()


async def test_a_symlinked_directory_is_never_followed(store, tmp_path):
    """Inside the root or out of it, a link on the way is refused: the path checked is the path
    written (devroot.py), so neither the outside nor a forbidden tree can be reached through one."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (store.root / "etc").mkdir(parents=True)
    (store.root / "usr").mkdir()
    (store.root / "opt").mkdir()
    os.symlink(outside, store.root / "etc" / "escape")
    os.symlink(store.root / "usr", store.root / "etc" / "sneaky")
    os.symlink(store.root / "opt", store.root / "etc" / "inside")
    with trio.fail_after(5):
        results = await store.put([payload("/etc/escape/x", b"1"), payload("/etc/sneaky/x", b"2"),
                                   payload("/etc/inside/x", b"3"), payload("/etc/escape/new/x", b"4")])
    for result, link in zip(results, ("/etc/escape", "/etc/sneaky", "/etc/inside", "/etc/escape")):
        assert result["status"] == "failed", result
        assert f"{link} is a symbolic link" in result["error"] and str(tmp_path) not in result["error"]
    assert os.listdir(outside) == [] and os.listdir(store.root / "usr") == [] and os.listdir(store.root / "opt") == []
    assert store.digests() == {}


async def test_delete_removes_managed_files_only(store):
    with trio.fail_after(5):
        await store.put([payload("/etc/app/a", b"a", file_id="fa"), payload("/etc/app/b", b"b", file_id="fb")])
        (store.root / "etc/app/mine").write_bytes(b"not the hub's")
        results = await store.delete(["/etc/app/a", "/etc/app/mine", "/etc/app/never", "/etc/passwd", 5])
        again = await store.delete(["/etc/app/a"])
    assert results[:3] == [{"fileId": "fa", "path": "/etc/app/a", "status": "removed"},
                           {"path": "/etc/app/mine", "status": "removed"},
                           {"path": "/etc/app/never", "status": "removed"}]
    assert results[3]["status"] == "failed" and "forbidden" in results[3]["error"]
    assert results[4]["status"] == "failed"
    assert again == [{"path": "/etc/app/a", "status": "removed"}]
    assert sorted(os.listdir(store.root / "etc/app")) == ["b", "mine"]
    assert store.digests() == {"/etc/app/b": sha(b"b")}


async def test_wipe_removes_every_managed_file_and_nothing_else(store):
    with trio.fail_after(5):
        await store.put([payload("/etc/app/a", b"a"), payload("/var/lib/fleethub/secrets/t", b"t"),
                         payload("/opt/x/y", b"y", source="configuration", configId="c1")])
        (store.root / "etc/app/other").write_bytes(b"keep")
        os.unlink(store.local_path("/opt/x/y"))  # already gone is fine
        wiped = await store.wipe()
        again = await store.wipe()
    assert wiped == {"removed": ["/etc/app/a", "/opt/x/y", "/var/lib/fleethub/secrets/t"]}
    assert again == {"removed": []}
    assert (store.root / "etc/app/other").read_bytes() == b"keep"
    assert not store.local_path("/etc/app/a").exists() and not store.local_path("/var/lib/fleethub/secrets/t").exists()
    assert store.digests() == {} and json.loads((store.data_dir / "secret-files.json").read_text()) == {}


async def test_boot_verification_corrects_drift_and_reports_missing_and_changed_files(store):
    with trio.fail_after(5):
        await store.put([payload("/etc/a", b"a", file_id="fa", uid=3, gid=4), payload("/etc/b", b"b", file_id="fb"),
                         payload("/etc/c", b"c", file_id="fc"), payload("/etc/d", b"d", file_id="fd"),
                         payload("/etc/e", b"e", file_id="fe")])
        os.chmod(store.local_path("/etc/a"), 0o644)
        os.chown(store.local_path("/etc/a"), 0, 0)
        os.unlink(store.local_path("/etc/b"))
        store.local_path("/etc/c").write_bytes(b"edited by hand")
        os.unlink(store.local_path("/etc/d"))
        store.local_path("/etc/d").mkdir()
        rebooted = SecretFileStore(store.data_dir, store.root)
        report = await rebooted.verify()
    assert report == [
        {"fileId": "fa", "path": "/etc/a", "status": "on_device", "sha256": sha(b"a")},
        {"fileId": "fb", "path": "/etc/b", "status": "failed", "error": "missing on device"},
        {"fileId": "fc", "path": "/etc/c", "status": "failed", "error": "changed on device"},
        {"fileId": "fd", "path": "/etc/d", "status": "failed", "error": "changed on device"},
    ]
    assert on_disk(rebooted, "/etc/a")[1:] == (0o600, 3, 4)
    # the hello now tells the hub what is really there, so it pushes /etc/b and /etc/c again
    assert rebooted.digests() == {"/etc/a": sha(b"a"), "/etc/c": sha(b"edited by hand"), "/etc/e": sha(b"e")}
    with trio.fail_after(5):
        assert await rebooted.verify() == []  # reported once
        [pushed] = await rebooted.put([payload("/etc/c", b"c", file_id="fc")])
    assert pushed["status"] == "on_device" and store.local_path("/etc/c").read_bytes() == b"c"


async def test_a_configuration_file_does_not_replace_the_devices_own_file(store):
    with trio.fail_after(5):
        await store.put([payload("/etc/app/conf", b"device's", file_id="dev")])
        [result] = await store.put([payload("/etc/app/conf", b"configuration's", file_id="cfg")],
                                   source="configuration", config_id="c1")
        [other] = await store.put([payload("/etc/app/other", b"o", file_id="o")], source="configuration",
                                  config_id="c1")
    assert result == {"fileId": "cfg", "path": "/etc/app/conf", "status": "overridden"}
    assert store.local_path("/etc/app/conf").read_bytes() == b"device's"
    assert store.managed()["/etc/app/other"] | {} == {"fileId": "o", "sha256": sha(b"o"), "mode": 0o600, "uid": 0,
                                                      "gid": 0, "source": "configuration", "configId": "c1"}
    assert other["status"] == "on_device"


async def test_contents_never_reach_the_log(store, caplog):
    caplog.set_level(logging.DEBUG)
    secret = b"hunter2-very-secret-value"
    with trio.fail_after(5):
        await store.put([payload("/etc/app/key", secret)])
        os.chmod(store.local_path("/etc/app/key"), 0o644)
        await store.put([payload("/etc/app/key", secret)])
        await store.put([payload("/etc/passwd", secret)])
        await store.delete(["/etc/app/key"])
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "/etc/app/key" in text
    assert secret.decode() not in text and base64.b64encode(secret).decode() not in text
