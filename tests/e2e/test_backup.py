"""Backup and restore as an operator does it: `fleethub admin backup` beside a running hub, a change
made after it, `fleethub admin restore` with the hub stopped, and the hub back with the backed-up
state — secret files included, still opening with the data dir's key."""

from __future__ import annotations

import base64
import stat
import subprocess

import httpx

from tests.e2e.clitools import api, clean_env, fleethub_exe, free_port, run_cli_json, wait_until


def ready(base_url: str) -> bool:
    return httpx.get(base_url + "/readyz", timeout=2).status_code == 200


def test_backup_and_restore(tmp_path, procs):
    data = tmp_path / "hub"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    serve = procs("serve", ["serve", "--port", str(port), "--data-dir", str(data)])
    wait_until(lambda: ready(base), timeout=40, what="hub ready", proc=serve)
    org = run_cli_json(["admin", "--data-dir", str(data), "create-org", "Backup Org"])
    run_cli_json(["admin", "--data-dir", str(data), "create-user", "ops@backup.test", "--org", org["id"],
                  "--role", "admin"])
    pat = run_cli_json(["admin", "--data-dir", str(data), "create-pat", "ops@backup.test"])
    with api(base, pat, org["id"]) as c:
        assert c.post("/v1/fleets", json={"name": "kept"}).status_code == 201
        r = c.post("/v1/configurations", json={"name": "cfg", "spec": {"k": 1}})
        cid = r.json()["data"]["id"]
        r = c.post(f"/v1/configurations/{cid}/secret-files",
                   json={"path": "/etc/app/key", "content_base64": base64.b64encode(b"backed-up").decode()})
        assert r.status_code == 201, r.text

    dump = tmp_path / "fleethub.dump"
    out = run_cli_json(["admin", "--data-dir", str(data), "backup", str(dump)])
    assert out["backup"] == str(dump) and out["bytes"] > 0 and dump.stat().st_size == out["bytes"]
    assert b"backed-up" not in dump.read_bytes(), "secret contents are encrypted in the dump"
    assert stat.S_IMODE(dump.stat().st_mode) == 0o600, "the dump is every organisation's data: 0600"
    # a restore under a running hub is refused, and says why in one line
    refused = subprocess.run([fleethub_exe(), "admin", "--data-dir", str(data), "restore", str(dump)],
                             capture_output=True, text=True, timeout=60, env=clean_env(), stdin=subprocess.DEVNULL)
    assert refused.returncode == 1 and "in use by another fleethub process" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr

    with api(base, pat, org["id"]) as c:
        assert c.post("/v1/fleets", json={"name": "after-backup"}).status_code == 201
    assert serve.interrupt() == 0

    assert run_cli_json(["admin", "--data-dir", str(data), "restore", str(dump)]) == {"restored": str(dump)}

    serve = procs("serve-again", ["serve", "--port", str(port), "--data-dir", str(data)])
    wait_until(lambda: ready(base), timeout=40, what="hub ready after restore", proc=serve)
    with api(base, pat, org["id"]) as c:
        names = {f["name"] for f in c.get("/v1/fleets").json()["data"]}
        assert names == {"kept"}, names
        files = c.get(f"/v1/configurations/{cid}/secret-files").json()["data"]
        assert [f["path"] for f in files] == ["/etc/app/key"]
        # the restored ciphertext opens with the data dir's key: a device gets the plaintext
        r = c.post("/v1/devices", json={"name": "after-restore"})
        dev, token = r.json()["data"]["id"], r.json()["data"]["token"]
        assert c.put(f"/v1/devices/{dev}/configuration", json={"configId": cid}).status_code in (200, 202)
    agent = procs("agent", ["agent", "--hub", base, "--token", token, "--data-dir", str(tmp_path / "dev")])
    key = tmp_path / "dev" / "root" / "etc" / "app" / "key"
    wait_until(lambda: key.exists() and key.read_bytes() == b"backed-up", timeout=40,
               what="the restored secret file on the device", proc=agent)
