"""The hub's key files are 0600 and its data dir cannot be listed by others (storage/private.py)."""

from __future__ import annotations

import os
import stat

from hub.auth import signing_keys
from storage import crypto
from storage.private import secure_data_dir, write_private


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_keys_are_created_0600_and_a_key_left_readable_is_tightened(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEETHUB_SECRET_KEY", raising=False)
    monkeypatch.delenv(signing_keys.ENV_KEY, raising=False)
    old = os.umask(0)  # the widest umask: modes come from the code, not from the environment
    try:
        crypto.load_or_create_key(tmp_path)
        signing_keys.load_or_create_key(tmp_path)
        write_private(tmp_path / "demo.json", b"{}")
    finally:
        os.umask(old)
    for name in (crypto.KEY_FILE, signing_keys.KEY_FILE, "demo.json"):
        assert mode(tmp_path / name) == 0o600, name
    # a key someone (an older version, a copy by hand) left readable to others: read, and tightened
    for name in (crypto.KEY_FILE, signing_keys.KEY_FILE):
        (tmp_path / name).chmod(0o644)
    crypto.load_ring(tmp_path)
    signing_keys.load_ring(tmp_path)
    for name in (crypto.KEY_FILE, signing_keys.KEY_FILE):
        assert mode(tmp_path / name) == 0o600, name


def test_the_data_dir_cannot_be_listed_by_others(tmp_path):
    data = tmp_path / "hub"
    data.mkdir(mode=0o755)
    secure_data_dir(data)
    assert mode(data) == (0o711 if os.geteuid() == 0 else 0o700)
