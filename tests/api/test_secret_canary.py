"""Secrets never leave their place: known plaintexts uploaded as secret files (a device's own and a
configuration's, delivered to a real agent by direct assignment and by a rollout) are then searched
for — raw and base64 — in a plain-text dump of the whole database, in every log record the hub wrote
(at DEBUG), in the audit log, and in the answer of every GET route of the API. None may hold them.
The one place they must be is the device's disk."""

from __future__ import annotations

import base64
import logging
import re
import subprocess
import uuid

import trio

from hub.backup import _tool
from tests.hubtools import start_agent, start_hub, wait_for

CANARIES = [b"canary-device-9f1c2e7a", b"canary-config-4b8d0c31", b"canary-rollout-77e1aa05"]


def _forms(secret: bytes) -> list[str]:
    return [secret.decode(), base64.b64encode(secret).decode(), secret.hex()]


async def test_secret_plaintexts_appear_nowhere_but_on_the_device(nursery, db_url, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    with trio.fail_after(90):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        r = await hub.call("POST", "/v1/fleets", json={"name": "canary-fleet"})
        fleet = r.json()["data"]["id"]
        device_id, token = await hub.provision("canary-device", fleet_id=fleet)
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent")
        root = running.agent.root

        r = await hub.call("POST", f"/v1/devices/{device_id}/secret-files",
                           json={"path": "/etc/app/device-key", "content_base64": base64.b64encode(CANARIES[0]).decode()})
        assert r.status_code == 201, r.text
        r = await hub.call("POST", "/v1/configurations", json={"name": "canary-config", "spec": {"k": 1}})
        config = r.json()["data"]["id"]
        r = await hub.call("POST", f"/v1/configurations/{config}/secret-files",
                           json={"path": "/etc/app/config-key", "content_base64": base64.b64encode(CANARIES[1]).decode()})
        assert r.status_code == 201, r.text
        r = await hub.call("PUT", f"/v1/devices/{device_id}/configuration", json={"configId": config})
        assert r.status_code in (200, 202), r.text
        # a second configuration reaches the device through a rollout
        r = await hub.call("POST", "/v1/configurations", json={"name": "canary-rollout", "spec": {"k": 2}})
        config2 = r.json()["data"]["id"]
        await hub.call("POST", f"/v1/configurations/{config2}/secret-files",
                       json={"path": "/etc/app/rollout-key", "content_base64": base64.b64encode(CANARIES[2]).decode()})
        r = await hub.call("POST", "/v1/rollouts", json={"fleet_id": fleet, "config_id": config2, "force": True})
        assert r.status_code == 201, r.text
        rollout = r.json()["data"]["id"]

        await wait_for(lambda: (root / "etc/app/device-key").exists() and (root / "etc/app/rollout-key").exists(),
                       timeout=30)
        assert (root / "etc/app/device-key").read_bytes() == CANARIES[0]
        assert (root / "etc/app/rollout-key").read_bytes() == CANARIES[2]
        await hub.services.audit_log.flush()
        await hub.services.meter.flush()

        # every GET route, with our own ids filled in
        fill = {"device_id": device_id, "fleet_id": fleet, "config_id": config, "rollout_id": rollout,
                "pat_id": hub.pat[0], "feature": "telemetry", "sid": str(uuid.uuid4()), "user_id": str(hub.user_id),
                "sa_id": str(uuid.uuid4()), "webhook_id": str(uuid.uuid4())}
        files = (await hub.call("GET", f"/v1/configurations/{config}/secret-files")).json()["data"]
        fill["file_id"] = files[0]["id"]
        # the spec's own spelling of the same parameters (issue 15)
        fill |= {"deviceId": fill["device_id"], "fleetId": fill["fleet_id"], "configId": fill["config_id"],
                 "fileId": fill["file_id"], "id": fill["device_id"], "invitation_id": str(uuid.uuid4()), "run_id": str(uuid.uuid4())}
        fill |= {"page": "devices", "name": "app.js"}  # the console's pages and static files (hub/console/)
        fill |= {"reference": "sha256:" + "0" * 64}  # the registry proxy (hub/registry/)
        from hub.app import create_app
        bodies: list[str] = []
        for rule in create_app(hub.services).url_map.iter_rules():
            if (rule.websocket or "GET" not in rule.methods or rule.rule.endswith(("/events", "/stream"))
                    or rule.rule.startswith("/static")):
                continue
            path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", lambda m: fill.get(m.group(1), m.group(0)), rule.rule)
            assert "<" not in path, f"teach this test to fill {path}"
            r = await hub.call("GET", path)
            assert r.status_code < 500, (path, r.status_code, r.text[:300])
            bodies.append(f"{path} {r.status_code} {r.text}")
        r = await hub.call("GET", "/v1/audit-events", params={"limit": 1000})
        assert r.status_code == 200 and len(r.json()["data"]) >= 5
        bodies.append(r.text)

        major = int(await hub.services.db.fetchval("SHOW server_version_num")) // 10000
        dump = subprocess.run([_tool("pg_dump", major), "--data-only", "--inserts", db_url], capture_output=True,
                              text=True, timeout=60)
        assert dump.returncode == 0, dump.stderr
        assert "canary-fleet" in dump.stdout  # the dump is the whole database, readable

        logs = "\n".join(f"{rec.name} {rec.getMessage()} {rec.exc_text or ''}" for rec in caplog.records)
        assert logs, "the hub logged nothing at DEBUG"
        for secret in CANARIES:
            for form in _forms(secret):
                assert form not in dump.stdout, f"{form} in the database"
                assert form not in logs, f"{form} in the logs"
                for text in bodies:
                    assert form not in text, f"{form} in {text[:200]}"
