"""Tenant isolation and privilege as properties: hypothesis draws random sequences of operations by
two organisations' admins and a member of the first (fleets, devices in them, configurations,
grants and revocations of the member's access, deletions), runs them against one real hub, and
after every step checks what each caller can list and read against a model:

- an admin sees exactly their own organisation's devices, fleets and configurations;
- the other organisation's objects answer 404, never their data;
- the member sees exactly the devices of the fleets they were granted (viewer), or none;
- the member can change nothing they were not given editor on.

The hub runs in its own thread (its own trio run); hypothesis drives it over HTTP from the test's.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from functools import partial

import httpx
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hub.auth.pat import digest, new_pat
from hub.server import run_hub
from hub.settings import Settings

EXAMPLES = 15


@contextlib.contextmanager
def hub_in_thread(db_url, data_dir):
    ready, stop, box = threading.Event(), None, {}

    async def main():
        nonlocal stop
        stop = trio.Event()
        box["token"] = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            services, base_url = await nursery.start(partial(run_hub, Settings(
                data_dir=data_dir, database_url=db_url, port=0)))
            box["services"], box["base_url"] = services, base_url
            ready.set()
            await stop.wait()
            nursery.cancel_scope.cancel()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    assert ready.wait(60), "the hub did not start"
    try:
        yield box
    finally:
        trio.from_thread.run_sync(stop.set, trio_token=box["token"])
        thread.join(30)


def _on_hub(box, fn, *args):
    return trio.from_thread.run(fn, *args, trio_token=box["token"])


def _setup(box) -> dict:
    """Two organisations with an admin each, and a member of the first; PATs for all three."""
    async def make():
        s = box["services"]
        now = s.clock.now()
        out = {}
        for name in ("A", "B"):
            org = await s.stores.orgs.create_org(f"Org {name}", now, tier="enterprise")
            await s.db.execute("UPDATE organizations SET rate_limit = 10000000 WHERE id = $1", org["id"])
            admin = await s.stores.orgs.create_user(f"admin-{name}-{uuid.uuid4().hex[:6]}@t.local", now)
            await s.stores.orgs.add_member(org["id"], admin["id"], "admin", now)
            pid, secret = new_pat()
            await s.stores.tokens.create_pat(pid, admin["id"], digest(secret), now)
            out[name] = {"org": str(org["id"]), "pat": (pid, secret)}
        member = await s.stores.orgs.create_user(f"member-{uuid.uuid4().hex[:6]}@t.local", now)
        await s.stores.orgs.add_member(uuid.UUID(out["A"]["org"]), member["id"], "member", now)
        pid, secret = new_pat()
        await s.stores.tokens.create_pat(pid, member["id"], digest(secret), now)
        out["M"] = {"org": out["A"]["org"], "pat": pid and (pid, secret), "user": str(member["id"])}
        return out
    return _on_hub(box, make)


def _client(box, who: dict) -> httpx.Client:
    return httpx.Client(base_url=box["base_url"], timeout=20, headers={
        "X-API-Token-ID": who["pat"][0], "X-API-Secret-Key": who["pat"][1], "X-Organization-ID": who["org"]})


OPS = st.one_of(
    st.tuples(st.just("fleet"), st.sampled_from("AB")),
    st.tuples(st.just("device"), st.sampled_from("AB"), st.integers(0, 5)),
    st.tuples(st.just("config"), st.sampled_from("AB")),
    st.tuples(st.just("grant"), st.integers(0, 5), st.sampled_from(["viewer", "editor"])),
    st.tuples(st.just("revoke"), st.integers(0, 5)),
    st.tuples(st.just("delete_device"), st.sampled_from("AB"), st.integers(0, 5)),
    st.tuples(st.just("member_rename"), st.integers(0, 5)),
)


def test_isolation_and_privilege_hold_over_random_operations(db_url, tmp_path):
    with hub_in_thread(db_url, tmp_path / "hub") as box:
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
        @given(ops=st.lists(OPS, min_size=1, max_size=20))
        def run(ops):
            who = _setup(box)
            with _client(box, who["A"]) as a, _client(box, who["B"]) as b, _client(box, who["M"]) as m:
                clients = {"A": a, "B": b}
                model = {"A": {"fleets": [], "devices": {}, "configs": []},
                         "B": {"fleets": [], "devices": {}, "configs": []}}
                grants: dict[str, str] = {}  # fleet id of A -> relation held by the member
                for op in ops:
                    _apply(op, clients, m, who, model, grants)
                    _check(clients, m, model, grants)

        run()


def _apply(op, clients, m, who, model, grants) -> None:
    kind = op[0]
    if kind == "fleet":
        org = op[1]
        r = clients[org].post("/v1/fleets", json={"name": f"f-{uuid.uuid4().hex[:8]}"})
        assert r.status_code == 201, r.text
        model[org]["fleets"].append(r.json()["data"]["id"])
    elif kind == "device":
        org, i = op[1], op[2]
        fleets = model[org]["fleets"]
        body = {"name": f"d-{uuid.uuid4().hex[:8]}"}
        if fleets:
            body["fleet_id"] = fleets[i % len(fleets)]
        r = clients[org].post("/v1/devices", json=body)
        assert r.status_code == 201, r.text
        model[org]["devices"][r.json()["data"]["id"]] = body.get("fleet_id")
    elif kind == "config":
        org = op[1]
        r = clients[org].post("/v1/configurations", json={"name": f"c-{uuid.uuid4().hex[:8]}", "spec": {}})
        assert r.status_code == 201, r.text
        model[org]["configs"].append(r.json()["data"]["id"])
    elif kind in ("grant", "revoke"):
        fleets = model["A"]["fleets"]
        if not fleets:
            return
        fleet = fleets[op[1] % len(fleets)]
        if kind == "grant":
            if fleet in grants:
                return
            tup = {"object_type": "fleet", "object_id": fleet, "relation": op[2], "subject_type": "user",
                   "subject_id": who["M"]["user"]}
            r = clients["A"].post("/v1/relations", json=tup)
            assert r.status_code in (200, 201), r.text
            grants[fleet] = op[2]
            # B's admin cannot grant on A's fleet
            r = clients["B"].post("/v1/relations", json=tup)
            assert r.status_code in (400, 403, 404), r.text
        elif fleet in grants:
            tup = {"object_type": "fleet", "object_id": fleet, "relation": grants.pop(fleet),
                   "subject_type": "user", "subject_id": who["M"]["user"]}
            r = clients["A"].request("DELETE", "/v1/relations", json=tup)
            assert r.status_code == 200, r.text
    elif kind == "delete_device":
        org, i = op[1], op[2]
        devices = list(model[org]["devices"])
        if not devices:
            return
        victim = devices[i % len(devices)]
        other = "B" if org == "A" else "A"
        r = clients[other].delete(f"/v1/devices/{victim}")
        assert r.status_code == 404, r.text  # another organisation cannot delete it
        r = clients[org].delete(f"/v1/devices/{victim}")
        assert r.status_code == 200, r.text
        del model[org]["devices"][victim]
    elif kind == "member_rename":
        devices = list(model["A"]["devices"])
        if not devices:
            return
        device = devices[op[1] % len(devices)]
        r = m.patch(f"/v1/devices/{device}", json={"name": f"renamed-{uuid.uuid4().hex[:6]}"})
        fleet = model["A"]["devices"][device]
        if grants.get(fleet) == "editor":
            assert r.status_code == 200, r.text
        else:
            assert r.status_code in (403, 404), r.text


def _ids(client, path) -> set[str]:
    r = client.get(path, params={"limit": 100})
    assert r.status_code == 200, r.text
    return {x["id"] for x in r.json()["data"]}


def _check(clients, m, model, grants) -> None:
    for org, other in (("A", "B"), ("B", "A")):
        c = clients[org]
        assert _ids(c, "/v1/devices") == set(model[org]["devices"])
        assert _ids(c, "/v1/fleets") == set(model[org]["fleets"])
        assert _ids(c, "/v1/configurations") == set(model[org]["configs"])
        for device in model[other]["devices"]:
            r = c.get(f"/v1/devices/{device}")
            assert r.status_code == 404 and device not in r.text
        for fleet in model[other]["fleets"]:
            assert c.get(f"/v1/fleets/{fleet}").status_code == 404
    visible = {d for d, f in model["A"]["devices"].items() if f in grants}
    assert _ids(m, "/v1/devices") == visible
    for device, fleet in model["A"]["devices"].items():
        status = m.get(f"/v1/devices/{device}").status_code
        assert (status == 200) == (fleet in grants), (device, fleet, status)
    for device in model["B"]["devices"]:
        assert m.get(f"/v1/devices/{device}").status_code == 404
