"""Secret files through the API: validation exactly as the spec's Limits, write-only contents,
encryption at rest, limits per owner, relations (real hub and PostgreSQL; delivery to real agents is
in test_delivery.py)."""

from __future__ import annotations

import base64
import hashlib
import logging
import uuid

import trio

from tests.hubtools import start_hub


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def _config(hub, name="cfg") -> str:
    r = await hub.call("POST", "/v1/configurations", json={"name": name, "spec": {}})
    assert r.status_code == 201, r.text
    return r.json()["data"]["id"]


async def test_path_mode_and_content_rules(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        cid = await _config(hub)
        url = f"/v1/configurations/{cid}/secret-files"
        ok = {"path": "/etc/app/key", "content_base64": b64(b"k")}
        bad_paths = ["etc/app/key", "/etc/app/../key", "/etc//app/key", "/etc/app/./key", "/etc\\app", "/etc/app\x01k",
                     "/" + "a" * 1024, "/proc/x", "/sys/x", "/dev/x", "/boot/x", "/app/x", "/bin/x", "/sbin/x",
                     "/lib/x", "/lib64/x", "/usr/x", "/run/x", "/tmp/x", "/etc/passwd", "/etc/shadow", "/etc/group",
                     "/etc/gshadow", "/etc/sudoers", "/etc/sudoers.d/x", "/etc/ld.so.preload", "/etc/ld.so.conf",
                     "/etc/fstab", "/etc/mtab", "/var/lib/fleethub/config", "/var/lib/fleethub", "/proc"]
        for path in bad_paths:
            r = await hub.call("POST", url, json={**ok, "path": path})
            assert r.status_code == 400 and r.json()["error"] == "invalid_path", (path, r.text)
        for path in ("/var/lib/fleethub/secrets/api-key", "/var/lib/fleethub/volumes/data/cert.pem", "/usrx/ok",
                     "/etc/app/passwd", "/opt/robot/token"):
            r = await hub.call("POST", url, json={**ok, "path": path})
            assert r.status_code == 201, (path, r.text)
        for mode in ("0200", "0620", "0602", "4600", "2600", "1600", "0800", "rw", "600x", "06000"):
            r = await hub.call("POST", url, json={**ok, "path": "/etc/app/m", "mode": mode})
            assert r.status_code == 400 and r.json()["error"] == "invalid_mode", (mode, r.text)
        for mode in ("0400", "0600", "0640", "0644", "600", "0444"):
            r = await hub.call("POST", url, json={**ok, "path": "/etc/app/m", "mode": mode})
            assert r.status_code in (200, 201), (mode, r.text)
        r = await hub.call("POST", url, json={**ok, "content_base64": ""})
        assert r.status_code == 400
        r = await hub.call("POST", url, json={**ok, "content_base64": "not base64!"})
        assert r.status_code == 400
        r = await hub.call("POST", url, json={**ok, "content_base64": b64(b"x" * (64 * 1024 + 1))})
        assert r.status_code == 413
        r = await hub.call("POST", url, json={**ok, "path": "/etc/app/big", "content_base64": b64(b"x" * 64 * 1024)})
        assert r.status_code == 201
        r = await hub.call("POST", url, json={**ok, "owner": 0})
        assert r.status_code == 400 and r.json()["error"] == "unknown_field"


async def test_listing_is_metadata_only_and_replace_keeps_one_file(nursery, db_url, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        cid = await _config(hub)
        url = f"/v1/configurations/{cid}/secret-files"
        plaintext = b"PLAINTEXT-MARKER-" + uuid.uuid4().hex.encode()
        r = await hub.call("POST", url, json={"path": "/etc/app/token", "mode": "0640", "uid": 1000, "gid": 1001,
                                              "content_base64": b64(plaintext)})
        assert r.status_code == 201, r.text
        f = r.json()["data"]
        assert f["path"] == "/etc/app/token" and f["mode"] == "0640" and f["owner"] == {"uid": 1000, "gid": 1001}
        assert f["size"] == len(plaintext) and f["sha256Prefix"] == hashlib.sha256(plaintext).hexdigest()[:16]
        assert "sha256" not in f  # 16 hex characters are not a SHA-256: the field says it is a prefix
        assert f["status"] == "pending" and f["updatedAt"]
        r = await hub.call("POST", url, json={"path": "/etc/app/token", "content_base64": b64(b"second")})
        assert r.status_code == 200 and r.json()["data"]["id"] == f["id"] and r.json()["data"]["mode"] == "0600"
        r = await hub.call("GET", url)
        files = r.json()["data"]
        assert len(files) == 1 and files[0]["size"] == 6
        texts = [r.text]
        r = await hub.call("GET", f"/v1/configurations/{cid}")
        texts.append(r.text)
        r = await hub.call("GET", f"/v1/configurations/{cid}/versions")
        texts.append(r.text)
        await hub.services.audit_log.flush()
        # nothing anywhere holds the plaintext: responses, logs, audit, the raw database
        raw = await hub.services.db.fetch("SELECT ciphertext FROM secret_files")
        assert all(plaintext not in bytes(row["ciphertext"]) and b"second" not in bytes(row["ciphertext"])
                   for row in raw)
        dump = await hub.services.db.fetchval(
            "SELECT string_agg(t::text, ' ') FROM (SELECT * FROM audit_events) t")
        for text in [*texts, caplog.text, dump or ""]:
            assert plaintext.decode() not in text and b64(plaintext) not in text
        r = await hub.call("DELETE", f"{url}/{f['id']}")
        assert r.status_code == 200
        assert (await hub.call("GET", url)).json()["data"] == []
        assert (await hub.call("DELETE", f"{url}/{f['id']}")).status_code == 404


async def test_limits_per_owner(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        dev, _ = await hub.provision("d")
        url = f"/v1/devices/{dev}/secret-files"
        for i in range(32):
            r = await hub.call("POST", url, json={"path": f"/etc/app/f{i}", "content_base64": b64(b"x")})
            assert r.status_code == 201, r.text
        r = await hub.call("POST", url, json={"path": "/etc/app/f32", "content_base64": b64(b"x")})
        assert r.status_code == 409 and r.json()["error"] == "secret_file_limit"
        # replacing an existing path is not a 33rd file
        r = await hub.call("POST", url, json={"path": "/etc/app/f0", "content_base64": b64(b"y")})
        assert r.status_code == 200
        cid = await _config(hub)
        curl = f"/v1/configurations/{cid}/secret-files"
        for i in range(8):  # 8 x 64 KB = 512 KB exactly
            r = await hub.call("POST", curl, json={"path": f"/etc/app/c{i}", "content_base64": b64(b"z" * 65536)})
            assert r.status_code == 201, r.text
        r = await hub.call("POST", curl, json={"path": "/etc/app/c8", "content_base64": b64(b"z")})
        assert r.status_code == 409
        r = await hub.call("POST", curl, json={"path": "/etc/app/c0", "content_base64": b64(b"smaller")})
        assert r.status_code == 200


async def test_relations_and_missing_owners(nursery, db_url, tmp_path):
    with trio.fail_after(30):
        hub = await start_hub(nursery, db_url, tmp_path)
        cid = await _config(hub)
        member = await hub.new_user("member")
        mh = {"X-API-Token-ID": member[0], "X-API-Secret-Key": member[1], "X-Organization-ID": hub.org_id}
        me = (await hub.call("GET", "/v1/me", headers=mh)).json()["data"]["userId"]
        url = f"/v1/configurations/{cid}/secret-files"
        body = {"path": "/etc/app/k", "content_base64": b64(b"k")}
        assert (await hub.call("GET", url, headers=mh)).status_code == 403
        grant = {"object_type": "configuration", "object_id": cid, "relation": "viewer", "subject_type": "user",
                 "subject_id": me}
        assert (await hub.call("POST", "/v1/relations", json=grant)).status_code == 201
        assert (await hub.call("GET", url, headers=mh)).status_code == 200
        assert (await hub.call("POST", url, headers=mh, json=body)).status_code == 403
        assert (await hub.call("POST", "/v1/relations", json={**grant, "relation": "editor"})).status_code == 201
        assert (await hub.call("POST", url, headers=mh, json=body)).status_code == 201
        assert (await hub.call("GET", f"/v1/configurations/{uuid.uuid4()}/secret-files")).status_code == 404
        assert (await hub.call("GET", f"/v1/devices/{uuid.uuid4()}/secret-files")).status_code == 404
        assert (await hub.call("GET", "/v1/devices/nope/secret-files")).status_code == 400


async def test_delivering_a_configuration_needs_editor_on_it(nursery, db_url, tmp_path):
    """Issue 31 item 1: a member with viewer on configuration C and editor on a fleet made a device in
    that fleet, linked it, and assigned C to it: the config.apply frame carried C's secret files in the
    clear. Delivering is reading, so every path a configuration takes to a device needs editor on it."""
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)
        cid = await _config(hub)
        r = await hub.call("POST", f"/v1/configurations/{cid}/secret-files",
                           json={"path": "/etc/app/db-token", "content_base64": b64(b"s3cret")})
        assert r.status_code == 201
        fleet = (await hub.call("POST", "/v1/fleets", json={"name": "mine"})).json()["data"]["id"]
        member = await hub.new_user("member")
        mh = {"X-API-Token-ID": member[0], "X-API-Secret-Key": member[1], "X-Organization-ID": hub.org_id}
        me = (await hub.call("GET", "/v1/me", headers=mh)).json()["data"]["userId"]

        async def grant(object_type, object_id, relation):
            r = await hub.call("POST", "/v1/relations", json={
                "object_type": object_type, "object_id": object_id, "relation": relation,
                "subject_type": "user", "subject_id": me})
            assert r.status_code == 201, r.text

        await grant("configuration", cid, "viewer")
        await grant("fleet", fleet, "editor")
        r = await hub.call("POST", "/v1/devices", headers=mh, json={"name": "mine", "fleet_id": fleet})
        assert r.status_code == 201, r.text
        dev = r.json()["data"]["id"]
        refused = [
            await hub.call("PUT", f"/v1/devices/{dev}/configuration", headers=mh, json={"configId": cid}),
            await hub.call("POST", "/v1/rollouts", headers=mh, json={"fleet_id": fleet, "config_id": cid,
                                                                   "force": True}),
            await hub.call("POST", "/v1/rollouts", headers=mh, json={"fleet_ids": [fleet], "configuration_id": cid,
                                                                   "batch_size": 1}),
            await hub.call("PATCH", f"/v1/fleets/{fleet}", headers=mh, json={"config_id": cid}),
        ]
        for r in refused:
            assert r.status_code == 403, (r.request.url, r.text)
            assert "s3cret" not in r.text and b64(b"s3cret") not in r.text
        row = await hub.services.stores.devices.get(uuid.UUID(hub.org_id), uuid.UUID(dev))
        assert row["config_id"] is None
        # editor on the configuration: the same member may deliver it
        await grant("configuration", cid, "editor")
        r = await hub.call("PUT", f"/v1/devices/{dev}/configuration", headers=mh, json={"configId": cid})
        assert r.status_code == 202, r.text
