"""Spec, Endpoints → Devices, fleets and configuration versions (listed only: payloads not shown), so
each row is its status on a real hub and device."""

from __future__ import annotations

import uuid

from tests.conformance.helpers import error_code, new_config, new_fleet


def test_get_devices(spec):
    r = spec.call("GET", "/v1/devices")
    assert r.status_code == 200 and isinstance(r.json()["data"], list)


def test_get_device_by_device_id(spec):
    r = spec.call("GET", f"/v1/devices/{spec.device_id}")
    assert r.status_code == 200 and r.json()["data"]["id"] == spec.device_id
    assert error_code(spec.call("GET", f"/v1/devices/{uuid.uuid4()}"), 404)


def test_post_device_reboot(spec):
    dev = spec.linked_device("reboot")
    assert spec.call("POST", f"/v1/devices/{dev}/reboot").status_code == 202
    assert error_code(spec.call("POST", f"/v1/devices/{spec.offline_device_id}/reboot"), 503)


def test_patch_device_by_device_id(spec):
    r = spec.call("PATCH", f"/v1/devices/{spec.offline_device_id}", json={"tags": ["patched"]})
    assert r.status_code == 200 and r.json()["data"]["tags"] == ["patched"]


def test_get_fleets(spec):
    assert spec.call("GET", "/v1/fleets").status_code == 200


def test_post_fleets(spec):
    assert new_fleet(spec)["id"]


def test_patch_fleet_by_fleet_id(spec):
    fleet = new_fleet(spec)
    r = spec.call("PATCH", f"/v1/fleets/{fleet['id']}", json={"description": "patched"})
    assert r.status_code == 200, r.text


def test_get_configuration_versions(spec):
    config = new_config(spec)
    r = spec.call("GET", f"/v1/configurations/{config['id']}/versions")
    assert r.status_code == 200 and [v["version"] for v in r.json()["data"]] == [1]


def test_post_configuration_versions(spec):
    config = new_config(spec)
    r = spec.call("POST", f"/v1/configurations/{config['id']}/versions", json={"spec": {"ports": [{"port": 1}]}})
    assert r.status_code == 201 and r.json()["data"]["version"] == 2
