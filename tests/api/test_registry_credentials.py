"""Registry credentials (issue 36 item 3): an organisation's login for a registry is write-only. The
hub pins a version's images with it and delivers it, in config.apply, to the devices that run a
version from that registry, and to no other; the agent keeps it in a 0600 file in its 0700 data dir
for the engine's pulls. The password is never in an answer, a list, the audit log, an error or a log
line. A real hub, a real registry with htpasswd (bcrypt) auth, real agents with the fake engine."""

from __future__ import annotations

import base64
import json
import logging
import stat

import trio

from device_client.engine.fake import FakeEngine
from device_client.shared.imageref import parse
from tests.containertools import needs_registry, start_registry
from tests.hubtools import device, start_agent, start_hub, wait_for

pytestmark = needs_registry

PASSWORD = "s3cret-Pa55-9f1c"
WRONG = "wrong-Pa55-77aa"


async def test_a_registry_login_pins_and_reaches_only_the_devices_that_pull_from_it(nursery, db_url, tmp_path,
                                                                                    caplog):
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []  # every answer the hub gave, as text

    async def call(hub, method, path, **kw):
        r = await hub.call(method, path, **kw)
        seen.append(r.text)
        return r

    with trio.fail_after(90):
        reg = await start_registry(nursery, tmp_path / "registry", build=False, htpasswd={"puller": PASSWORD})
        image = await reg.push_blank("private/web", "1")
        public = await start_registry(nursery, tmp_path / "public", build=False)
        other_image = await public.push_blank("open/web", "1")
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5,
                              registries=(reg.host, public.host))
        spec = {"containers": [{"name": "web", "image": image}]}

        # without a credential the registry's 401 is explained
        r = await call(hub, "POST", "/v1/configurations", json={"name": "shop", "spec": spec})
        assert r.status_code == 400 and r.json()["error"] == "image_unresolved", r.text
        assert "POST /v1/registry-credentials" in r.json()["message"]

        # a wrong password: refused, naming the user, never the password
        r = await call(hub, "POST", "/v1/registry-credentials",
                       json={"registry": reg.host, "username": "puller", "password": WRONG})
        assert r.status_code == 201, r.text
        first = r.json()["data"]
        assert set(first) == {"id", "registry", "username", "createdAt", "updatedAt"}, first
        r = await call(hub, "POST", "/v1/configurations", json={"name": "shop", "spec": spec})
        assert r.status_code == 400, r.text
        assert "refused the organisation's credential (user puller)" in r.json()["message"]

        # the right one replaces it (same registry: 200, same id)
        r = await call(hub, "POST", "/v1/registry-credentials",
                       json={"registry": reg.host, "username": "puller", "password": PASSWORD})
        assert r.status_code == 200 and r.json()["data"]["id"] == first["id"], r.text
        r = await call(hub, "POST", "/v1/registry-credentials",
                       json={"registry": "not a host", "username": "puller", "password": PASSWORD})
        assert r.status_code == 400 and r.json()["error"] == "invalid_registry", r.text
        r = await call(hub, "GET", "/v1/registry-credentials")
        assert [(c["registry"], c["username"]) for c in r.json()["data"]] == [(reg.host, "puller")]

        r = await call(hub, "POST", "/v1/configurations", json={"name": "shop", "spec": spec})
        assert r.status_code == 201, r.text
        cid, pinned = r.json()["data"]["id"], r.json()["data"]["version"]["spec"]["containers"][0]["image"]
        r = await call(hub, "POST", "/v1/configurations", json={
            "name": "open", "spec": {"containers": [{"name": "web", "image": other_image}]}})
        assert r.status_code == 201, r.text
        open_cid = r.json()["data"]["id"]

        # one device runs the private version, another a version from the public registry
        engines = {}
        for name, config_id in (("private", cid), ("public", open_cid)):
            dev, token = await hub.provision(name)
            engines[name] = (dev, FakeEngine(),
                             tmp_path / name)
            await start_agent(nursery, hub.base_url, token, tmp_path / name, container_engine=engines[name][1])
            r = await call(hub, "PUT", f"/v1/devices/{dev}/configuration", json={"configId": config_id})
            assert r.status_code == 202, r.text
        for name, (dev, engine, data) in engines.items():
            async def applied(dev=dev):
                return (await device(hub, dev))["configuration"]["status"] == "applied"

            await wait_for(applied, timeout=30, interval=0.1)

        dev, engine, data = engines["private"]
        assert engine.auth_registries[parse(pinned).digest] == [reg.host]
        auth_file = data / "registry-auth.json"
        assert stat.S_IMODE(auth_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        login = json.loads(auth_file.read_text())["auths"][reg.host]["auth"]
        assert base64.b64decode(login).decode() == f"puller:{PASSWORD}"
        dev, engine, data = engines["public"]
        assert list(engine.auth_registries.values()) == [[]], "another registry's login was delivered"
        assert not (data / "registry-auth.json").exists()

        r = await call(hub, "DELETE", f"/v1/registry-credentials/{first['id']}")
        assert r.status_code == 200 and r.json()["data"]["deleted"] is True, r.text
        assert (await call(hub, "GET", "/v1/registry-credentials")).json()["data"] == []
        assert (await call(hub, "DELETE", f"/v1/registry-credentials/{first['id']}")).status_code == 404

        await hub.services.audit_log.flush()
        audit = await hub.services.db.fetch("SELECT * FROM audit_events")
        actions = {row["action"] for row in audit}
        assert "registry_credentials.put_credential" in actions, actions
        stored = await hub.services.db.fetch("SELECT * FROM registry_credentials")
        assert stored == []  # deleted
        for secret in (PASSWORD, WRONG, base64.b64encode(f"puller:{PASSWORD}".encode()).decode()):
            assert not any(secret in text for text in seen), "a password in an answer"
            assert not any(secret in str(dict(row)) for row in audit), "a password in the audit log"
            assert secret not in caplog.text, "a password in a log line"


async def test_a_key_rotation_reseals_registry_passwords(nursery, db_url, tmp_path):
    from storage.crypto import rotate

    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path / "hub")
        s = hub.services
        r = await hub.call("POST", "/v1/registry-credentials",
                           json={"registry": "registry.example.com", "username": "u", "password": PASSWORD})
        assert r.status_code == 201, r.text
        before = (await s.db.fetchrow("SELECT ciphertext FROM registry_credentials"))["ciphertext"]
        assert PASSWORD.encode() not in before
        assert await rotate(s.settings.data_dir, s.stores.secrets.reencrypt_all) == 1
        s.stores.secret_box.reload()
        after = (await s.db.fetchrow("SELECT ciphertext FROM registry_credentials"))["ciphertext"]
        assert after != before and s.stores.secret_box.open(after).decode() == PASSWORD


async def test_a_login_rotated_or_deleted_reaches_the_devices_running_a_version_from_its_registry(
        nursery, db_url, tmp_path):
    """No new version: a rotation reaches a linked device at once and an offline one at its next hello;
    a deletion leaves the device's auth file. A device of another registry is left alone."""
    rotated = "r0tated-Pa55-31d2"

    def login_on(data) -> str | None:
        path = data / "registry-auth.json"
        if not path.exists():
            return None
        return base64.b64decode(json.loads(path.read_text())["auths"][reg.host]["auth"]).decode()

    with trio.fail_after(120):
        reg = await start_registry(nursery, tmp_path / "registry", build=False,
                                   htpasswd={"puller": PASSWORD, "rotated": rotated})
        image = await reg.push_blank("private/web", "1")
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5, registries=(reg.host,))
        r = await hub.call("POST", "/v1/registry-credentials",
                           json={"registry": reg.host, "username": "puller", "password": PASSWORD})
        assert r.status_code == 201, r.text
        cred = r.json()["data"]["id"]
        r = await hub.call("POST", "/v1/configurations",
                           json={"name": "shop", "spec": {"containers": [{"name": "web", "image": image}]}})
        assert r.status_code == 201, r.text
        cid = r.json()["data"]["id"]
        agents = {}
        for name in ("linked", "offline"):
            dev, token = await hub.provision(name)
            engine = FakeEngine()
            agents[name] = (dev, token, engine, await start_agent(nursery, hub.base_url, token, tmp_path / name,
                                                                  container_engine=engine))
            assert (await hub.call("PUT", f"/v1/devices/{dev}/configuration", json={"configId": cid})).status_code == 202

            async def applied(dev=dev):
                return (await device(hub, dev))["configuration"]["status"] == "applied"

            await wait_for(applied, timeout=30, interval=0.1)
            assert login_on(tmp_path / name) == f"puller:{PASSWORD}"
        dev, token, engine, running = agents["offline"]
        running.scope.cancel()
        await running.done.wait()

        async def offline():
            return (await device(hub, dev))["online"] is False

        await wait_for(offline, timeout=30, interval=0.2)

        r = await hub.call("POST", "/v1/registry-credentials",
                           json={"registry": reg.host, "username": "rotated", "password": rotated})
        assert r.status_code == 200, r.text

        async def linked_rotated():
            return login_on(tmp_path / "linked") == f"rotated:{rotated}"

        await wait_for(linked_rotated, timeout=30, interval=0.1)
        assert login_on(tmp_path / "offline") == f"puller:{PASSWORD}"  # not linked: nothing reached it yet
        pulls = len(agents["linked"][2].mirrors)

        await start_agent(nursery, hub.base_url, token, tmp_path / "offline", container_engine=FakeEngine())

        async def offline_rotated():
            return login_on(tmp_path / "offline") == f"rotated:{rotated}"

        await wait_for(offline_rotated, timeout=30, interval=0.1)

        assert (await hub.call("DELETE", f"/v1/registry-credentials/{cred}")).status_code == 200

        async def linked_dropped():
            return not (tmp_path / "linked" / "registry-auth.json").exists()

        await wait_for(linked_dropped, timeout=30, interval=0.1)
        assert len(agents["linked"][2].mirrors) == pulls, "the version was applied again: it pulled"
        for name in ("linked", "offline"):
            row = await device(hub, agents[name][0])
            assert row["configuration"]["status"] == "applied", row["configuration"]


async def test_a_fleets_registry_proxy_mode_reaches_its_devices_running_containers(nursery, db_url, tmp_path):
    """Sent with the version (config.apply registryProxy) and again when the fleet's switch or mode
    changes, without a new version: the agent keeps it with the version for the pulls of a restart."""
    with trio.fail_after(90):
        reg = await start_registry(nursery, tmp_path / "registry", build=False)
        image = await reg.push_blank("app/web", "1")
        hub = await start_hub(nursery, db_url, tmp_path / "hub", heartbeat_interval=0.5, registries=(reg.host,))
        fleet = (await hub.call("POST", "/v1/fleets", json={"name": "edge", "registry_proxy": True})).json()["data"]
        dev, token = await hub.provision("edge-1", fleet_id=fleet["id"])
        engine = FakeEngine()
        await start_agent(nursery, hub.base_url, token, tmp_path / "agent", container_engine=engine)
        r = await hub.call("POST", "/v1/configurations",
                           json={"name": "web", "spec": {"containers": [{"name": "web", "image": image}]}})
        assert r.status_code == 201, r.text
        r = await hub.call("PUT", f"/v1/devices/{dev}/configuration", json={"configId": r.json()["data"]["id"]})
        assert r.status_code == 202, r.text

        def mode() -> str | None:
            path = tmp_path / "agent" / "config-current.json"
            return json.loads(path.read_text()).get("registryProxy") if path.exists() else None

        async def recorded(want: str) -> bool:
            return mode() == want and (await device(hub, dev))["configuration"]["status"] == "applied"

        await wait_for(lambda: recorded("fallback"), timeout=30, interval=0.1)
        pulls = len(engine.mirrors)
        for change, want in (({"registry_proxy_mode": "always"}, "always"), ({"registry_proxy": False}, "off")):
            r = await hub.call("PATCH", f"/v1/fleets/{fleet['id']}", json=change)
            assert r.status_code == 200, r.text
            await wait_for(lambda: recorded(want), timeout=30, interval=0.1)
        # moved to a fleet with another mode: the device gets that fleet's mode at once, too
        other = (await hub.call("POST", "/v1/fleets", json={"name": "strict", "registry_proxy": True,
                                                             "registry_proxy_mode": "always"})).json()["data"]
        r = await hub.call("PATCH", f"/v1/devices/{dev}", json={"fleet_id": other["id"]})
        assert r.status_code == 200, r.text
        await wait_for(lambda: recorded("always"), timeout=30, interval=0.1)
        assert len(engine.mirrors) == pulls, "the version was applied again"
