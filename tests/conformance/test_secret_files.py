"""Spec, Endpoints → Secret files (Resources → Secret file; Limits → secret file rows)."""

from __future__ import annotations

import uuid

from tests.conformance.helpers import b64, error_code, new_config, wait_until


def _files(spec, url: str) -> list[dict]:
    r = spec.call("GET", url)
    assert r.status_code == 200, r.text
    return r.json()["data"]


def test_get_configuration_secret_files(spec):
    url = f"/v1/configurations/{new_config(spec)['id']}/secret-files"
    assert spec.call("POST", url, json={"path": "/etc/app/a", "content_base64": b64(b"secret-a")}).status_code == 201
    [f] = _files(spec, url)
    assert f["path"] == "/etc/app/a" and f["mode"] == "0600" and f["size"] == 8 and f["status"] == "pending"
    assert "secret-a" not in str(f) and b64(b"secret-a") not in str(f)  # metadata only


def test_post_configuration_secret_files(spec):
    url = f"/v1/configurations/{new_config(spec)['id']}/secret-files"
    r = spec.call("POST", url, json={"path": "/etc/app/b", "content_base64": b64(b"one"), "mode": "0640",
                                     "uid": 1000, "gid": 1000})
    assert r.status_code == 201, r.text
    r = spec.call("POST", url, json={"path": "/etc/app/b", "content_base64": b64(b"two")})  # same path replaces
    assert r.status_code in (200, 201) and len(_files(spec, url)) == 1


def test_delete_configuration_secret_file(spec):
    url = f"/v1/configurations/{new_config(spec)['id']}/secret-files"
    file_id = spec.call("POST", url, json={"path": "/etc/app/c", "content_base64": b64(b"c")}).json()["data"]["id"]
    assert spec.call("DELETE", f"{url}/{file_id}").status_code == 200
    assert _files(spec, url) == []
    assert error_code(spec.call("DELETE", f"{url}/{uuid.uuid4()}"), 404)


def test_get_device_secret_files(spec):
    url = f"/v1/devices/{spec.offline_device_id}/secret-files"
    assert isinstance(_files(spec, url), list)


def test_post_device_secret_files(spec):
    url = f"/v1/devices/{spec.offline_device_id}/secret-files"
    path = f"/etc/dev/{uuid.uuid4().hex[:6]}"
    r = spec.call("POST", url, json={"path": path, "content_base64": b64(b"device-secret")})
    assert r.status_code == 201, r.text
    assert r.json()["data"]["status"] == "pending"  # the device is offline: pushed when it connects


def test_delete_device_secret_file(spec):
    url = f"/v1/devices/{spec.offline_device_id}/secret-files"
    path = f"/etc/dev/{uuid.uuid4().hex[:6]}"
    file_id = spec.call("POST", url, json={"path": path, "content_base64": b64(b"x")}).json()["data"]["id"]
    assert spec.call("DELETE", f"{url}/{file_id}").status_code == 200
    assert path not in [f["path"] for f in _files(spec, url)]


def test_limit_secret_file_size_64_kb_empty_rejected(spec):
    url = f"/v1/configurations/{new_config(spec)['id']}/secret-files"
    assert spec.call("POST", url, json={"path": "/etc/s/max", "content_base64": b64(b"x" * 65536)}).status_code == 201
    error_code(spec.call("POST", url, json={"path": "/etc/s/big", "content_base64": b64(b"x" * 65537)}), 413)
    error_code(spec.call("POST", url, json={"path": "/etc/s/empty", "content_base64": ""}), 400)


def test_limit_secret_files_per_configuration_or_device_32(spec):
    url = f"/v1/configurations/{new_config(spec)['id']}/secret-files"
    for i in range(32):
        r = spec.call("POST", url, json={"path": f"/etc/many/{i}", "content_base64": b64(b"x")})
        assert r.status_code == 201, r.text
    error_code(spec.call("POST", url, json={"path": "/etc/many/32", "content_base64": b64(b"x")}), 409)


def test_limit_total_secret_file_size_512_kb(spec):
    url = f"/v1/configurations/{new_config(spec)['id']}/secret-files"
    for i in range(8):  # 8 x 64 KiB = 512 KiB
        r = spec.call("POST", url, json={"path": f"/etc/total/{i}", "content_base64": b64(b"x" * 65536)})
        assert r.status_code == 201, r.text
    error_code(spec.call("POST", url, json={"path": "/etc/total/8", "content_base64": b64(b"x")}), 409)


def test_limit_secret_file_path(spec):
    url = f"/v1/configurations/{new_config(spec)['id']}/secret-files"
    bad = ["relative/path", "/etc/../etc/x", "/etc\\x", "/etc/a\x01b", "/" + "a" * 1024, "/proc/x", "/sys/x",
           "/dev/x", "/boot/x", "/usr/x", "/tmp/x", "/run/x", "/etc/passwd", "/etc/shadow", "/etc/sudoers.d/x",
           "/etc/ld.so.preload", "/etc/fstab"]
    for path in bad:
        error_code(spec.call("POST", url, json={"path": path, "content_base64": b64(b"x")}), 400)
    r = spec.call("POST", url, json={"path": "/" + "a" * 1023, "content_base64": b64(b"x")})
    assert r.status_code == 201, r.text  # 1,024 bytes is allowed


def test_limit_secret_file_mode(spec):
    url = f"/v1/configurations/{new_config(spec)['id']}/secret-files"
    for mode in ("0200", "0620", "0602", "4600", "2600", "1600", "0999"):
        error_code(spec.call("POST", url, json={"path": "/etc/m/x", "content_base64": b64(b"x"), "mode": mode}), 400)
    assert spec.call("POST", url, json={"path": "/etc/m/ok", "content_base64": b64(b"x"),
                                        "mode": "0400"}).status_code == 201


# -- States and transitions → Secret file delivery status -------------------------------------------------
def _file(spec, url: str, path: str) -> dict:
    [f] = [f for f in _files(spec, url) if f["path"] == path]
    return f


def _becomes(spec, url: str, path: str, status: str) -> dict:
    wait_until(spec, lambda: _file(spec, url, path)["status"] == status, timeout=15, interval=0.1)
    return _file(spec, url, path)


def _on_disk(spec, device_id: str, path: str) -> bytes:
    """What the device wrote at ``path`` (the agent's root stands for its /)."""
    return (spec.extra["root"] / f"agent-{device_id}" / "root" / path.lstrip("/")).read_bytes()


def test_secret_file_delivery_device_file_pending_then_on_device(spec):
    dev = spec.linked_device("files")
    url = f"/v1/devices/{dev}/secret-files"
    r = spec.call("POST", url, json={"path": "/etc/deliver/a", "content_base64": b64(b"delivered")})
    assert r.status_code == 201 and r.json()["data"]["status"] == "pending", r.text
    f = _becomes(spec, url, "/etc/deliver/a", "on_device")  # pushed shortly after save
    assert f["error"] is None and _on_disk(spec, dev, "/etc/deliver/a") == b"delivered"
    assert spec.call("DELETE", f"{url}/{f['id']}").status_code == 200  # any → removed from the device
    where = spec.extra["root"] / f"agent-{dev}" / "root" / "etc/deliver/a"
    wait_until(spec, lambda: not where.exists(), timeout=15, interval=0.1)


def test_secret_file_delivery_failed_shows_the_error(spec):
    dev = spec.linked_device("files")
    url = f"/v1/devices/{dev}/secret-files"
    assert spec.call("POST", url, json={"path": "/etc/clash/dir/inner", "content_base64": b64(b"x")}).status_code == 201
    _becomes(spec, url, "/etc/clash/dir/inner", "on_device")
    # a directory is in the way of the device's write: Failed, and the error is shown
    assert spec.call("POST", url, json={"path": "/etc/clash/dir", "content_base64": b64(b"y")}).status_code == 201
    f = _becomes(spec, url, "/etc/clash/dir", "failed")
    assert isinstance(f["error"], str) and f["error"] 


def test_secret_file_delivery_configuration_file_overridden_by_a_device_file(spec):
    dev = spec.linked_device("files")
    config = new_config(spec)
    config_url = f"/v1/configurations/{config['id']}/secret-files"
    assert spec.call("POST", config_url, json={"path": "/etc/ov/token", "content_base64": b64(b"from-config")}) \
        .status_code == 201
    r = spec.call("PUT", f"/v1/devices/{dev}/configuration", json={"configId": config["id"]})
    assert r.status_code in (200, 202), r.text
    _becomes(spec, config_url, "/etc/ov/token", "on_device")  # arrives with the configuration update
    assert _on_disk(spec, dev, "/etc/ov/token") == b"from-config"
    device_url = f"/v1/devices/{dev}/secret-files"
    assert spec.call("POST", device_url, json={"path": "/etc/ov/token", "content_base64": b64(b"from-device")}) \
        .status_code == 201
    _becomes(spec, config_url, "/etc/ov/token", "overridden")
    _becomes(spec, device_url, "/etc/ov/token", "on_device")
    assert _on_disk(spec, dev, "/etc/ov/token") == b"from-device"  # the device file wins
