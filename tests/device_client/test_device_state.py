"""The device's own disk: atomic state file and the identity key."""

from __future__ import annotations

import json
import os
import stat

import pytest
from nacl.signing import SigningKey

from device_client.state import IdentityError, StateFile, load_or_create_identity, write_atomic


def test_state_file_updates_atomically_and_removes_none(tmp_path):
    state = StateFile(tmp_path / "state.json")
    assert state.load() == {}
    state.update(a=1, b="x")
    state.update(b=None, c=[1])
    assert json.loads((tmp_path / "state.json").read_text()) == {"a": 1, "c": [1]}
    assert StateFile(tmp_path / "state.json").load() == {"a": 1, "c": [1]}
    assert stat.S_IMODE((tmp_path / "state.json").stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["state.json"]  # no temporary files left behind


def test_failed_write_leaves_the_old_file_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "f"
    write_atomic(path, b"old")

    def boom(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, b"new")
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["f"]


def test_corrupt_state_is_moved_aside(tmp_path, caplog):
    (tmp_path / "state.json").write_text("{not json")
    assert StateFile(tmp_path / "state.json").load() == {}
    assert (tmp_path / "state.json.corrupt").read_text() == "{not json"
    assert "unreadable" in caplog.text


def test_identity_is_created_0600_and_reused(tmp_path):
    path = tmp_path / "identity.key"
    key = load_or_create_identity(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(path.read_bytes()) == 32
    assert bytes(load_or_create_identity(path)) == bytes(key)
    signed = key.sign(b"grant")
    load_or_create_identity(path).verify_key.verify(signed)


def test_identity_with_loose_mode_is_tightened(tmp_path, caplog):
    path = tmp_path / "identity.key"
    path.write_bytes(bytes(SigningKey.generate()))
    path.chmod(0o644)
    load_or_create_identity(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "readable by others" in caplog.text


def test_damaged_identity_is_never_silently_replaced(tmp_path):
    path = tmp_path / "identity.key"
    path.write_bytes(b"short")
    path.chmod(0o600)
    with pytest.raises(IdentityError, match="32-byte"):
        load_or_create_identity(path)
    assert path.read_bytes() == b"short"
