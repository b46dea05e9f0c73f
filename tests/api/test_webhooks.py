"""Webhooks (issue 33): endpoints for organisation admins, the secret shown once, Standard Webhooks
signatures (verified with the `standardwebhooks` package, not our code), at least once and in order,
retries, disabling with an event, the delivery log, ping, redelivery, the address checks, and the
lease that fences one endpoint's delivery to one node."""

from __future__ import annotations

import datetime as dt
import json
import uuid

import trio
from standardwebhooks.webhooks import Webhook

from device_client.shared.clock import rfc3339
from hub.webhooks import sender
from hub.webhooks.schedule import Schedule
from storage.webhooks import Attempt, Stale
from tests.api.webhook_receiver import Receiver
from tests.hubtools import assert_error, metric_value, metrics, start_hub, wait_for

FAST = Schedule(base=0.05, cap=0.2, give_up=3600)


def _creds(pat: tuple[str, str], org_id: str) -> dict[str, str]:
    return {"X-API-Token-ID": pat[0], "X-API-Secret-Key": pat[1], "X-Organization-ID": org_id}


async def _record(hub, device_id: str, n: int, start: int = 0) -> None:
    s = hub.services
    for i in range(start, start + n):
        s.journal.record(uuid.UUID(hub.org_id), {"kind": "device.event.probe", "deviceId": device_id,
                                                 "at": rfc3339(s.clock.now()), "payload": {"n": i}})
    await s.journal.wait_written()


async def _setup(nursery, db_url, tmp_path, **settings):
    hub = await start_hub(nursery, db_url, tmp_path, webhooks_allow_private=True, **settings)
    hub.services.deliverer.schedule = FAST
    receiver = Receiver()
    await nursery.start(receiver.serve)
    return hub, receiver


async def _endpoint(hub, receiver: Receiver, types=("io.fleethub.device.*",), **extra) -> dict:
    r = await hub.call("POST", "/v1/webhooks", json={"url": receiver.url, "event_types": list(types), **extra})
    assert r.status_code == 201, r.text
    return r.json()["data"]


def _verified(secret: str, request) -> dict:
    """The body as the reference library verifies it (raises when the signature is wrong)."""
    return Webhook(secret).verify(request.body, request.headers)


async def test_an_admin_registers_an_endpoint_and_its_secret_is_shown_once(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub = await start_hub(nursery, db_url, tmp_path)  # private addresses refused (the default)
        receiver = Receiver()
        await nursery.start(receiver.serve)
        r = await hub.call("POST", "/v1/webhooks", json={"url": receiver.url, "event_types": ["*"]})
        body = assert_error(r, 400, "invalid_url")
        assert "FLEETHUB_WEBHOOKS_ALLOW_PRIVATE" in body["message"] and receiver.url not in body["message"]
        for url in ("http://169.254.169.254/latest", "http://10.0.0.1/x", "ftp://example.com/x",
                    "http://user:pw@example.com/x"):
            assert_error(await hub.call("POST", "/v1/webhooks", json={"url": url, "event_types": ["*"]}), 400,
                         "invalid_url")
        # the sender refuses a private address at delivery too (hub/webhooks/wire.py connects to what it checked)
        outcome = await sender.post(receiver.url, b"{}", {}, allow_private=False)
        assert outcome.status is None and "private" in outcome.error and receiver.requests == []
        member = await hub.new_user("member")
        r = await hub.call("POST", "/v1/webhooks", headers=_creds(member, hub.org_id),
                           json={"url": "https://203.0.113.9/x", "event_types": ["*"]})
        assert_error(r, 403, "admin_required")
        assert_error(await hub.call("POST", "/v1/webhooks", json={"url": "https://203.0.113.9/x",
                                                                  "event_types": ["device.state"]}),
                     400, "invalid_type")


async def test_events_are_delivered_signed_in_order_and_logged(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub, receiver = await _setup(nursery, db_url, tmp_path)
        a, _ = await hub.provision("a")
        b, _ = await hub.provision("b")
        created = await _endpoint(hub, receiver)
        secret = created["secret"]
        assert secret.startswith("whsec_")
        listed = (await hub.call("GET", "/v1/webhooks")).json()["data"]
        assert [w["id"] for w in listed] == [created["id"]] and "secret" not in listed[0]
        await _record(hub, a, 3)
        await _record(hub, b, 2)
        await wait_for(lambda: len(receiver.requests) >= 5, timeout=30)
        bodies = [_verified(secret, r) for r in receiver.requests]
        assert [int(e["sequence"]) for e in bodies] == sorted(int(e["sequence"]) for e in bodies)
        assert [(e["subject"], e["data"]["n"]) for e in bodies] == [
            (f"devices/{a}", 0), (f"devices/{a}", 1), (f"devices/{a}", 2), (f"devices/{b}", 0), (f"devices/{b}", 1)]
        assert [r.headers["webhook-id"] for r in receiver.requests] == [e["id"] for e in bodies]
        # a tampered body fails the reference verification
        tampered = receiver.requests[0]
        try:
            Webhook(secret).verify(tampered.body.replace(b'"n":0', b'"n":9'), tampered.headers)
        except Exception:  # noqa: BLE001 — the library's WebhookVerificationError
            pass
        else:
            raise AssertionError("a tampered body verified")

        async def logged() -> list:
            r = await hub.call("GET", f"/v1/webhooks/{created['id']}/deliveries")
            return r.json()["data"]

        await wait_for(lambda: _len_at_least(logged, 5), timeout=10)
        log = await logged()
        assert all(d["ok"] and d["status"] == 200 and d["responseExcerpt"] == "ok" and not d["manual"] for d in log)
        endpoint = (await hub.call("GET", f"/v1/webhooks/{created['id']}")).json()["data"]
        assert endpoint["cursor"] == int(bodies[-1]["sequence"]) and endpoint["health"]["failingAttempts"] == 0
        text = await metrics(hub)
        assert metric_value(text, "fleethub_webhook_deliveries_total", {"outcome": "delivered"}) == 5
        assert metric_value(text, "fleethub_webhook_endpoints_served") == 1
        assert metric_value(text, "fleethub_event_log_appended_total") >= 5
        assert metric_value(text, "fleethub_event_log_pending") == 0


async def _len_at_least(fetch, n: int) -> bool:
    return len(await fetch()) >= n


async def test_failures_are_retried_and_no_event_overtakes_another(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub, receiver = await _setup(nursery, db_url, tmp_path)
        a, _ = await hub.provision("a")
        failures = {"left": 4}

        def answer(_request) -> int:
            if failures["left"] > 0:
                failures["left"] -= 1
                return 503
            return 200

        receiver.answer = answer
        created = await _endpoint(hub, receiver)
        await _record(hub, a, 3)
        await wait_for(lambda: sum(1 for r in receiver.requests if r.headers) >= 7, timeout=30)
        bodies = [json.loads(r.body) for r in receiver.requests]
        # the first event was tried five times (same webhook-id), then each went once, in order
        assert [b["data"]["n"] for b in bodies] == [0, 0, 0, 0, 0, 1, 2]
        assert len({r.headers["webhook-id"] for r in receiver.requests[:5]}) == 1
        log = (await hub.call("GET", f"/v1/webhooks/{created['id']}/deliveries")).json()["data"]
        failed = [d for d in log if not d["ok"]]
        assert [d["attempt"] for d in reversed(failed)] == [1, 2, 3, 4]
        assert all(d["status"] == 503 and d["error"] == "the receiver answered 503" for d in failed)


async def test_an_endpoint_that_keeps_failing_is_disabled_with_an_event_and_resumes_when_enabled(
        nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub, receiver = await _setup(nursery, db_url, tmp_path)
        hub.services.deliverer.schedule = Schedule(base=0.05, cap=0.1, give_up=0.5)
        a, _ = await hub.provision("a")
        receiver.answer = lambda _r: 500
        created = await _endpoint(hub, receiver)
        await _record(hub, a, 1)

        async def disabled() -> bool:
            r = await hub.call("GET", f"/v1/webhooks/{created['id']}")
            return not r.json()["data"]["enabled"]

        await wait_for(disabled, timeout=30)
        endpoint = (await hub.call("GET", f"/v1/webhooks/{created['id']}")).json()["data"]
        assert "every delivery failed since" in endpoint["disabledReason"]
        await hub.services.journal.wait_written()
        r = await hub.call("GET", "/v1/events", params={"type": "io.fleethub.webhook.disabled"})
        [event] = r.json()["data"]
        assert event["subject"] == f"webhooks/{created['id']}" and "every delivery failed" in event["data"]["reason"]
        tried = len(receiver.requests)
        await trio.sleep(0.5)
        assert len(receiver.requests) == tried  # disabled: nothing more is sent
        receiver.answer = lambda _r: 200
        r = await hub.call("PATCH", f"/v1/webhooks/{created['id']}", json={"enabled": True})
        assert r.status_code == 200 and r.json()["data"]["enabled"] is True
        await wait_for(lambda: any(json.loads(q.body)["data"].get("n") == 0 for q in receiver.requests[tried:]),
                       timeout=30)


async def test_redirects_are_not_followed(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub, receiver = await _setup(nursery, db_url, tmp_path)
        target = Receiver()
        await nursery.start(target.serve)
        receiver.answer = lambda _r: 307
        receiver.extra_headers = [("location", target.url)]
        a, _ = await hub.provision("a")
        created = await _endpoint(hub, receiver)
        await _record(hub, a, 1)
        await wait_for(lambda: len(receiver.requests) >= 2, timeout=30)
        assert target.requests == []
        log = (await hub.call("GET", f"/v1/webhooks/{created['id']}/deliveries")).json()["data"]
        assert log and all(d["status"] == 307 and d["error"] == "redirects are not followed" for d in log)


async def test_ping_and_redelivery_of_a_range(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub, receiver = await _setup(nursery, db_url, tmp_path)
        a, _ = await hub.provision("a")
        created = await _endpoint(hub, receiver)
        r = await hub.call("POST", f"/v1/webhooks/{created['id']}/test")
        assert r.status_code == 200 and r.json()["data"]["ok"] is True and r.json()["data"]["manual"] is True
        ping = _verified(created["secret"], receiver.requests[-1])
        assert ping["type"] == "io.fleethub.webhook.ping"
        await _record(hub, a, 3)
        await wait_for(lambda: len(receiver.requests) >= 4, timeout=30)
        first = [json.loads(q.body) for q in receiver.requests[1:4]]
        seqs = [int(e["sequence"]) for e in first]
        r = await hub.call("POST", f"/v1/webhooks/{created['id']}/redeliver", json={"from": seqs[0], "to": seqs[1]})
        assert r.status_code == 200, r.text
        assert r.json()["data"]["sent"] == 2 and r.json()["data"]["delivered"] == 2
        again = [_verified(created["secret"], q) for q in receiver.requests[4:]]
        assert [e["id"] for e in again] == [e["id"] for e in first[:2]]  # the same ids: receivers dedupe
        assert_error(await hub.call("POST", f"/v1/webhooks/{created['id']}/redeliver",
                                    json={"from": seqs[1], "to": seqs[0]}), 400, "invalid_range")
        r = await hub.call("DELETE", f"/v1/webhooks/{created['id']}")
        assert r.status_code == 200 and r.json()["data"]["deleted"] is True
        assert_error(await hub.call("GET", f"/v1/webhooks/{created['id']}"), 404)


async def test_a_write_under_a_lease_taken_over_is_refused(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub, receiver = await _setup(nursery, db_url, tmp_path)
        s = hub.services
        created = await _endpoint(hub, receiver)
        endpoint_id = uuid.UUID(created["id"])
        await wait_for(lambda: endpoint_id in s.deliverer.running, timeout=30)
        now = s.clock.now()
        assert await s.stores.webhooks.acquire(endpoint_id, "node-b", 30) is None  # held by this node
        # node-b takes the endpoint over once this node's lease has lapsed (as a killed node's does): the
        # row's expiry is set in the past, and re-set after any renewal of this node's running meanwhile
        lapse = "UPDATE webhook_endpoints SET lease_expires_at = clock_timestamp() - interval '1 hour' WHERE id = $1"
        taken = None
        while taken is None:
            await s.db.execute(lapse, endpoint_id)
            taken = await s.stores.webhooks.acquire(endpoint_id, "node-b", 30)
        attempt = Attempt(event_id=uuid.uuid4(), type="io.fleethub.device.event.probe", org_seq=99, attempt=1,
                          status=200, ok=True, latency_ms=1.0, excerpt="", error=None, manual=False, at=now)
        stale = type(taken)(endpoint_id, s.deliverer.owner, taken.epoch - 1)
        try:
            await s.stores.webhooks.delivered(stale, [attempt])
        except Stale:
            pass
        else:
            raise AssertionError("a write under a lease taken over was accepted")
        row = await s.stores.webhooks.get(uuid.UUID(hub.org_id), endpoint_id)
        assert row["cursor"] == created["cursor"] and row["lease_owner"] == "node-b"


async def test_two_nodes_deliver_each_event_once_per_endpoint_and_one_stopping_loses_nothing(
        nursery, db_url, tmp_path):
    from hub.webhooks.worker import Deliverer

    with trio.fail_after(90):
        hub, first = await _setup(nursery, db_url, tmp_path)
        s = hub.services
        receivers = [first]
        for _ in range(3):
            receivers.append(Receiver())
            await nursery.start(receivers[-1].serve)
        # a second node's deliverer on the same database: each endpoint is served by one of the two
        other = Deliverer(s, owner="node-b", schedule=FAST)
        other_scope = trio.CancelScope()

        async def run_other(task_status=trio.TASK_STATUS_IGNORED):
            with other_scope:
                await other.run(task_status=task_status)

        await nursery.start(run_other)
        endpoints = [await _endpoint(hub, r) for r in receivers]
        ids = {uuid.UUID(e["id"]) for e in endpoints}
        await wait_for(lambda: set(s.deliverer.running) | set(other.running) == ids, timeout=30)
        assert not set(s.deliverer.running) & set(other.running)
        a, _ = await hub.provision("a")
        await _record(hub, a, 5)
        await wait_for(lambda: all(len(r.requests) >= 5 for r in receivers), timeout=30)
        # node-b stops: its endpoints move to this node, which goes on from their cursors
        other_scope.cancel()
        await wait_for(lambda: not other.running, timeout=30)
        await _record(hub, a, 5, start=5)
        await wait_for(lambda: all(len(r.requests) >= 10 for r in receivers), timeout=30)
        await trio.sleep(0.3)
        for r in receivers:
            assert [json.loads(q.body)["data"]["n"] for q in r.requests] == list(range(10))


async def test_a_key_rotation_reseals_the_signing_secrets(nursery, db_url, tmp_path):
    from storage.crypto import SecretBox, rotate

    with trio.fail_after(60):
        hub, receiver = await _setup(nursery, db_url, tmp_path)
        s = hub.services
        created = await _endpoint(hub, receiver)
        before = await s.stores.webhooks.secret(uuid.UUID(created["id"]))
        await rotate(s.settings.data_dir, s.stores.secrets.reencrypt_all)
        after = await s.stores.webhooks.secret(uuid.UUID(created["id"]))
        assert after != before
        s.stores.secret_box.reload()
        assert SecretBox.from_data_dir(s.settings.data_dir).open(after).decode() == created["secret"]
        r = await hub.call("POST", f"/v1/webhooks/{created['id']}/test")
        assert r.json()["data"]["ok"] is True
        _verified(created["secret"], receiver.requests[-1])


def test_the_retry_schedule_doubles_with_jitter_in_its_upper_half_and_gives_up_after_three_days():
    import random

    schedule, rand = Schedule(), random.Random(3)
    for attempt, wait in [(1, 5), (2, 10), (3, 20), (10, 2560), (11, 3600), (50, 3600)]:
        delays = [schedule.delay(attempt, rand) for _ in range(200)]
        assert wait / 2 <= min(delays) and max(delays) <= wait, (attempt, min(delays), max(delays))
        assert max(delays) - min(delays) > wait / 4  # jittered, not one value
    since = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
    assert not schedule.exhausted(since, since + dt.timedelta(days=3) - dt.timedelta(seconds=1))
    assert schedule.exhausted(since, since + dt.timedelta(days=3))


async def test_a_change_to_an_endpoint_takes_effect_at_once(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub, first = await _setup(nursery, db_url, tmp_path)
        second = Receiver()
        await nursery.start(second.serve)
        a, _ = await hub.provision("a")
        created = await _endpoint(hub, first)
        await _record(hub, a, 1)
        await wait_for(lambda: len(first.requests) == 1, timeout=30)
        r = await hub.call("PATCH", f"/v1/webhooks/{created['id']}", json={"enabled": False})
        assert r.status_code == 200 and r.json()["data"]["enabled"] is False
        await _record(hub, a, 2, start=1)
        await trio.sleep(1.0)
        assert len(first.requests) == 1  # disabled: nothing sent, not even until the next renewal
        r = await hub.call("PATCH", f"/v1/webhooks/{created['id']}", json={"enabled": True, "url": second.url})
        assert r.status_code == 200, r.text
        await wait_for(lambda: len(second.requests) >= 2, timeout=30)
        assert [json.loads(q.body)["data"]["n"] for q in second.requests] == [1, 2]  # from where it stopped
        assert len(first.requests) == 1


async def test_subjects_go_in_parallel_and_a_failure_of_one_keeps_every_subject_in_order(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub, receiver = await _setup(nursery, db_url, tmp_path)
        devices = [(await hub.provision(f"d{i}"))[0] for i in range(3)]
        refused = {"left": 1}

        async def answer(request) -> int:
            await trio.sleep(0.02)  # a receiver further away: lanes pay (hub/webhooks/worker.py)
            event = json.loads(request.body)
            if event["subject"] == f"devices/{devices[1]}" and event["data"]["n"] == 1 and refused["left"]:
                refused["left"] -= 1
                return 503
            return 200

        receiver.answer = answer
        created = await _endpoint(hub, receiver)
        s = hub.services
        # the receiver's answer time is learnt from its first answers (one at a time), then lanes
        await _record(hub, devices[0], 20, start=100)
        await wait_for(lambda: len(receiver.requests) >= 20, timeout=30)
        receiver.requests.clear()
        for n in range(4):
            for d in devices:
                s.journal.record(uuid.UUID(hub.org_id), {"kind": "device.event.probe", "deviceId": d,
                                                         "at": rfc3339(s.clock.now()), "payload": {"n": n}})
        await s.journal.wait_written()

        await wait_for(lambda: len({q.headers["webhook-id"] for q in receiver.requests}) >= 12
                       and not refused["left"], timeout=30)
        await trio.sleep(0.5)
        requests = [(json.loads(q.body), q.headers["webhook-id"]) for q in receiver.requests]
        # every event delivered; within each subject an event arrives for the first time only after
        # every earlier one did (a repeat, same webhook-id, may come again after its original)
        for d in devices:
            seen: list[int] = []
            for event, _ in requests:
                if event["subject"] == f"devices/{d}" and event["data"]["n"] not in seen:
                    assert all(m < event["data"]["n"] for m in seen), (d, seen, event["data"]["n"])
                    seen.append(event["data"]["n"])
            assert seen == [0, 1, 2, 3], (d, seen)
        # the other subjects went on past the refused event before its retry: the lanes ran in parallel
        failed_at = next(i for i, (e, _) in enumerate(requests)
                         if e["subject"] == f"devices/{devices[1]}" and e["data"]["n"] == 1)
        retried_at = next(i for i in range(failed_at + 1, len(requests)) if requests[i][1] == requests[failed_at][1])
        beyond = [e for e, _ in requests[failed_at + 1:retried_at]
                  if int(e["sequence"]) > int(requests[failed_at][0]["sequence"])]
        assert beyond and {e["subject"] for e in beyond} <= {f"devices/{devices[0]}", f"devices/{devices[2]}"}
        row = await s.stores.webhooks.get(uuid.UUID(hub.org_id), uuid.UUID(created["id"]))
        last = (await s.stores.event_log.cursors(uuid.UUID(hub.org_id)))[0]
        assert row["cursor"] == last and row["attempts"] == 0
