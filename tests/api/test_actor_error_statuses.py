"""How the hub answers an actor's error (hub/errors.py ACTOR_STATUS, from_actor): each class of
actors/errors.py keeps the status and code the API answered when actors raised hub errors, and every
class is mapped on purpose (a new one without a status fails here)."""

from __future__ import annotations

import inspect

import pytest

from actors import errors as ae
from hub import errors as he

# (actor error, status, code) as the API answered before actors had their own tree.
ANSWERS = [
    (ae.Invalid("x"), 400, "invalid_request"),
    (ae.NotFound("x"), 404, "not_found"),
    (ae.Conflict("x"), 409, "conflict"),
    (ae.Conflict("x", code="device_rebooting"), 409, "device_rebooting"),
    (ae.Unsupported("x"), 422, "unsupported"),
    (ae.TooSoon("x", retry_after=2.2), 429, "rate_limited"),
    (ae.DeviceRefused("x", code="workload_stop_failed"), 502, "workload_stop_failed"),
    (ae.DeviceRefused("x", code="device_rejected", details={"reason": "x"}), 502, "device_rejected"),
    (ae.DeviceOffline("x"), 503, "device_offline"),
    (ae.DeviceTimeout("x"), 504, "device_timeout"),
    (ae.DeviceUnreachable("x"), 504, "device_unreachable"),
    (ae.MailboxFull("x"), 503, "busy"),
    (ae.AskTimeout("x"), 504, "timeout"),
    (ae.ActorStopped("x"), 500, "internal"),
    (ae.ActorCrashed("x"), 500, "internal"),
]


@pytest.mark.parametrize(("error", "status", "code"), ANSWERS, ids=[f"{type(a[0]).__name__}-{a[2]}" for a in ANSWERS])
def test_each_actor_error_keeps_its_status_and_code(error, status, code):
    answer = he.from_actor(error)
    assert isinstance(answer, he.FleethubError)
    assert (answer.status, answer.code, answer.message, answer.details) == (status, code, "x", error.details)
    assert he.general_body(answer)["error"] == code


def test_too_soon_says_when_to_come_back():
    assert he.from_actor(ae.TooSoon("wait", retry_after=2.2)).headers == {"Retry-After": "3"}


def test_every_actor_error_class_has_a_status_of_its_own():
    classes = {c for _, c in inspect.getmembers(ae, inspect.isclass) if issubclass(c, ae.AskError)}
    assert classes == set(he.ACTOR_STATUS)


def test_the_links_device_errors_are_the_actors_too():
    refused = he.DeviceError("disk full", code="enospc")
    assert isinstance(refused, ae.DeviceRefused) and isinstance(he.DeviceOffline(), ae.DeviceOffline)
    assert he.from_actor(refused) is refused and refused.status == 502
    assert not isinstance(he.Conflict(), ae.AskError)  # no other hub error passes for an actor's
