"""``fleethub serve``, ``fleethub admin`` and ``fleethub agent`` together, as an operator sets a hub up."""

from __future__ import annotations

import uuid

import httpx

from tests.e2e.clitools import api, free_port, postgres_of, run_cli_json, wait_until


def healthy(base_url: str) -> bool:
    return httpx.get(base_url + "/readyz", timeout=2).status_code == 200


def test_admin_serve_and_agent(tmp_path, procs):
    data = tmp_path / "hub"

    # serve creates the data dir; admin works beside the running hub (it shares its PostgreSQL)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    serve = procs("serve", ["serve", "--port", str(port), "--data-dir", str(data)])
    wait_until(lambda: healthy(base_url), timeout=40, what="fleethub serve to be ready", proc=serve)

    org = run_cli_json(["admin", "--data-dir", str(data), "create-org", "Acme Robotics"])
    assert set(org) >= {"id", "name", "tier"} and org["name"] == "Acme Robotics" and org["tier"] == "standard"
    uuid.UUID(org["id"])
    user = run_cli_json(["admin", "--data-dir", str(data), "create-user", "ops@acme.test", "--org", org["id"],
                         "--role", "admin"])
    assert user["email"] == "ops@acme.test" and user["org_id"] == org["id"] and user["role"] == "admin"
    member = run_cli_json(["admin", "--data-dir", str(data), "create-user", "viewer@acme.test",
                           "--org", org["id"]])
    assert member["role"] == "member"
    pat = run_cli_json(["admin", "--data-dir", str(data), "create-pat", "ops@acme.test", "--description", "ci"])
    assert pat["id"].startswith("pat_") and pat["secret"] and pat["user"] == "ops@acme.test"
    member_pat = run_cli_json(["admin", "--data-dir", str(data), "create-pat", "viewer@acme.test",
                               "--expires-in-days", "1"])
    assert member_pat["expires_at"]
    assert len(postgres_of(data)) == 1, "admin attached to the hub's server instead of starting another"

    with api(base_url, pat, org["id"]) as c:
        r = c.get("/v1/devices")
        assert r.status_code == 200, r.text
        assert r.json()["data"] == [] and r.json()["pagination"]["total"] == 0
        r = c.post("/v1/fleets", json={"name": "line-1"})
        assert r.status_code == 201, r.text
        fleet_id = r.json()["data"]["id"]
        r = c.post("/v1/devices", json={"name": "arm-1", "fleet_id": fleet_id})
        assert r.status_code == 201, r.text
        dev_id, token = r.json()["data"]["id"], r.json()["data"]["token"]
    with api(base_url, member_pat, org["id"]) as c:
        assert c.get("/v1/devices").status_code == 200
        assert c.post("/v1/devices", json={"name": "nope"}).status_code == 403
    with api(base_url, pat, str(uuid.uuid4())) as c:
        assert c.get("/v1/devices").status_code == 403

    # a real agent process with the token from the REST answer
    agent = procs("agent", ["agent", "--hub", base_url, "--token", token, "--data-dir", str(tmp_path / "device")])

    def online() -> dict | None:
        with api(base_url, pat, org["id"]) as c:
            d = c.get(f"/v1/devices/{dev_id}").json()["data"]
        return d if d["online"] and d["has_tunnel_identity"] else None

    d = wait_until(online, timeout=20, what="the agent's device online", proc=agent)
    assert d["boot_reason"] == "power_on" and d["fleet_id"] == fleet_id
    assert d["firmware"] and d["architecture"]
    assert (tmp_path / "device" / "root").is_dir()

    # reboot: the agent process re-executes itself and comes back with boot reason "reboot"
    with api(base_url, pat, org["id"]) as c:
        r = c.post(f"/v1/devices/{dev_id}/reboot")
        assert r.status_code == 202, r.text

    def rebooted() -> dict | None:
        with api(base_url, pat, org["id"]) as c:
            d = c.get(f"/v1/devices/{dev_id}").json()["data"]
        return d if d["online"] and d["boot_reason"] == "reboot" else None

    wait_until(rebooted, timeout=20, what="the agent back from its reboot", proc=agent)
    assert agent.popen.poll() is None, "an exec reboot keeps the same process"

    assert agent.interrupt(timeout=15) == 0, agent.log_tail()

    def offline() -> bool:
        with api(base_url, pat, org["id"]) as c:
            return not c.get(f"/v1/devices/{dev_id}").json()["data"]["online"]

    wait_until(offline, timeout=15, what="the device offline after its agent stopped", proc=serve)
    assert serve.interrupt(timeout=30) == 0, serve.log_tail()
    wait_until(lambda: not postgres_of(data), timeout=10, what="PostgreSQL to exit")

    # with no hub running, admin brings the embedded PostgreSQL up and down itself
    run_cli_json(["admin", "--data-dir", str(data), "create-org", "Second Org"])
    assert not postgres_of(data), "admin stops the PostgreSQL it started"
