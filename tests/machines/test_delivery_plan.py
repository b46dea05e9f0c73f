"""Reconciling what a device reports with what the hub expects, and the delivery status table."""

import pytest

from actors.machines.delivery import (Delivery, IllegalTransition, OverrideRemoved, Overridden, Reupload,
                                      WriteFailed, Wrote, next_status, reconcile)


def f(id_, path, sha, status="pending", config_id=None):
    return {"id": id_, "path": path, "sha256": sha, "status": status, "config_id": config_id}


def test_reconcile_confirms_pushes_and_removes():
    expected = [f("1", "/a", "aa"), f("2", "/b", "bb", "on_device"), f("3", "/c", "cc", "on_device"),
                f("4", "/d", "dd", "on_device", config_id="c"), f("5", "/e", "ee", "pending", config_id="c"),
                f("6", "/g", "gg", "failed", config_id="c")]
    digests = {"/a": "aa", "/b": "bb", "/c": "old", "/stale": "zz"}
    plan = reconcile(expected, digests, push_config_files=True)
    assert plan.confirm == ["1"]            # /b already known on the device
    assert plan.push == ["3", "4", "6"]     # different, missing config file, failed config file
    assert plan.remove == ["/stale"]
    plan = reconcile(expected, digests, push_config_files=False)
    assert plan.push == ["3"]               # configuration files wait for the version


@pytest.mark.parametrize("state,event,new", [
    (Delivery.PENDING, Wrote("x"), Delivery.ON_DEVICE), (Delivery.PENDING, WriteFailed("e"), Delivery.FAILED),
    (Delivery.PENDING, Overridden(), Delivery.OVERRIDDEN), (Delivery.ON_DEVICE, Reupload(), Delivery.PENDING),
    (Delivery.FAILED, Reupload(), Delivery.PENDING), (Delivery.OVERRIDDEN, OverrideRemoved(), Delivery.PENDING),
    (Delivery.OVERRIDDEN, Reupload(), Delivery.OVERRIDDEN),
])
def test_status_table(state, event, new):
    assert next_status(state, event) is new


def test_illegal_status_events_raise():
    with pytest.raises(IllegalTransition):
        next_status(Delivery.OVERRIDDEN, Wrote("x"))
    with pytest.raises(IllegalTransition):
        next_status(Delivery.ON_DEVICE, OverrideRemoved())


def test_reconcile_keeps_the_files_of_the_configuration_the_device_runs():
    # Another configuration is assigned (its file /new is expected); the device still runs the one
    # whose file is /run/db-token (it rejected the new one, or has not applied it yet).
    expected = [f("9", "/new", "nn", "failed", config_id="next")]
    digests = {"/run/db-token": "tt", "/stale": "zz"}
    plan = reconcile(expected, digests, push_config_files=False, keep=["/run/db-token"])
    assert plan.remove == ["/stale"]
    assert reconcile(expected, digests, push_config_files=False).remove == ["/run/db-token", "/stale"]
