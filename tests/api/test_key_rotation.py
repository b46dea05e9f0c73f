"""`fleethub admin rotate-secret-key` beside a running hub: every stored content is re-encrypted
under a new key, the hub keeps delivering without a restart and seals new uploads under the new key,
and a rotation that fails half-way leaves every content readable."""

from __future__ import annotations

import argparse
import base64

import nacl.secret
import pytest
import trio

from hub.admin import run_admin
from storage.crypto import KEY_FILE, NEXT_FILE, PREVIOUS_FILE, SecretBox, rotate
from tests.hubtools import start_agent, start_hub, wait_for

PLAINTEXT = b"rotation-canary-7f3a"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def _ciphertexts(s) -> list[bytes]:
    return [r["ciphertext"] for r in await s.db.fetch("SELECT ciphertext FROM secret_files ORDER BY path")]


def _opens_with(key: bytes, ciphertext: bytes) -> bool:
    try:
        nacl.secret.SecretBox(key).decrypt(ciphertext)
        return True
    except Exception:
        return False


async def test_rotation_beside_a_running_hub(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        data = tmp_path / "hub"
        hub = await start_hub(nursery, db_url, data)
        s = hub.services
        device_id, token = await hub.provision("rotating")
        r = await hub.call("POST", f"/v1/devices/{device_id}/secret-files",
                           json={"path": "/etc/app/before", "content_base64": b64(PLAINTEXT)})
        assert r.status_code == 201, r.text
        old_key = (data / KEY_FILE).read_bytes()
        (before,) = await _ciphertexts(s)
        assert _opens_with(old_key, before)

        settings = s.settings
        result = await run_admin(settings, argparse.Namespace(admin_command="rotate-secret-key"))
        assert result == {"rotated": True, "reencrypted": 1}
        new_key = (data / KEY_FILE).read_bytes()
        assert new_key != old_key and (data / PREVIOUS_FILE).read_bytes() == old_key
        assert not (data / NEXT_FILE).exists()
        assert oct((data / KEY_FILE).stat().st_mode & 0o777) == "0o600"
        (after,) = await _ciphertexts(s)
        assert after != before and _opens_with(new_key, after) and not _opens_with(old_key, after)

        # the running hub follows: an upload now is sealed under the new key ...
        await wait_for(lambda: _opens_with(new_key, s.stores.secret_box.seal(b"x")), timeout=5)
        r = await hub.call("POST", f"/v1/devices/{device_id}/secret-files",
                           json={"path": "/etc/app/after", "content_base64": b64(b"second")})
        assert r.status_code == 201, r.text
        assert all(_opens_with(new_key, c) for c in await _ciphertexts(s))
        # ... and a device gets both files, decrypted from the re-encrypted rows
        running = await start_agent(nursery, hub.base_url, token, tmp_path / "agent")
        root = running.agent.root
        await wait_for(lambda: (root / "etc/app/before").exists() and (root / "etc/app/after").exists(), timeout=20)
        assert (root / "etc/app/before").read_bytes() == PLAINTEXT


async def test_a_rotation_that_fails_half_way_loses_nothing(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        data = tmp_path / "hub"
        hub = await start_hub(nursery, db_url, data)
        s = hub.services
        device_id, _ = await hub.provision("rotating")
        for i in range(3):
            r = await hub.call("POST", f"/v1/devices/{device_id}/secret-files",
                               json={"path": f"/etc/app/f{i}", "content_base64": b64(PLAINTEXT + bytes([i]))})
            assert r.status_code == 201
        before = await _ciphertexts(s)

        calls = 0

        async def crash_mid_way(convert):
            async def body(conn):
                nonlocal calls
                rows = await conn.fetch("SELECT id, ciphertext FROM secret_files ORDER BY path")
                await conn.execute("UPDATE secret_files SET ciphertext = $1 WHERE id = $2",
                                   convert(rows[0]["ciphertext"]), rows[0]["id"])
                calls += 1
                raise RuntimeError("power cut")
            return await s.db.run(body, transaction=True)

        with pytest.raises(RuntimeError, match="power cut"):
            await rotate(data, crash_mid_way)
        assert calls == 1 and (data / NEXT_FILE).exists()
        assert await _ciphertexts(s) == before, "the transaction rolled back"
        ring = SecretBox.from_data_dir(data)
        assert [ring.open(c) for c in before] == [PLAINTEXT + bytes([i]) for i in range(3)]
        # the next rotation completes and everything still opens
        assert await rotate(data, s.stores.secrets.reencrypt_all) == 3
        fresh = SecretBox.from_data_dir(data)
        assert [fresh.open(c) for c in await _ciphertexts(s)] == [PLAINTEXT + bytes([i]) for i in range(3)]
