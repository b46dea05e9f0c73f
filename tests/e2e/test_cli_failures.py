"""``fleethub`` meets an ordinary failure as an operator would cause it: one line that says what to do,
no traceback, a non-zero exit; and nothing created where nothing was."""

from __future__ import annotations

import socket
import subprocess
import uuid

import httpx

from tests.e2e.clitools import (
    clean_env,
    fleethub_exe,
    free_port,
    postgres_of,
    wait_until,
)


def fails(args: list[str], *, env: dict[str, str] | None = None, status: int = 1) -> list[str]:
    """Run ``fleethub args``; it must exit with ``status`` and no traceback. Its stderr's lines."""
    done = subprocess.run([fleethub_exe(), *args], check=False, capture_output=True, text=True, timeout=90,
                          env={**clean_env(), **(env or {})}, stdin=subprocess.DEVNULL)
    assert done.returncode == status, f"fleethub {' '.join(args)} -> {done.returncode}\n{done.stderr[-4000:]}"
    assert "Traceback" not in done.stderr + done.stdout, done.stderr[-4000:]
    return done.stderr.splitlines()


def test_demo_on_a_busy_port_says_so_in_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        lines = fails(["demo", "--data-dir", str(tmp_path / "demo"), "--port", str(port)])
    assert lines == [(f"fleethub demo: cannot listen at --host 127.0.0.1 --port {port}: another process listens "
                     f"there")]
    assert not postgres_of(tmp_path), "the port is checked before PostgreSQL starts"


def test_serve_on_an_address_not_of_this_machine(tmp_path):
    lines = fails(["serve", "--data-dir", str(tmp_path / "hub"), "--host", "192.0.2.1", "--port", "8080"])
    assert lines == [("fleethub serve: cannot listen at --host 192.0.2.1 --port 8080: not an address of this "
                     "machine")]


def test_serve_on_a_host_name_that_does_not_resolve(tmp_path):
    lines = fails(["serve", "--data-dir", str(tmp_path / "hub"), "--host", "hub.invalid"])
    assert len(lines) == 1 and lines[0].startswith("fleethub serve: --host hub.invalid: "), lines


def test_serve_with_a_missing_certificate(tmp_path):
    lines = fails(["serve", "--data-dir", str(tmp_path / "hub"), "--certfile", str(tmp_path / "hub.crt"),
                   "--keyfile", str(tmp_path / "hub.key")])
    assert lines == [f"fleethub serve: --certfile {tmp_path / 'hub.crt'}: no such file"]


def test_admin_on_a_typo_data_dir_creates_nothing(tmp_path):
    typo = tmp_path / "typo"
    lines = fails(["admin", "--data-dir", str(typo), "create-org", "Acme"])
    assert lines == [(f"fleethub admin: no hub's data in {typo} (fleethub serve creates it; or set "
                     f"FLEETHUB_DATABASE_URL)")]
    assert not typo.exists() and not postgres_of(tmp_path)


def test_admin_names_what_it_did_not_find(tmp_path, db_url):
    env = {"FLEETHUB_DATABASE_URL": db_url}
    keys = str(tmp_path / "keys")
    missing = uuid.uuid4()
    assert fails(["admin", "--data-dir", keys, "create-user", "ops@acme.test", "--org", str(missing)],
                 env=env) == [f"fleethub admin: no organisation {missing}"]
    assert fails(["admin", "--data-dir", keys, "create-pat", "nobody@acme.test"],
                 env=env) == ["fleethub admin: no user nobody@acme.test"]
    assert fails(["admin", "--data-dir", keys, "tunnel-entitle", str(missing), "--enabled"],
                 env=env) == [f"fleethub admin: no organisation {missing}"]
    # a typo'd id is a usage error: argparse's usage lines, then the one that says what is wrong
    lines = fails(["admin", "--data-dir", keys, "create-user", "ops@acme.test", "--org", "acme"], env=env, status=2)
    assert lines[-1] == "fleethub admin create-user: error: argument --org: not an organisation id (a UUID): 'acme'"


def test_admin_with_an_unreachable_database(tmp_path):
    env = {"FLEETHUB_DATABASE_URL": f"postgresql://fleethub:x@127.0.0.1:{free_port()}/fleethub"}
    lines = fails(["admin", "--data-dir", str(tmp_path / "keys"), "create-org", "Acme"], env=env)
    assert len(lines) == 1 and lines[0].startswith("fleethub admin: the database is not reachable"), lines


def test_a_second_hub_on_a_data_dir_in_use_refuses_to_start(tmp_path, procs):
    data = tmp_path / "hub"
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    first = procs("serve", ["serve", "--port", str(port), "--data-dir", str(data)])
    wait_until(lambda: httpx.get(base_url + "/readyz", timeout=2).status_code == 200, timeout=40,
               what="the first hub to be ready", proc=first)

    in_use = (f"{data} is in use by another fleethub process (pid {first.pid}): stop it first, or give this one "
              f"its own --data-dir; fleethub admin works beside it")
    # on another port it would have served the first one's database beside it; on the same port the
    # data dir is still what it says
    assert fails(["serve", "--port", str(free_port()), "--data-dir", str(data)]) == [f"fleethub serve: {in_use}"]
    assert fails(["serve", "--port", str(port), "--data-dir", str(data)]) == [f"fleethub serve: {in_use}"]
    assert fails(["demo", "--port", str(free_port()), "--data-dir", str(data)]) == [f"fleethub demo: {in_use}"]
    assert len(postgres_of(data)) == 1
    assert httpx.get(base_url + "/readyz", timeout=2).status_code == 200
    assert first.interrupt(timeout=30) == 0, first.log_tail()


def test_sim_without_a_hub(tmp_path):
    lines = fails(["sim", "--hub", f"http://127.0.0.1:{free_port()}", "--devices", "1", "--data-dir",
                   str(tmp_path / "sim")])
    assert lines == [(f"fleethub sim: {tmp_path / 'sim' / 'sim.json'} has 0 devices, 1 wanted; pass a personal "
                     f"access token (pat_id, pat_secret) to provision the rest")]


def test_device_test_on_a_busy_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        lines = fails(["device-test", "--listen", f"127.0.0.1:{port}", "--wait", "1"])
    assert lines == [(f"fleethub device-test: cannot listen at --listen 127.0.0.1:{port}: another process listens "
                     f"there")]


def test_a_mistyped_hub_url_is_a_usage_error(tmp_path):
    for command in (["agent", "--token", "t"], ["sim"]):
        lines = fails([*command, "--hub", "hub.example:8080", "--data-dir", str(tmp_path / "device")], status=2)
        assert lines[-1] == (f"fleethub {command[0]}: error: argument --hub: hub URL must be http(s)://host[:port], "
                             f"got 'hub.example:8080'")
    assert not (tmp_path / "device").exists()
